"""The MCP server over streamable HTTP (`sandbox-kernel mcp --transport streamable-http`),
driven by the SDK's HTTP client: state across calls, images, the fixed session,
and per-request sessions behind a trusted gateway (`--identity-headers`); and
attacked like a web page in the user's browser (DNS rebinding, cross-origin
requests) and like another local process (no or a wrong bearer token).

The servers listen on loopback only: 127.0.0.2 stands in for a bind address
that is not one of the literal loopback hosts (0.0.0.0 in docs/deploy/container.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from kernel_helpers import free_port, wait_until
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.asyncio


def tcp_ready(host: str, port: int) -> bool:
    """Something accepts connections on ``host``:``port`` (a loopback address)."""
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def mcp_http_argv(host: str, port: int, *extra: str) -> list[str]:
    """`sandbox-kernel mcp` over streamable HTTP on ``host:port``, bwrap backend."""
    return [
        sys.executable,
        "-m",
        "sandbox_kernel",
        "mcp",
        "--transport",
        "streamable-http",
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        "bwrap",
        *extra,
    ]


class HttpServer:
    def __init__(self, data_dir: Path, *extra: str, host: str = "127.0.0.1", env: dict[str, str] | None = None) -> None:
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}/mcp"
        self.proc = subprocess.Popen(
            mcp_http_argv(host, self.port, "--user-id", "agent", "--session-id", "web", *extra),
            env={**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data_dir), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: tcp_ready(host, self.port), "the MCP server", self.proc, timeout=60)
        except AssertionError:
            self.stop()
            raise

    def client(self, headers: dict[str, str] | None = None) -> Client:
        if headers is None:
            return Client(self.url)
        return Client(streamable_http_client(self.url, http_client=httpx2.AsyncClient(headers=headers, timeout=120)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def http_server(data_dir: Path) -> Iterator[HttpServer]:
    server = HttpServer(data_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gateway_server(data_dir: Path) -> Iterator[HttpServer]:
    server = HttpServer(data_dir, "--identity-headers")
    try:
        yield server
    finally:
        server.stop()


def text(result) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


async def test_state_images_and_shell_over_http(http_server: HttpServer, data_dir: Path) -> None:
    async with http_server.client() as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"repl_execute_cell", "sandbox_execute", "repl_export_ipynb"} <= names
        r = await client.call_tool("repl_execute_cell", {"code": "x = 2"})
        assert not r.is_error, text(r)
        r = await client.call_tool("repl_execute_cell", {"code": "x * 21"})
        assert "42" in text(r)
        r = await client.call_tool(
            "repl_execute_cell", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()"}
        )
        images = [b for b in r.content if b.type == "image"]
        assert images and images[0].mime_type == "image/png" and "iVBOR" not in text(r)
        r = await client.call_tool("sandbox_execute", {"command": "echo from-shell > f.txt && cat f.txt"})
        assert text(r) == "Exit code: 0\nfrom-shell"
    assert (data_dir / "workspaces/agent/web/f.txt").read_text() == "from-shell\n"
    assert (data_dir / "sessions/agent/web/notebook.json").exists()


async def test_headers_cannot_pick_a_session_without_identity_headers(http_server: HttpServer, data_dir: Path) -> None:
    """A client (or a model steering it) cannot hop to a fresh, public session."""
    async with http_server.client({"X-Sandbox-User-Id": "mallory", "X-Sandbox-Session-Id": "fresh"}) as client:
        r = await client.call_tool("repl_execute_cell", {"code": "hopped = True"})
        assert not r.is_error, text(r)
    assert (data_dir / "sessions/agent/web/notebook.json").exists()
    assert not (data_dir / "sessions/mallory").exists()


async def test_identity_headers_give_each_caller_its_own_session(gateway_server: HttpServer, data_dir: Path) -> None:
    alice = {"X-Sandbox-User-Id": "alice", "X-Sandbox-Session-Id": "a1"}
    bob = {"X-Sandbox-User-Id": "bob", "X-Sandbox-Session-Id": "b1"}
    async with gateway_server.client(alice) as a, gateway_server.client(bob) as b:
        assert not (await a.call_tool("repl_execute_cell", {"code": "secret = 'alice-only'"})).is_error
        assert not (await a.call_tool("sandbox_execute", {"command": "echo private > alice.txt"})).is_error
        r = await b.call_tool("repl_execute_cell", {"code": "secret"})
        assert "NameError" in text(r)
        r = await b.call_tool("sandbox_execute", {"command": "cat alice.txt"})
        assert text(r).startswith("Exit code: 1") and "alice.txt: No such file" in text(r), text(r)
        r = await a.call_tool("repl_execute_cell", {"code": "secret"})
        assert "alice-only" in text(r)
    assert (data_dir / "workspaces/alice/a1/alice.txt").exists()
    assert not (data_dir / "workspaces/bob/b1/alice.txt").exists()
    assert not (data_dir / "sessions/agent").exists()  # the default session was never used
    async with gateway_server.client({"X-Sandbox-User-Id": "alice", "X-Sandbox-Session-Id": "../a1"}) as bad:
        r = await bad.call_tool("repl_execute_cell", {"code": "1"})
        assert r.is_error and "session_id" in text(r) and "invalid" in text(r), text(r)
        assert not text(r).startswith("[FATAL]")


# ------------------------------------------------------------ attacks over HTTP

TOKEN = "s3cret-token-0123456789abcdef"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "evil", "version": "1"}},
}
WRITE_FILE = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "sandbox_execute", "arguments": {"command": "echo pwned > /workspace/owned.txt"}},
}


def attack(url: str, headers: dict[str, str]) -> list[int]:
    """What a page or process does to run a command: initialize, then call
    sandbox_execute (even without the session the first step should have given).
    Returns the status codes it got."""
    hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    statuses = []
    with httpx2.Client(timeout=120) as http:
        r = http.post(url, headers=hdr, json=INITIALIZE)
        statuses.append(r.status_code)
        if r.headers.get("mcp-session-id"):
            hdr["Mcp-Session-Id"] = r.headers["mcp-session-id"]
        hdr["MCP-Protocol-Version"] = "2025-06-18"
        statuses.append(
            http.post(url, headers=hdr, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code
        )
        r = http.post(url, headers=hdr, json=WRITE_FILE)
        statuses.append(r.status_code)
    return statuses


def nothing_ran(data_dir: Path) -> bool:
    return not (data_dir / "workspaces/agent/web/owned.txt").exists() and not (data_dir / "sessions/agent").exists()


@pytest.fixture
def other_loopback_server(data_dir: Path) -> Iterator[HttpServer]:
    """Bound to 127.0.0.2: not a literal loopback host, for which the SDK guarded nothing."""
    server = HttpServer(data_dir, host="127.0.0.2")
    try:
        yield server
    finally:
        server.stop()


async def test_a_dns_rebinding_page_runs_nothing(other_loopback_server: HttpServer, data_dir: Path) -> None:
    """A page of evil.example whose name now resolves to the server's address: the
    browser sends the page's own name as Host (and Origin). Refused (421), nothing runs."""
    port = other_loopback_server.port
    statuses = attack(
        other_loopback_server.url, {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    )
    assert nothing_ran(data_dir), statuses
    assert statuses == [421, 421, 421], statuses
    # the same without Origin (a non-browser client that rebinds): the Host alone is refused
    assert attack(other_loopback_server.url, {"Host": f"evil.example:{port}"}) == [421, 421, 421]
    with httpx2.Client(timeout=30) as http:
        r = http.post(other_loopback_server.url, headers={"Host": "evil.example"}, json=INITIALIZE)
    assert r.status_code == 421 and "--allowed-host" in r.text, r.text
    assert nothing_ran(data_dir)
    # the server's own address still works
    async with other_loopback_server.client() as client:
        assert "sandbox_execute" in {t.name for t in (await client.list_tools()).tools}


async def test_a_page_of_another_origin_runs_nothing(other_loopback_server: HttpServer, data_dir: Path) -> None:
    """A page of another site (or of another local web app, another port) that
    posts to the server's own address: the Host is right, the Origin is not (403)."""
    port = other_loopback_server.port
    for origin in ("http://evil.example", f"http://localhost:{port + 1}", "null"):
        statuses = attack(other_loopback_server.url, {"Origin": origin})
        assert statuses == [403, 403, 403], (origin, statuses)
    assert nothing_ran(data_dir)


@pytest.fixture
def token_server(data_dir: Path, tmp_path: Path) -> Iterator[HttpServer]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = HttpServer(data_dir, "--token-file", str(token_file), host="127.0.0.2")
    try:
        yield server
    finally:
        server.stop()


async def test_without_the_token_nothing_runs(token_server: HttpServer, data_dir: Path) -> None:
    """Another local process or user that reaches the port but lacks the token: 401."""
    for auth in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789abcdef"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": "Bearer"},
    ):
        statuses = attack(token_server.url, auth)
        assert statuses == [401, 401, 401], (auth, statuses)
    with httpx2.Client(timeout=30) as http:
        r = http.post(token_server.url, json=INITIALIZE)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and "--token-file" in r.text
    assert nothing_ran(data_dir)
    # the right token: the same request works
    async with token_server.client({"Authorization": f"Bearer {TOKEN}"}) as client:
        r = await client.call_tool("sandbox_execute", {"command": "echo with-token > ok.txt && cat ok.txt"})
        assert text(r) == "Exit code: 0\nwith-token", text(r)
    assert (data_dir / "workspaces/agent/web/ok.txt").read_text() == "with-token\n"


