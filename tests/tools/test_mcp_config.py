"""The MCP server's traitlets configuration: flags, --MCPServerApp.x=, sandbox_kernel_config.py.

Most tests build the app without serving (``app.initialize(argv); app.tools_config()``);
a few run ``python -m sandbox_kernel mcp`` as a subprocess, one through the real
MCP SDK client over stdio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jupyter_core.paths import jupyter_config_path
from kernel_helpers import require_bwrap
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from sandbox_kernel.app import CONFIG_FILE
from sandbox_kernel.docker import ContainerConfig
from sandbox_kernel.sandbox import ResourceLimits
from sandbox_kernel.tools import ToolsConfig
from sandbox_kernel.tools.mcp_app import ConfigError, MCPServerApp, main

ENV_VARS = (
    "SANDBOX_KERNEL_USER_ID",
    "SANDBOX_KERNEL_SESSION_ID",
    "SANDBOX_KERNEL_DATA_DIR",
    "SANDBOX_DOCKER_IMAGE",
    "JUPYTER_CONFIG_PATH",
    "JUPYTER_NO_CONFIG",
    "JUPYTER_PREFER_ENV_PATH",
)


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Jupyter config dir of our own (no ~/.jupyter leaking in), no env defaults."""
    path = tmp_path / "jupyter-config"
    path.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(path))
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return path


def app_for(argv: list[str]) -> MCPServerApp:
    app = MCPServerApp()
    app.initialize(argv)
    return app


def write_config(config_dir: Path, text: str) -> Path:
    path = config_dir / f"{CONFIG_FILE}.py"
    path.write_text(text)
    return path


def run_cli(args: list[str], config_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_kernel", "mcp", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir), **env},
    )


# ----------------------------------------------------------------- defaults and flags


def test_jupyter_config_path_honours_the_env(config_dir: Path) -> None:
    assert str(config_dir) in jupyter_config_path()  # (a venv's etc/jupyter may come first)


def test_defaults_are_tools_config_defaults() -> None:
    app = app_for([])
    assert app.loaded_config_files == []
    assert app.tools_config() == ToolsConfig()  # every overlapping field, limits included
    assert (app.transport, app.host, app.port, app.path) == ("stdio", "127.0.0.1", 8000, "/mcp")
    assert (app.user_id, app.session_id, app.identity_headers, app.docker_image) == ("", "", False, "")
    limits = ToolsConfig().limits
    assert (app.memory_limit, app.max_processes, app.max_file_size, app.max_open_files) == (
        limits.address_space,
        limits.processes,
        limits.file_size,
        limits.open_files,
    )


@pytest.mark.parametrize(
    "argv, field, expected",
    [
        (["--backend", "subprocess"], "backend", "subprocess"),
        (["--backend=docker"], "backend", "docker"),
        (["--shell-backend", "docker", "--MCPServerApp.network=none"], "shell_backend", "docker"),
        (["--idle-timeout", "12.5"], "idle_timeout", 12.5),
        (["--docker-persistent"], "docker_persistent", True),
        (["--MCPServerApp.network=host"], "network", "host"),
        (["--MCPServerApp.trust_outputs=True"], "trust_outputs", True),
        (["--MCPServerApp.max_output_bytes=1000"], "max_output_bytes", 1000),
        (["--MCPServerApp.max_cells=7"], "max_cells", 7),
        (["--MCPServerApp.docker_persistent=True"], "docker_persistent", True),
    ],
)
def test_flags_map_to_tools_config(argv: list[str], field: str, expected: Any) -> None:
    cfg = app_for(argv).tools_config()
    assert getattr(cfg, field) == expected
    assert getattr(ToolsConfig(), field) != expected  # so the flag really changed something


def test_data_dir_and_docker_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = app_for(["--data-dir", "rel/data", "--docker-image", "example/shell:1"]).tools_config()
    assert cfg.data_dir == tmp_path / "rel" / "data" and cfg.data_dir.is_absolute()
    assert isinstance(cfg.docker_config, ContainerConfig) and cfg.docker_config.image == "example/shell:1"
    assert cfg.root() == tmp_path / "rel" / "data"
    assert app_for([]).tools_config().docker_config is None


def test_server_options() -> None:
    app = app_for(
        [
            "--transport",
            "streamable-http",
            "--host",
            "0.0.0.0",
            "--port",
            "9123",
            "--path",
            "/tools",
            "--user-id",
            "alice",
            "--session-id",
            "s-1",
            "--identity-headers",
            "--log-level",
            "info",
        ]
    )
    assert (app.transport, app.host, app.port, app.path) == ("streamable-http", "0.0.0.0", 9123, "/tools")
    assert (app.user_id, app.session_id, app.identity_headers) == ("alice", "s-1", True)
    assert app.log_level == 20
    assert app_for(["--log-level", "WARNING"]).log_level == 30  # the former CLI's default spelling
    assert app_for(["--log-level=DEBUG"]).log_level == 10


