"""The MCP server over streamable HTTP (`sandbox-kernel mcp --transport streamable-http`),
driven by the SDK's HTTP client: state across calls, images, the fixed session,
and per-request sessions behind a trusted gateway (`--identity-headers`); and
attacked like a web page in the user's browser (DNS rebinding, cross-origin
requests) and like another local process or user (no or a wrong bearer token;
the token a loopback server generates when none is configured, in its 0600
file in the Jupyter runtime dir).

The servers listen on loopback only: 127.0.0.2 stands in for a bind address
that is not one of the literal loopback hosts (0.0.0.0 in docs/deploy/container.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
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


def token_file(runtime_dir: Path, host: str, port: int) -> Path:
    """Where a server with no configured token writes the one it generates (documented in docs/tools.md)."""
    return runtime_dir / f"sandbox-kernel-mcp-{host}-{port}.token"


class HttpServer:
    """`sandbox-kernel mcp` over HTTP in a process of its own, with its own Jupyter
    runtime dir (``runtime_dir``). Without --token-file / --token / --unsafe-no-token
    in ``extra`` it generates a token: :attr:`token` is read from its file, and
    :meth:`client` sends it unless told otherwise."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}/mcp"
        self.runtime_dir = data_dir.parent / "runtime"
        self.token_file = token_file(self.runtime_dir, host, self.port)
        generates = not {"--token-file", "--token", "--unsafe-no-token"} & set(extra)
        self.stderr_path = data_dir.parent / f"server-{self.port}.stderr"
        environ = {**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data_dir), "JUPYTER_RUNTIME_DIR": str(self.runtime_dir)}
        environ.pop("SANDBOX_KERNEL_MCP_TOKEN", None)
        with open(self.stderr_path, "w") as stderr:  # a file, not a pipe: request logs cannot fill it and block
            self.proc = subprocess.Popen(
                mcp_http_argv(host, self.port, "--user-id", "agent", "--session-id", "web", *extra),
                env={**environ, **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            path = self.token_file  # written once the port is bound, replacing whatever was planted there
            wait_until(
                lambda: tcp_ready(host, self.port) and (not generates or (path.exists() and not path.is_symlink())),
                "the MCP server",
                self.proc,
                timeout=60,
            )
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"{exc}\n{self.stderr()[-3000:]}") from None
        self.token = self.token_file.read_text().strip() if generates else token

    def client(self, headers: dict[str, str] | None = None, *, authorized: bool = True) -> Client:
        """An SDK client sending ``headers`` and, if ``authorized``, the server's token."""
        headers = {
            **({"Authorization": f"Bearer {self.token}"} if authorized and self.token else {}),
            **(headers or {}),
        }
        if not headers:
            return Client(self.url)
        return Client(streamable_http_client(self.url, http_client=httpx2.AsyncClient(headers=headers, timeout=120)))

    @property
    def auth(self) -> dict[str, str]:
        """The header a legitimate raw HTTP client sends."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to the server (our child, by PID) and wait for it to exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


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


def call_as_sent(server: HttpServer, name: str, arguments: dict, headers: list[tuple[str, str]]) -> dict:
    """One tool call over raw HTTP, every request carrying ``headers`` exactly
    as listed (a header repeated stays repeated). Returns the call's JSON-RPC result."""
    sent = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        *server.auth.items(),
        *headers,
    ]
    with httpx2.Client(timeout=120) as http:
        r = http.post(server.url, headers=sent, json=INITIALIZE)
        assert r.status_code == 200, r.text
        sent += [("Mcp-Session-Id", r.headers["mcp-session-id"]), ("MCP-Protocol-Version", "2025-06-18")]
        http.post(server.url, headers=sent, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        r = http.post(server.url, headers=sent, json=call)
    assert r.status_code == 200, r.text
    if r.headers["content-type"].startswith("text/event-stream"):
        replies = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        return next(m["result"] for m in replies if m.get("id") == 2)
    return r.json()["result"]


def sessions_made(data_dir: Path) -> list[Path]:
    """What tool calls created under the data dir: sessions' and workspaces' folders and files."""
    found = [*data_dir.glob("sessions/**/*"), *data_dir.glob("workspaces/**/*")]
    return [path.relative_to(data_dir) for path in found]


def result_text(result: dict) -> str:
    return "\n".join(block["text"] for block in result["content"] if block["type"] == "text")


async def test_a_repeated_identity_header_is_refused(gateway_server: HttpServer, data_dir: Path) -> None:
    """A gateway adding its identity header in front of one the client sent:
    the server's dict of the headers kept the last, the client's, so the
    client picked the session (a fresh, public one). Now refused, naming the
    header, and nothing runs in any session."""
    hop = {"command": "echo hopped > hop.txt"}
    gateway = [("X-Sandbox-User-Id", "gw"), ("X-Sandbox-Session-Id", "assigned")]
    for client_adds, repeated in (
        (("X-Sandbox-Session-Id", "fresh"), "X-Sandbox-Session-Id"),
        (("x-sandbox-user-id", "mallory"), "X-Sandbox-User-Id"),
    ):
        result = call_as_sent(gateway_server, "sandbox_execute", hop, [*gateway, client_adds])
        said = result_text(result)
        assert result["isError"] and said.startswith("[FATAL]"), said
        assert f"carries 2 {repeated} headers" in said and "exactly one is allowed" in said, said
    assert not sessions_made(data_dir)
    # one of each: the gateway's session, as before
    result = call_as_sent(gateway_server, "sandbox_execute", hop, gateway)
    assert not result["isError"], result_text(result)
    assert (data_dir / "workspaces/gw/assigned/hop.txt").read_text() == "hopped\n"


async def test_export_paths_no_terminal_can_show_are_refused(http_server: HttpServer, data_dir: Path) -> None:
    """Over MCP: terminal controls in the export's path were echoed in the
    success text (OSC 52 to the terminal showing the transcript) and named a
    host file. Refused, naming ``path`` and the character. (A lone surrogate
    never gets this far over HTTP: the SDK's JSON parser refuses the request;
    the in-process tools are attacked with it in test_bad_inputs_of_every_tool.)"""
    cases = [
        ("\x1b]52;c;cHduZWQ=\x07\x1b[2Jx.ipynb", "holds the control character U+001B (ESCAPE) at character 0"),
        ("invoice_\u202efdp.ipynb", "holds the format character U+202E (RIGHT-TO-LEFT OVERRIDE) at character 8"),
    ]
    for path, message in cases:
        result = call_as_sent(http_server, "repl_export_ipynb", {"path": path}, [])
        said = result_text(result)
        assert result["isError"] and said.startswith("Error: path ") and message in said, said
        assert "\x1b" not in said and "\u202e" not in said, said
    assert not [path for path in sessions_made(data_dir) if path.parts[0] == "workspaces" and len(path.parts) > 3]


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
    server = HttpServer(data_dir, "--token-file", str(token_file), host="127.0.0.2", token=TOKEN)
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
    async with token_server.client({"Authorization": f"Bearer {TOKEN}"}, authorized=False) as client:
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
    statuses = attack(http_server.url, {"Origin": f"http://127.0.0.1:{port}", **http_server.auth})  # its own origin
    assert statuses == [200, 202, 200], statuses


# ------------------------------------------- a loopback server without a configured token


def base_env(data_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "SANDBOX_KERNEL_DATA_DIR": str(data_dir),
        "JUPYTER_RUNTIME_DIR": str(data_dir.parent / "runtime"),
    }
    env.pop("SANDBOX_KERNEL_MCP_TOKEN", None)
    return env


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_loopback_server_without_a_token_generates_one(data_dir: Path, signum: int) -> None:
    """On 127.0.0.1 with no token option, every local account of the machine
    could drive the old server. Now it generates a token, in a 0600 file of a
    0700 runtime dir: without it 401, with it the SDK client works. The file's
    path is printed, the token is not; the file goes when the server stops."""
    server = HttpServer(data_dir)
    try:
        for auth in ({}, {"Authorization": "Bearer " + "x" * 43}):
            assert attack(server.url, auth) == [401, 401, 401], auth
        assert nothing_ran(data_dir)
        path = server.token_file
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        assert stat.S_IMODE(server.runtime_dir.stat().st_mode) == 0o700
        assert server.token is not None and len(server.token) >= 43
        async with server.client() as client:  # the token read from the file
            assert "sandbox_execute" in {t.name for t in (await client.list_tools()).tools}
    finally:
        server.stop(signum)
    assert server.proc.returncode == 0, server.stderr()
    assert not path.exists(), "the token file outlived the server"
    err = server.stderr()
    assert str(path) in err and "Authorization: Bearer" in err and '"headers"' in err, err
    assert server.token not in err


async def test_a_planted_symlink_is_replaced_not_followed(data_dir: Path, tmp_path: Path) -> None:
    """The file's name is predictable (host and port): a link planted there
    toward another file is replaced by the token file, never written through."""
    port = free_port()
    runtime_dir = data_dir.parent / "runtime"
    runtime_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    planted = token_file(runtime_dir, "127.0.0.1", port)
    planted.symlink_to(victim)
    server = HttpServer(data_dir, port=port)
    try:
        assert victim.read_text() == "keep me\n"
        st = os.lstat(planted)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert attack(server.url, {}) == [401, 401, 401]
        async with server.client() as client:
            assert "sandbox_execute" in {t.name for t in (await client.list_tools()).tools}
    finally:
        server.stop()
    assert not planted.exists() and not planted.is_symlink()
    assert victim.read_text() == "keep me\n"
    assert "symlink" in server.stderr() and "not following" in server.stderr()


async def test_a_second_server_on_the_same_port_leaves_the_first_ones_file(
    http_server: HttpServer, data_dir: Path
) -> None:
    """The file is written only once the port is bound: a second server on the
    same address fails without touching the first one's token."""
    before = http_server.token_file.read_text()
    argv = mcp_http_argv("127.0.0.1", http_server.port, "--user-id", "agent", "--session-id", "web")
    done = subprocess.run(argv, env=base_env(data_dir), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stderr
    assert "address already in use" in done.stderr.lower(), done.stderr
    assert http_server.token_file.read_text() == before
    async with http_server.client() as client:
        assert "sandbox_execute" in {t.name for t in (await client.list_tools()).tools}


async def test_a_runtime_dir_others_can_write_is_refused(data_dir: Path) -> None:
    """Whoever may write to the directory could swap the file: no token file
    there, and no server without one. Refused before binding, naming the way out."""
    runtime_dir = data_dir.parent / "runtime"
    runtime_dir.mkdir()
    runtime_dir.chmod(0o777)
    port = free_port()
    done = subprocess.run(
        mcp_http_argv("127.0.0.1", port), env=base_env(data_dir), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert "not private" in done.stderr and str(runtime_dir) in done.stderr and "--token-file" in done.stderr
    assert list(runtime_dir.iterdir()) == []
    assert not tcp_ready("127.0.0.1", port)


async def test_unsafe_no_token_serves_loopback_without_a_token_and_says_so(data_dir: Path) -> None:
    server = HttpServer(data_dir, "--unsafe-no-token")
    try:
        async with server.client() as client:  # no Authorization header at all
            assert "sandbox_execute" in {t.name for t in (await client.list_tools()).tools}
    finally:
        server.stop()
    err = server.stderr()
    assert "UNSAFE (--unsafe-no-token" in err and "every local user" in err, err
    assert not server.runtime_dir.exists() or list(server.runtime_dir.iterdir()) == []
