"""The seeds' dual MCP routing (``MCPServerPrivateData``) with two real MCP servers.

The data-tools server (tests/tools/data_tools_server.py) runs twice: as is on
the host, and under bubblewrap without network. A PydanticAI agent driven by a
FunctionModel (no LLM service) calls its tools through
``private_data_mcp_stdio`` / ``private_data_mcp_http``; an HTTP "sink" that
this test starts on 127.0.0.1 stands for the outside world a private session
must not reach.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from kernel_helpers import IN_CI, free_port, require_bwrap, tcp_ready, wait_until

pytest.importorskip("pydantic_ai")
try:  # needs pydantic-ai-slim[mcp], i.e. fastmcp-slim[client]
    importlib.import_module("pydantic_ai.mcp")
except ImportError as exc:  # pragma: no cover - depends on the install
    if IN_CI:
        raise
    pytest.skip(f"pydantic-ai's MCP client is not installed: {exc}", allow_module_level=True)

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandbox_kernel.privacy import PrivacyStore, PrivateData, Sensitivity
from sandbox_kernel.sandbox.base import BindMount, SandboxSpec
from sandbox_kernel.sandbox.bwrap import BubblewrapSandbox
from sandbox_kernel.tools.pydantic_ai import (
    PrivateDataMCPToolset,
    private_data_mcp_http,
    private_data_mcp_stdio,
)

pytestmark = pytest.mark.asyncio

TOOLS_DIR = Path(__file__).resolve().parent
SERVER = TOOLS_DIR / "data_tools_server.py"


def host_network(listed: str) -> bool:
    """``listed`` (an ``interfaces()`` answer) is the host's network namespace: lo
    and some of the host's other interfaces (containers add and remove veths)."""
    names = set(listed.split(","))
    host = {name for _, name in socket.if_nameindex()} - {"lo"}
    return "lo" in names and bool(names & host)


# -- the outside world: an HTTP server on the host's loopback ---------------------------


@dataclass
class Sink:
    port: int
    body: str
    hits: list[str] = field(default_factory=list)


@pytest.fixture
def sink() -> Iterator[Sink]:
    token = os.urandom(8).hex()
    state = Sink(port=0, body=f"sink-received-{token}")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits.append(self.path)
            data = state.body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def store(tmp_path: Path) -> PrivacyStore:
    require_bwrap()
    return PrivacyStore(tmp_path / "privacy")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    (path / "salaries.csv").write_text("name,salary\nalice,100\n")
    return path


# -- helpers ------------------------------------------------------------------------------


def stdio_toolset(store: PrivacyStore, data: Path, user: str = "alice", session: str = "s1") -> PrivateDataMCPToolset:
    """The one-line set-up: the same server, normal on the host and isolated in bwrap."""
    return private_data_mcp_stdio(
        sys.executable,
        [str(SERVER)],
        env={"DATA_TOOLS_LABEL": "normal", "DATA_TOOLS_DIR": str(data)},
        isolated_env={"DATA_TOOLS_LABEL": "isolated"},
        bind_mounts=[BindMount(TOOLS_DIR, str(TOOLS_DIR), readonly=True), BindMount(data, str(data), readonly=True)],
        user_id=user,
        session_id=session,
        store=store,
    )


def scripted(calls: list[tuple[str, dict]], between=None) -> FunctionModel:
    """A model that makes the given tool calls one per step, then answers 'done'.
    ``between(i)`` runs before step ``i`` is answered (after step i-1's result)."""
    step = {"i": 0}

    def model(messages, info: AgentInfo) -> ModelResponse:
        i = step["i"]
        step["i"] += 1
        if between is not None:
            between(i)
        if i < len(calls):
            name, args = calls[i]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{i}")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