def test_resource_limits_and_dicts(tmp_path: Path) -> None:
    data = tmp_path / "sales.csv"
    data.write_text("a,b\n")
    cfg = app_for(
        [
            "--MCPServerApp.memory_limit=0",
            "--MCPServerApp.max_processes=64",
            "--MCPServerApp.max_file_size=1048576",
            "--MCPServerApp.max_open_files=256",
            "--MCPServerApp.docker_read_only_mounts",
            "/srv/skills=/skills",
            "--MCPServerApp.private_datasets",
            f"sales={data}",
            "--MCPServerApp.private_datasets",
            "hr=" + json.dumps({"source": str(tmp_path), "sensitivity": "secret"}),
        ]
    ).tools_config()
    assert cfg.limits == ResourceLimits(address_space=None, processes=64, file_size=1 << 20, open_files=256)
    assert cfg.docker_read_only_mounts == {"/srv/skills": "/skills"}
    assert cfg.private_datasets == {
        "sales": {"source": str(data), "sensitivity": "CONFIDENTIAL"},
        "hr": {"source": str(tmp_path), "sensitivity": "SECRET"},
    }


# ----------------------------------------------------------------- config file


def test_config_file_and_command_line_priority(config_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "payroll.csv"
    data.write_text("x\n")
    path = write_config(
        config_dir,
        f"""
c.MCPServerApp.backend = "subprocess"
c.MCPServerApp.docker_persistent = True
c.MCPServerApp.private_datasets = {{"payroll": {{"source": {str(data)!r}, "sensitivity": "secret"}}}}
c.MCPServerApp.session_id = "from-file"
c.MCPServerApp.port = 9001
c.MCPServerApp.network = "host"
c.SandboxKernel.backend = "docker"   # the kernel's part of the same file
""",
    )
    app = app_for([])
    assert app.loaded_config_files == [str(path)]
    cfg = app.tools_config()
    assert (cfg.backend, cfg.docker_persistent, cfg.network) == ("subprocess", True, "host")
    assert cfg.private_datasets == {"payroll": {"source": str(data), "sensitivity": "SECRET"}}
    assert (app.session_id, app.port) == ("from-file", 9001)

    app = app_for(
        ["--backend", "bwrap", "--no-docker-persistent", "--session-id", "from-cli", "--MCPServerApp.network=user"]
    )
    cfg = app.tools_config()
    assert (cfg.backend, cfg.docker_persistent, cfg.network) == ("bwrap", False, "user")
    assert (app.session_id, app.port) == ("from-cli", 9001)  # untouched options still come from the file
    assert cfg.private_datasets["payroll"]["sensitivity"] == "SECRET"


def test_json_config_file(config_dir: Path) -> None:
    (config_dir / f"{CONFIG_FILE}.json").write_text(
        json.dumps({"MCPServerApp": {"shell_backend": "docker", "network": "none", "max_cells": 9}})
    )
    cfg = app_for([]).tools_config()
    assert (cfg.shell_backend, cfg.max_cells) == ("docker", 9)


# ----------------------------------------------------------------- bad values


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(self: MCPServerApp) -> None:
        raise AssertionError("the server must not start on a bad configuration")

    monkeypatch.setattr(MCPServerApp, "start", start)


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--port", "-1"], ["--port", "between 1 and 65535"]),
        (["--port", "abc"], ["--port", "expected an int"]),
        (["--session-id", "../x"], ["--session-id", "session_id '../x' is invalid"]),
        (["--user-id", "a b"], ["--user-id", "user_id 'a b' is invalid"]),
        (["--backend", "nope"], ["--backend", "'nope'"]),
        (["--shell-backend", "bwrap"], ["--shell-backend"]),
        (["--transport", "sse"], ["--transport"]),
        (["--idle-timeout", "-5"], ["--idle-timeout", ">= 0"]),
        (["--path", "mcp"], ["--path", "must start with '/'"]),
        (["--docker-image", "has space"], ["--docker-image"]),
        (["--MCPServerApp.network=nope"], ["MCPServerApp.network"]),
        (["--MCPServerApp.memory_limit=-1"], ["MCPServerApp.memory_limit", ">= 0"]),
        (["--MCPServerApp.max_cells=0"], ["MCPServerApp.max_cells"]),
        (["--MCPServerApp.private_datasets", "x=/no/such/file"], ["MCPServerApp.private_datasets", "does not exist"]),
        (
            ["--MCPServerApp.private_datasets", 'x={"source": "/", "sensitivity": "public"}'],
            ["MCPServerApp.private_datasets", "PUBLIC"],
        ),
        (
            ["--MCPServerApp.docker_read_only_mounts", "/var/run=/sock"],
            ["MCPServerApp.docker_read_only_mounts", "/var/run"],
        ),
        (["stray"], ["unexpected argument", "stray"]),
    ],
)
def test_bad_values_exit_2_naming_the_option(
    argv: list[str], needles: list[str], no_serving: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sandbox-kernel mcp: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err
    with pytest.raises(ConfigError):  # the library form raises instead
        app_for(argv)


def test_docker_shell_with_the_proxied_default_is_refused_before_serving() -> None:
    """The Docker shell gets no egress proxy: ``--shell-backend docker`` alone
    (network stays "proxied") is a ConfigError naming both settings (``main``
    exits 2 with it), not a shell on Docker's bridge."""
    with pytest.raises(ConfigError, match=r"shell_backend='docker' cannot honour network='proxied'"):
        app_for(["--shell-backend", "docker"]).make_server()


def test_bad_values_in_the_config_file(config_dir: Path, no_serving: None, capsys: pytest.CaptureFixture[str]) -> None:
    write_config(config_dir, 'c.MCPServerApp.private_datasets = {"pay": {"sensitivity": "SECRET"}}\n')
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "MCPServerApp.private_datasets" in err and "'source'" in err and "Traceback" not in err
    write_config(config_dir, "c.MCPServerApp.port = 'x' +\n")  # a broken file is an error, not a warning
    assert main([]) == 2
    err = capsys.readouterr().err
    assert CONFIG_FILE in err and "SyntaxError" in err


def test_cli_errors_in_a_subprocess(config_dir: Path) -> None:
    for args, needle in (
        (["--session-id", "../x"], "--session-id (MCPServerApp.session_id): session_id '../x' is invalid"),
        (["--backend", "nope"], "--backend (MCPServerApp.backend)"),
        (["--idle-timeout", "-5"], "--idle-timeout (MCPServerApp.idle_timeout)"),
    ):
        proc = run_cli(args, config_dir)
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    write_config(config_dir, "c.MCPServerApp.port = -1\n")
    proc = run_cli([], config_dir)
    assert proc.returncode == 2 and "MCPServerApp.port" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_help_lists_the_options(config_dir: Path) -> None:
    proc = run_cli(["--help"], config_dir)
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--transport",
        "--host",
        "--port",
        "--path",
        "--user-id",
        "--session-id",
        "--identity-headers",
        "--backend",
        "--shell-backend",
        "--docker-image",
        "--docker-persistent",
        "--idle-timeout",
        "--data-dir",
        "--log-level",
        CONFIG_FILE,
    ):
        assert flag in proc.stdout, flag
    proc = run_cli(["--help-all"], config_dir)
    assert proc.returncode == 0
    for option in (
        "network",
        "private_datasets",
        "docker_read_only_mounts",
        "memory_limit",
        "max_processes",
        "max_file_size",
        "max_open_files",
        "trust_outputs",
        "max_output_bytes",
        "max_cells",
    ):
        assert f"--MCPServerApp.{option}=" in proc.stdout, option


