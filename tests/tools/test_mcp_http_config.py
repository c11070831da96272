"""The HTTP guard's configuration (no server is started): which Host values are
allowed, where the bearer token comes from, that a loopback server without one
generates one, and that a server on a non-loopback address refuses to start
without a token unless told it is unsafe."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.tools.mcp_app import GENERATED, TOKEN_ENV, ConfigError, MCPServerApp, http_notice
from sandbox_kernel.tools.mcp_server import http_allowed_hosts, is_loopback_host, transport_security

TOKEN = "0123456789abcdef-token"


@pytest.fixture(autouse=True)
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ~/.jupyter config and no token from the environment leaking in; a
    runtime dir of the test's own."""
    path = tmp_path / "jupyter-config"
    path.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(path))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    for name in ("JUPYTER_CONFIG_PATH", TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)


def http_app(*argv: str) -> MCPServerApp:
    app = MCPServerApp()
    app.initialize(["--transport", "streamable-http", *argv])
    return app


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "mcp.example.org", "127.0.0.1.nip.io"])
def test_a_non_loopback_bind_needs_a_token(host: str) -> None:
    with pytest.raises(ConfigError) as err:
        http_app("--host", host).http_guard()
    message = str(err.value)
    assert "--token-file (MCPServerApp.token_file)" in message and "not a loopback address" in message
    assert "--unsafe-no-token" in message
    assert not is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_unsafe_no_token_is_an_explicit_opt_out(host: str) -> None:
    hosts, token, source = http_app("--host", host, "--unsafe-no-token").http_guard()
    assert token is None and source == "--unsafe-no-token (MCPServerApp.unsafe_no_token)" and "localhost:8000" in hosts
    notice = http_notice(f"http://{host}:8000/mcp", source, None, f"{host}:8000")
    assert "UNSAFE (--unsafe-no-token" in notice and "run code" in notice


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_a_loopback_bind_without_a_token_generates_one(host: str, tmp_path: Path) -> None:
    """Every local account reaches loopback: no token configured means a fresh one, not none."""
    first, second = http_app("--host", host).http_guard(), http_app("--host", host).http_guard()
    assert first.token_source == GENERATED and first.token is not None and len(first.token) >= 43
    assert second.token != first.token
    assert (tmp_path / "runtime").is_dir()  # checked (and made private) before any port is bound


def test_the_notice_names_the_file_not_the_token() -> None:
    notice = http_notice("http://127.0.0.1:8000/mcp", GENERATED, "/run/user/1/jupyter/x y.token", "127.0.0.1:8000")
    assert "/run/user/1/jupyter/x y.token" in notice and "$(cat '/run/user/1/jupyter/x y.token')" in notice
    assert '"headers": {"Authorization": "Bearer <the token in that file>"}' in notice


def test_the_container_command_of_the_docs(tmp_path: Path) -> None:
    """docs/deploy/container.md: 0.0.0.0 with a token file, published as localhost:9000."""
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    app = http_app(
        "--host", "0.0.0.0", "--port", "8000", "--token-file", str(token_file), "--allowed-host", "localhost:9000"
    )
    hosts, token, source = app.http_guard()
    assert token == TOKEN and source == "--token-file (MCPServerApp.token_file)"
    assert hosts == ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost:9000"]


def test_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert http_app("--token", TOKEN).http_guard()[1] == TOKEN
    monkeypatch.setenv(TOKEN_ENV, f"{TOKEN}-env\n")
    assert http_app().http_guard()[1] == f"{TOKEN}-env"
    assert http_app("--host", "0.0.0.0").http_guard()[1] == f"{TOKEN}-env"
    assert http_app("--token", TOKEN).http_guard()[1] == TOKEN  # the command line wins


def test_bad_tokens_are_refused_naming_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^--token \(MCPServerApp.token\): must be at least 16"):
        http_app("--token", "short")
    with pytest.raises(ConfigError, match=r"--token-file \(MCPServerApp.token_file\): cannot read"):
        http_app("--token-file", str(tmp_path / "missing")).http_guard()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"--token-file \(MCPServerApp.token_file\): the token must be"):
        http_app("--token-file", str(empty)).http_guard()
    with pytest.raises(ConfigError, match="give one of them, not both"):
        http_app("--token", TOKEN, "--token-file", str(empty)).http_guard()
    monkeypatch.setenv(TOKEN_ENV, "x")
    with pytest.raises(ConfigError, match=rf"\${TOKEN_ENV}: the token must be"):
        http_app().http_guard()


@pytest.mark.parametrize("bad", ["*", "http://localhost:8000", "localhost:8000/mcp", "a b", ""])
def test_bad_allowed_hosts_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--allowed-host \(MCPServerApp.allowed_hosts\): .* is not a Host"):
        http_app("--allowed-host", bad)


def test_allowed_hosts_and_origins() -> None:
    assert http_allowed_hosts("127.0.0.2", 8123) == ["127.0.0.1:8123", "localhost:8123", "[::1]:8123", "127.0.0.2:8123"]
    assert http_allowed_hosts("::", 8123) == ["127.0.0.1:8123", "localhost:8123", "[::1]:8123"]
    assert http_allowed_hosts("fd00::5", 80)[-1] == "[fd00::5]:80" and "localhost" in http_allowed_hosts("::1", 80)
    assert http_allowed_hosts("mcp.internal", 1, ["mcp.internal:*"])[-1] == "mcp.internal:*"
    security = transport_security(["localhost:8000"])
    assert security.enable_dns_rebinding_protection
    assert security.allowed_origins == ["http://localhost:8000", "https://localhost:8000"]
    app = http_app("--allowed-host", "a.example:1", "--allowed-host", "b.example:2")
    assert app.allowed_hosts == ["a.example:1", "b.example:2"]