async def run(toolset: PrivateDataMCPToolset, calls: list[tuple[str, dict]], between=None) -> list:
    """Run an agent over ``toolset``; the tool returns / retry prompts, in call order."""
    result = await Agent(scripted(calls, between), toolsets=[toolset]).run("go")
    assert result.output == "done"
    return [
        p
        for m in result.all_messages()
        for p in getattr(m, "parts", [])
        if isinstance(p, (ToolReturnPart, RetryPromptPart))
    ]


def retried(part) -> bool:
    """A tool error the model is asked to correct (pydantic-ai marks the part as retried)."""
    return isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"


def who(part) -> dict:
    assert isinstance(part, ToolReturnPart) and not retried(part), part
    return json.loads(part.content)


def server_processes() -> list[psutil.Process]:
    """This test process's descendants running the data-tools server (bwrap included)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(str(SERVER) in arg for arg in proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def assert_all_stopped(timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while server_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_processes() == []


CALLS = [("whoami", {}), ("interfaces", {}), ("fetch", {"port": 0}), ("read_data", {"name": "salaries.csv"})]


def calls_for(sink: Sink) -> list[tuple[str, dict]]:
    return [(n, {"port": sink.port} if n == "fetch" else a) for n, a in CALLS]


# -- stdio: private_data_mcp_stdio --------------------------------------------------------


async def test_stdio_routing_follows_the_ratchet(store: PrivacyStore, data: Path, sink: Sink) -> None:
    routed = stdio_toolset(store, data)
    async with routed:
        # two real servers: one on the host, one under bwrap
        procs = server_processes()
        assert any(p.name() == "bwrap" for p in procs) and any(p.name() != "bwrap" for p in procs)

        # public session: the normal instance, with the host's network
        normal = await run(routed, calls_for(sink))
        me = who(normal[0])
        assert me["label"] == "normal" and me["hostname"] == socket.gethostname()
        assert host_network(normal[1].content) and normal[1].content != "lo"
        assert normal[2].content == sink.body and sink.hits == ["/exfiltrate"]
        assert normal[3].content == "name,salary\nalice,100\n"
        assert not routed.private

        # the session turns private through the project's store
        PrivateData("alice", "s1", store).mark_private(Sensitivity.CONFIDENTIAL, source="api", reason="test")

        isolated = await run(routed, calls_for(sink))
        other = who(isolated[0])
        assert other["label"] == "isolated" and other["hostname"] == "sandbox"
        assert isolated[1].content == "lo"
        # the attack: send data out to a server on the host's loopback
        assert isolated[2].content.startswith("connection failed") and sink.body not in isolated[2].content
        assert sink.hits == ["/exfiltrate"]  # nothing more reached the sink
        assert isolated[3].content == "name,salary\nalice,100\n"  # the data it may see is mounted
        assert routed.private

        # the normal instance is still up (both stay connected) but gets no calls
        assert routed.wrapped.is_running and routed.isolated.is_running
    assert_all_stopped()


async def test_switch_between_two_steps_of_one_run(store: PrivacyStore, data: Path) -> None:
    """The ratchet rises after the tools of a step were listed by the normal
    instance: the call still goes to the isolated one."""
    routed = stdio_toolset(store, data, session="mid")

    def between(i: int) -> None:
        if i == 1:
            PrivateData("alice", "mid", store).add_private_dataset("salaries", Sensitivity.SECRET, source="tool")

    async with routed:
        parts = await run(routed, [("whoami", {}), ("whoami", {}), ("interfaces", {})], between=between)
    assert [who(p)["label"] for p in parts[:2]] == ["normal", "isolated"]
    assert parts[2].content == "lo"
    assert_all_stopped()


async def test_one_way_per_session(store: PrivacyStore, data: Path, sink: Sink) -> None:
    PrivateData("alice", "s1", store).mark_private(Sensitivity.SECRET, source="api")

    # a toolset built later for the private session starts isolated
    again = stdio_toolset(store, data, session="s1")
    assert again.private
    # other sessions, and the same session id of another user, stay normal
    other_session = stdio_toolset(store, data, session="s2")
    other_user = stdio_toolset(store, data, user="bob", session="s1")
    async with again, other_session, other_user:
        assert who((await run(again, [("whoami", {})]))[0])["label"] == "isolated"
        assert who((await run(other_session, [("whoami", {})]))[0])["label"] == "normal"
        out = await run(other_user, [("whoami", {}), ("fetch", {"port": sink.port})])
        assert who(out[0])["label"] == "normal" and out[1].content == sink.body
        # and the private one stays isolated, run after run
        for _ in range(2):
            out = await run(again, [("whoami", {}), ("fetch", {"port": sink.port})])
            assert who(out[0])["label"] == "isolated" and out[1].content.startswith("connection failed")
    assert sink.hits == ["/exfiltrate"]  # only bob's call got out
    assert not other_session.private and not other_user.private
    assert_all_stopped()


async def test_fatal_aborts_and_tool_errors_retry(store: PrivacyStore, data: Path) -> None:
    routed = stdio_toolset(store, data, session="errors")
    async with routed:
        parts = await run(routed, [("fail", {"message": "no column 'x'"}), ("whoami", {})])
        assert retried(parts[0]) and "no column 'x'" in str(parts[0].content)
        assert who(parts[1])["label"] == "normal"  # the run went on after the retry
        with pytest.raises(RuntimeError, match=r"^\[FATAL\] data store unavailable"):
            await run(routed, [("fatal", {})])

        PrivateData("alice", "errors", store).mark_private(source="api")
        parts = await run(routed, [("fail", {}), ("whoami", {})])
        assert retried(parts[0]) and who(parts[1])["label"] == "isolated"
        with pytest.raises(RuntimeError, match=r"^\[FATAL\] data store unavailable"):
            await run(routed, [("fatal", {})])
    assert_all_stopped()


async def test_agent_run_without_outer_context_starts_and_stops_both(store: PrivacyStore, data: Path) -> None:
    """An agent enters the toolset itself: both servers live for the run only."""
    routed = stdio_toolset(store, data, session="bare")
    parts = await run(routed, [("whoami", {})])
    assert who(parts[0])["label"] == "normal"
    assert_all_stopped()


async def test_agent_plumbing_reaches_both_instances(store: PrivacyStore, data: Path) -> None:
    """What pydantic-ai does to toolsets (visit, replace) covers the isolated one too."""
    from pydantic_ai.mcp import MCPToolset

    routed = stdio_toolset(store, data, session="plumbing")
    seen: list = []
    routed.apply(seen.append)
    assert seen == [routed.wrapped, routed.isolated] and all(isinstance(t, MCPToolset) for t in seen)
    assert "bwrap" in routed.isolated.client.transport.command  # the isolated one runs under bwrap
    assert routed.wrapped.client.transport.command == sys.executable
    PrivateData("alice", "plumbing", store).mark_private(source="api")
    assert routed.private
    copy = routed.visit_and_replace(lambda t: t.prefixed("x") if isinstance(t, MCPToolset) else t)
    assert copy is not routed and copy.private and copy.isolated is not routed.isolated
    assert copy.isolated.wrapped is routed.isolated  # the visitor replaced the isolated instance too


async def test_stdio_factory_set_up_errors(
    store: PrivacyStore, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the script is not mounted into the sandbox: said before anything starts
    with pytest.raises(ValueError, match=r"data_tools_server\.py is not visible inside"):
        private_data_mcp_stdio(sys.executable, [str(SERVER)], store=store)
    with pytest.raises(ValueError, match="working directory"):
        private_data_mcp_stdio(
            sys.executable,
            [str(SERVER)],
            cwd=str(data),
            store=store,
            bind_mounts=[BindMount(TOOLS_DIR, str(TOOLS_DIR), readonly=True)],
        )
    with pytest.raises(FileNotFoundError, match="not found on PATH"):
        private_data_mcp_stdio("no-such-mcp-server-xyz", store=store)
    # no bwrap on PATH: the error names the package
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(FileNotFoundError, match="package 'bubblewrap'"):
        private_data_mcp_stdio(sys.executable, [str(SERVER)], store=store)


# -- streamable HTTP: private_data_mcp_http -----------------------------------------------


#: the isolated instance's URL: the unix socket transport ignores host and port,
#: but the server's DNS-rebinding guard wants a Host header of localhost:<port>
ISOLATED_URL = "http://localhost:8000/mcp"


def uds_ready(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
        return True
    except OSError:
        return False


def stop(proc: subprocess.Popen) -> None:
    """Stop a server this test started (its own session, so its group is its pid)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