# ----------------------------------------------------------------- end to end


@pytest.mark.asyncio
async def test_config_file_drives_a_real_stdio_server(config_dir: Path, tmp_path: Path) -> None:
    require_bwrap()
    data_dir, env_data_dir = tmp_path / "from-config", tmp_path / "from-env"
    env_data_dir.mkdir()
    write_config(
        config_dir,
        f"""
c.MCPServerApp.user_id = "cfguser"
c.MCPServerApp.session_id = "cfgsession"
c.MCPServerApp.data_dir = {str(data_dir)!r}
c.MCPServerApp.backend = "bwrap"
""",
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandbox_kernel", "mcp"],
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir), "SANDBOX_KERNEL_DATA_DIR": str(env_data_dir)},
    )
    async with Client(params) as client:
        r = await client.call_tool("repl_execute_cell", {"code": "answer = 6 * 7\nanswer"})
        assert not r.is_error and "\n".join(b.text for b in r.content if b.type == "text").endswith("42")
    notebook = json.loads((data_dir / "sessions/cfguser/cfgsession/notebook.json").read_text())
    assert (notebook["user_id"], notebook["session_id"]) == ("cfguser", "cfgsession")
    assert [c["code"] for c in notebook["cells"]] == ["answer = 6 * 7\nanswer"]
    assert not (env_data_dir / "sessions").exists()  # the config file wins over $SANDBOX_KERNEL_DATA_DIR
