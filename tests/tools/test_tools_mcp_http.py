"""The MCP server over streamable HTTP (`sandbox-kernel mcp --transport streamable-http`),
driven by the SDK's HTTP client: state across calls, images, the fixed session,
and per-request sessions behind a trusted gateway (`--identity-headers`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from kernel_helpers import free_port, tcp_ready, wait_until
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.asyncio


class HttpServer:
    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandbox_kernel",
                "mcp",
                "--transport",
                "streamable-http",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--user-id",
                "agent",
                "--session-id",
                "web",
                "--backend",
                "bwrap",
                *extra,
            ],
            env={**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: tcp_ready(self.port), "the MCP server", self.proc, timeout=60)
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
