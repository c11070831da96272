"""A real MCP client session over stdio against `python -I -m sandbox_kernel mcp`."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
import time
from pathlib import Path

import nbformat
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

pytestmark = pytest.mark.asyncio


def server(data_dir: Path, session: str = "mcp1") -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-I",
            "-m",
            "sandbox_kernel",
            "mcp",
            "--user-id",
            "agent",
            "--session-id",
            session,
            "--backend",
            "bwrap",
        ],
        env={**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
    )


def text(result) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


async def test_every_tool_over_stdio(data_dir: Path) -> None:
    async with Client(server(data_dir)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "repl_execute_cell",
            "repl_rerun_cell",
            "repl_show_notebook",
            "repl_show_cell",
            "repl_delete_cell",
            "repl_clear_notebook",
            "repl_export_ipynb",
            "sandbox_execute",
            "sandbox_network",
        }
        assert "ctx" not in tools["repl_execute_cell"].input_schema["properties"]
        r = await client.call_tool("repl_execute_cell", {"code": "x = 20\nx + 1"})
        assert not r.is_error and text(r).endswith("21")
        r = await client.call_tool("repl_execute_cell", {"code": "x * 2"})  # state across calls
        assert text(r).endswith("40")
        r = await client.call_tool(
            "repl_execute_cell", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3]); plt.show()"}
        )
        images = [b for b in r.content if b.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data)[:4] == b"\x89PNG" and "iVBOR" not in text(r)
        r = await client.call_tool("repl_rerun_cell", {"cell_number": 1})
        assert not r.is_error and "[4]" in text(r)
        r = await client.call_tool("repl_show_notebook", {})
        assert "3 cell(s)" in text(r)
        r = await client.call_tool("repl_show_cell", {"cell_number": 0, "full": True})
        assert "x = 20" in text(r)
        r = await client.call_tool("sandbox_execute", {"command": "echo from-shell > shell.txt; ls"})
        assert not r.is_error and text(r).startswith("Exit code: 0") and "shell.txt" in text(r)
        r = await client.call_tool("repl_execute_cell", {"code": "print(open('shell.txt').read())"})
        assert "from-shell" in text(r)
        r = await client.call_tool("repl_export_ipynb", {"path": "agent.ipynb"})
        assert not r.is_error and "/workspace/agent.ipynb" in text(r)
        nb = nbformat.read(data_dir / "workspaces/agent/mcp1/agent.ipynb", as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "sandbox-python" and len(nb.cells) == 4
        r = await client.call_tool("repl_delete_cell", {"cell_number": 3})
        assert not r.is_error and "3 cell(s) left" in text(r)
        r = await client.call_tool("repl_clear_notebook", {})
        assert not r.is_error and "3 cell(s) removed" in text(r)


async def test_bad_arguments_are_retryable_errors(data_dir: Path) -> None:
    async with Client(server(data_dir, "mcp2")) as client:
        await client.call_tool("repl_execute_cell", {"code": "1"})
        cases = [
            ("repl_rerun_cell", {"cell_number": 9}, "there is no cell 9"),
            ("repl_show_cell", {"cell_number": -2}, "there is no cell -2"),
            ("repl_delete_cell", {"cell_number": 4}, "there is no cell 4"),
            ("repl_export_ipynb", {"path": "../../../etc/x.ipynb"}, "climbs out of the workspace"),
            ("repl_export_ipynb", {"path": "/root/x.ipynb"}, "outside the workspace"),
            ("repl_execute_cell", {"code": "1", "timeout": 0}, "timeout must be between"),
            ("sandbox_execute", {"command": "  "}, "non-empty"),
            ("repl_execute_cell", {}, "code"),  # schema validation by the SDK
        ]
        for name, args, message in cases:
            r = await client.call_tool(name, args)
            assert r.is_error, (name, text(r))
            assert message in text(r) and not text(r).startswith("[FATAL]"), (name, text(r))


async def test_infrastructure_failure_is_fatal(data_dir: Path) -> None:
    path = data_dir / "sessions/agent/mcp3/notebook.json"
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    async with Client(server(data_dir, "mcp3")) as client:
        r = await client.call_tool("repl_execute_cell", {"code": "1"})
        assert r.is_error and text(r).startswith("[FATAL]") and "corrupt" in text(r)
    assert path.read_text() == "[]"


async def test_invalid_session_id_is_refused(data_dir: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-I", "-m", "sandbox_kernel", "mcp", "--session-id", "../x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
    )
    assert proc.returncode == 2 and "session_id '../x' is invalid" in proc.stderr


async def test_sigterm_closes_the_sessions_before_the_server_exits(data_dir: Path, tmp_path: Path) -> None:
    """A supervisor (or an MCP client whose server did not stop within two
    seconds of its input closing: the SDK's stdio client) sends SIGTERM. The
    sessions are closed as at end of input: checkpointed, the sandbox and its
    temporary folders gone. With the default action the server died at once
    and left them. A second SIGTERM while they close does not cut that short."""
    import psutil

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    params = server(data_dir, "mcp4")
    params.env = {**(params.env or {}), "TMPDIR": str(tmp)}

    def folders() -> list[str]:
        return [p.name for p in tmp.iterdir() if p.name.startswith("sandbox-kernel-")]

    async with Client(params) as client:
        r = await client.call_tool("repl_execute_cell", {"code": "kept = 41 + 1\nkept"})
        assert text(r).endswith("42"), text(r)
        (mcp,) = [p for p in psutil.Process().children() if "sandbox_kernel" in p.cmdline() and "mcp" in p.cmdline()]
        assert folders()  # the session's
        mcp.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        if mcp.is_running():
            mcp.send_signal(signal.SIGTERM)  # while it closes: said and ignored
        deadline = time.monotonic() + 60
        while folders() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert folders() == []
    deadline = time.monotonic() + 30
    while mcp.is_running() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not mcp.is_running()
    # the next server resumes the session from its checkpoint
    async with Client(server(data_dir, "mcp4")) as client:
        r = await client.call_tool("repl_execute_cell", {"code": "kept"})
        assert text(r).endswith("42"), text(r)