async def test_a_non_loopback_bind_without_a_token_does_not_start(tmp_path: Path) -> None:
    """192.0.2.1 (TEST-NET-1, on no interface here): the server must refuse before
    binding anything. The old server tried to serve it, unauthenticated."""
    env = {**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(tmp_path)}
    env.pop("SANDBOX_KERNEL_MCP_TOKEN", None)
    done = subprocess.run(mcp_http_argv("192.0.2.1", free_port()), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--token-file" in done.stderr and "not a loopback address" in done.stderr, done.stderr
    assert "--unsafe-no-token" in done.stderr


async def test_a_page_of_another_local_port_runs_nothing(http_server: HttpServer, data_dir: Path) -> None:
    """On 127.0.0.1 the SDK guarded itself, but let every http://localhost:* and
    http://127.0.0.1:* origin in: any local web app's page (another port) could
    drive the server. Only the server's own origin is allowed now."""
    port = http_server.port
    for origin in (f"http://localhost:{port + 1}", f"http://127.0.0.1:{port + 1}"):
        assert attack(http_server.url, {"Origin": origin}) == [403, 403, 403], origin
    assert nothing_ran(data_dir)
    statuses = attack(http_server.url, {"Origin": f"http://127.0.0.1:{port}"})  # its own origin
    assert statuses == [200, 202, 200], statuses