async def test_http_factory_with_two_server_processes(
    store: PrivacyStore, data: Path, sink: Sink, tmp_path: Path
) -> None:
    """Normal instance: streamable HTTP on 127.0.0.1. Isolated instance: the
    same server in bwrap without network, reachable only through a unix
    socket in a directory shared with it (TCP could not reach it: its network
    namespace has nothing but its own lo)."""
    import httpx2

    port = free_port()
    sockdir = tmp_path / "sock"
    sockdir.mkdir()
    sock = sockdir / "data-tools.sock"
    normal_cmd = [sys.executable, str(SERVER), "--port", str(port), "--label", "normal"]
    isolated_cmd = BubblewrapSandbox().build_argv(
        SandboxSpec(
            command=[sys.executable, str(SERVER), "--uds", str(sock), "--label", "isolated"],
            isolate_network=True,
            bind_mounts=[BindMount(TOOLS_DIR, str(TOOLS_DIR), readonly=True), BindMount(sockdir, str(sockdir))],
            env={"HOME": "/tmp", "PATH": "/usr/bin:/bin"},
        )
    )
    procs: list[subprocess.Popen] = []
    client = httpx2.AsyncClient(
        transport=httpx2.AsyncHTTPTransport(uds=str(sock)), timeout=httpx2.Timeout(30, read=300)
    )
    try:
        for cmd in (normal_cmd, isolated_cmd):
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
        wait_until(lambda: tcp_ready(port), "normal HTTP server", procs[0])
        wait_until(lambda: uds_ready(sock), "isolated HTTP server", procs[1])

        routed = private_data_mcp_http(
            f"http://127.0.0.1:{port}/mcp",
            ISOLATED_URL,
            isolated_kwargs={"http_client": client},
            user_id="carol",
            session_id="web",
            store=store,
        )
        async with routed:
            before = await run(routed, [("whoami", {}), ("interfaces", {}), ("fetch", {"port": sink.port})])
            assert who(before[0])["label"] == "normal" and who(before[0])["pid"] == procs[0].pid
            assert host_network(before[1].content)
            assert before[2].content == sink.body and len(sink.hits) == 1

            PrivateData("carol", "web", store).mark_private(Sensitivity.INTERNAL, source="api")
            after = await run(
                routed, [("whoami", {}), ("interfaces", {}), ("fetch", {"port": sink.port}), ("fail", {})]
            )
            assert who(after[0])["label"] == "isolated" and who(after[0])["hostname"] == "sandbox"
            assert after[1].content == "lo"
            assert after[2].content.startswith("connection failed") and len(sink.hits) == 1
            assert retried(after[3])
            with pytest.raises(RuntimeError, match=r"^\[FATAL\]"):
                await run(routed, [("fatal", {})])

        # a different session on the same servers stays normal
        fresh = private_data_mcp_http(
            f"http://127.0.0.1:{port}/mcp",
            ISOLATED_URL,
            isolated_kwargs={"http_client": client},
            user_id="carol",
            session_id="web2",
            store=store,
        )
        assert who((await run(fresh, [("whoami", {})]))[0])["label"] == "normal"
    finally:
        await client.aclose()
        for proc in procs:
            stop(proc)
    assert all(proc.poll() is not None for proc in procs)
    assert_all_stopped()
