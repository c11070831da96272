"""The process-sandbox API: start a command in isolation, once or long-lived.

Backends know nothing about Python cells; the engine builds on ``start()``
(a long-lived child it talks to over stdin/stdout) and tools use ``run()``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BindMount:
    """A host path made visible inside the sandbox at ``target``.

    ``kind`` "hide" masks ``target`` instead (the workspace policy's secrets): an
    empty read-only tmpfs when ``source`` is a directory, ``/dev/null`` when it is
    a file; nothing of ``source`` becomes visible.
    """

    source: Path
    target: str
    readonly: bool = False
    kind: str = "bind"  # "bind" | "hide"


@dataclass
class SandboxResult:
    """What a finished ``Sandbox.run`` produced.

    ``stdout``/``stderr`` hold what was kept of each stream (see
    :meth:`Sandbox.run_spec`'s ``max_output``): the head and the tail joined,
    ``*_dropped`` bytes left out between them at offset ``*_dropped_at``."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    stdout_dropped: int = 0
    stdout_dropped_at: int = 0
    stderr_dropped: int = 0
    stderr_dropped_at: int = 0


#: what ``Sandbox.run_spec`` keeps of each stream by default (head and tail together)
DEFAULT_MAX_OUTPUT = 1 << 20
#: how long a killed sandbox is waited for (``SandboxProcess.kill``)
REAP_WAIT = 10.0

log = logging.getLogger(__name__)
_READ_CHUNK = 1 << 16


class _HeadTail:
    """A stream's first and last bytes, at most ``limit`` in all, and how many
    fell between: the host keeps a bounded amount whatever a sandbox prints."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.tail_limit
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def value(self) -> bytes:
        return bytes(self.head + self.tail)


def _result(exit_code: int, out: _HeadTail, err: _HeadTail, timed_out: bool = False) -> SandboxResult:
    return SandboxResult(
        exit_code=exit_code,
        stdout=out.value(),
        stderr=err.value(),
        timed_out=timed_out,
        stdout_dropped=out.dropped,
        stdout_dropped_at=len(out.head) if out.dropped else 0,
        stderr_dropped=err.dropped,
        stderr_dropped_at=len(err.head) if err.dropped else 0,
    )


async def _drain(stream: asyncio.StreamReader | None, keep: _HeadTail) -> None:
    """Read ``stream`` to its end chunk by chunk into ``keep``."""
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        keep.add(chunk)


async def _feed(writer: asyncio.StreamWriter | None, data: bytes | None) -> None:
    """Write ``data`` (if any) to the child's stdin and close it, as ``communicate()`` does."""
    if writer is None:
        return
    try:
        if data:
            writer.write(data)
            await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child exited or closed its stdin without reading it all
    writer.close()


@dataclass(frozen=True)
class ResourceLimits:
    """rlimits applied to the sandboxed process tree; ``None`` leaves one unset.

    They are set on the process that becomes the sandbox, so every child
    inherits them. RLIMIT_NPROC counts per host uid and is not enforced for
    host root: use the Docker backend when a hard process cap matters.
    """

    address_space: int | None = None
    processes: int | None = None
    file_size: int | None = None
    open_files: int | None = None

    def apply(self) -> None:
        """Set the limits on the calling process (runs between fork and exec)."""
        for which, value in (
            (resource.RLIMIT_AS, self.address_space),
            (resource.RLIMIT_NPROC, self.processes),
            (resource.RLIMIT_FSIZE, self.file_size),
            (resource.RLIMIT_NOFILE, self.open_files),
        ):
            if value is not None and value > 0:
                _, hard = resource.getrlimit(which)
                if hard != resource.RLIM_INFINITY:
                    value = min(value, hard)
                resource.setrlimit(which, (value, value))


@dataclass
class SandboxSpec:
    """Everything a backend needs to start one sandboxed command."""

    command: Sequence[str]
    bind_mounts: Sequence[BindMount] = ()
    isolate_network: bool = True
    isolate_pid: bool = True
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    tmp_size: int = 1 << 30
    #: with network (``isolate_network`` False): "user" is a user-mode network
    #: (the sandbox reaches the internet, not the host's loopback or abstract
    #: sockets); "host" shares the host's network namespace, loopback included.
    network: str = "user"
    #: host uid the sandbox runs as when this process is root: None picks the
    #: unprivileged default (``host_ids.SANDBOX_UID``), 0 keeps root (unsafe)
    sandbox_uid: int | None = None
    #: the command is its own init (the worker's anchor: it reaps orphans,
    #: handles SIGTERM and leaves when its channel on stdin closes). Docker
    #: then runs it as PID 1 without docker-init: the init of a PID namespace
    #: gets no signal from inside it that it has no handler for, so no cell
    #: can stop (SIGSTOP) or kill the process that ends the container.
    own_init: bool = False


class SandboxProcess:
    """A long-lived sandboxed child with pipes on stdin, stdout and stderr."""

    def __init__(
        self, process: asyncio.subprocess.Process, backend: str, helpers: Sequence[asyncio.subprocess.Process] = ()
    ) -> None:
        self.process = process
        self.backend = backend
        #: helper processes (e.g. the user-mode network) that die with the sandbox
        self.helpers = list(helpers)
        #: pidfds of the sandbox and its helpers (``cut_network_now``), opened
        #: while they are our unreaped children: a pid may be reaped by the
        #: child watcher's thread and reused before the event loop hears of it
        self._pidfds_lock = threading.Lock()
        self._pidfds: dict[int, int] = {}
        for child in (process, *self.helpers):
            try:
                self._pidfds[child.pid] = os.pidfd_open(child.pid)
            except (OSError, AttributeError):  # gone already, or no pidfd (old kernel): cut by the loop only
                pass
        #: the sandbox's own cgroup (whole-sandbox caps), when one could be had
        self.cgroup: Any = None
        #: why the sandbox has no cgroup of its own (said to the user once)
        self.cgroup_problem: str | None = None

    def caps_mark(self) -> dict[str, int]:
        """Counters of the whole-sandbox caps now (compare with :meth:`caps_hit`)."""
        return self.cgroup.mark() if self.cgroup is not None else {}

    def caps_hit(self, mark: dict[str, int]) -> list[str]:
        """The whole-sandbox caps reached since ``mark``, in words."""
        return self.cgroup.hit_since(mark) if self.cgroup is not None else []

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stdin(self) -> asyncio.StreamWriter:
        assert self.process.stdin is not None
        return self.process.stdin

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    @property
    def stderr(self) -> asyncio.StreamReader:
        assert self.process.stderr is not None
        return self.process.stderr

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    async def cut_network(self) -> bool:
        """Take the sandbox's network away NOW, without its cooperation, and
        return whether it is gone (False: only killing the sandbox can do it).

        A user-mode network lives in its helper (pasta): when the helper dies
        its tap interface, the default route and every connection through it
        go with it, whatever the sandbox is busy with."""
        stopped = await self._stop_helpers()
        self.network_cut = True
        return stopped

    async def _stop_helpers(self) -> bool:
        """Kill every helper process, then reap them; whether there were any.
        All are killed before the first wait, and each stays listed until it
        is reaped: a cut cancelled in its wait (a registry's watcher stopped
        during a rise) left a helper to :meth:`kill` neither killed nor
        reaped, its transport finalised after its event loop had closed."""
        helpers = list(self.helpers)
        for helper in helpers:
            if helper.returncode is None:
                try:
                    helper.kill()
                except ProcessLookupError:
                    pass
        for helper in helpers:
            await helper.wait()
            if helper in self.helpers:
                self.helpers.remove(helper)
            self._close_pidfd(helper.pid)
        return bool(helpers)

    def cut_network_now(self) -> bool:
        """Take the network away from another thread, without the event loop:
        the kernel's loop may be busy for seconds cleaning what a sandbox
        sent, and the cut must not wait for it (``engine/cut_watchdog.py``).
        Signals the helpers through their pidfds; whether there were any (if
        not, only :meth:`kill_now` can take the network). The loop's own
        :meth:`cut_network` then reaps them and records the cut."""
        self.cut_now = self._signal(main=False) or self.cut_now
        return self.cut_now

    def kill_now(self) -> None:
        """Kill the sandbox from another thread (see :meth:`cut_network_now`):
        its first process, its helpers and its cgroup. The loop's
        :meth:`kill` reaps them later."""
        self._signal(main=True)
        self.cut_now = True
        if self.cgroup is not None and self.cgroup.owned:
            try:
                self.cgroup.kill_all()
            except Exception as exc:  # the signals above went anyway
                log.warning("could not kill the sandbox's cgroup: %s", exc)

    def _signal(self, *, main: bool) -> bool:
        """SIGKILL the helpers (and the first process if ``main``); whether
        there was any to signal."""
        with self._pidfds_lock:
            fds = [fd for pid, fd in self._pidfds.items() if main or pid != self.process.pid]
            for fd in fds:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # ended already
        return bool(fds)

    def _close_pidfd(self, pid: int) -> None:
        with self._pidfds_lock:
            fd = self._pidfds.pop(pid, None)
            if fd is not None:
                os.close(fd)

    def __del__(self) -> None:
        for fd in getattr(self, "_pidfds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    #: set once :meth:`cut_network` succeeded
    network_cut = False
    #: set once :meth:`cut_network_now` or :meth:`kill_now` took the way out
    cut_now = False
    #: set when whoever holds the network refused to take it away (a Docker
    #: daemon refusing a disconnect): only killing the sandbox can do it then
    cut_refused = False

    async def kill(self) -> None:
        """Kill the whole sandbox: it leads its own session, so its group goes too."""
        await self._stop_helpers()
        kill_group(self.process)
        if self.cgroup is not None and self.cgroup.owned:
            await asyncio.to_thread(self.cgroup.kill_all)
        try:
            # Python 3.11 wakes a waiter that began before the exit only once
            # every pipe of the process is closed: a pipe held outside its group
            # must not hang the kill (and a registry's close) for ever.
            await asyncio.wait_for(self.process.wait(), REAP_WAIT)
        except asyncio.TimeoutError:
            log.warning("sandbox %d was killed, but its pipes were still open after %g s", self.process.pid, REAP_WAIT)
        self._close_pidfd(self.process.pid)
        if self.cgroup is not None:
            cgroup, self.cgroup = self.cgroup, None
            if not await asyncio.to_thread(cgroup.remove, 0.5):
                # busy a little longer: finished in the background (and at
                # the kernel's exit) rather than delaying a replacement
                cgroup.remove_later()


class Sandbox(ABC):
    """Run commands in isolation. Subclasses only say how to start one."""

    #: short name shown to users (status widget, warnings)
    name: str = "abstract"
    #: False only for the development fallback
    isolates: bool = True
    #: whether a sandbox started without network has none (False for the
    #: development fallback: once private, the engine runs nothing more on it).
    #: Apart from ``isolates`` for the engine's own tests, whose stand-in
    #: backend runs plain processes but is trusted to have the launch it was given
    enforces_network: bool = True
    #: said loudly (first cell, kernel log, widget) when the backend isolates
    #: less than users expect; None for a real sandbox
    warning: str | None = None

    @abstractmethod
    async def start(self, spec: SandboxSpec) -> SandboxProcess:
        """Start ``spec.command`` in a fresh sandbox and return the live child."""

    def holder_facts(self) -> dict[str, Any] | None:
        """What this process's holder record must say about the sandboxes it
        starts when they can outlive it (Docker containers: ``docker.orphans``),
        or None when they die with it (host processes). May raise when those
        facts cannot be had: no sandbox may start without them."""
        return None

    def unstopped(self) -> list[str]:
        """Sandboxes this backend was told to kill without a confirmation that
        they ended (a Docker daemon that does not answer): they may still have
        their network. None for a backend whose sandboxes are host processes."""
        return []

    async def run(
        self,
        command: Sequence[str],
        bind_mounts: Sequence[BindMount] = (),
        timeout: float | None = None,
        isolate_network: bool = True,
        isolate_pid: bool = True,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        limits: ResourceLimits | None = None,
        stdin: bytes | None = None,
        network: str = "user",
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> SandboxResult:
        """Run a command to completion (the seeds' API); kill it on timeout.
        ``network`` is the kind of network when ``isolate_network`` is False
        (see :attr:`SandboxSpec.network`); ``max_output`` as in :meth:`run_spec`."""
        spec = SandboxSpec(
            command=list(command),
            bind_mounts=list(bind_mounts),
            isolate_network=isolate_network,
            network=network,
            isolate_pid=isolate_pid,
            cwd=cwd,
            env=dict(env or {}),
            limits=limits or ResourceLimits(),
        )
        return await self.run_spec(spec, timeout=timeout, stdin=stdin, max_output=max_output)

    async def run_spec(
        self,
        spec: SandboxSpec,
        timeout: float | None = None,
        stdin: bytes | None = None,
        started: Callable[[SandboxProcess], None] | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> SandboxResult:
        """Run a decided launch (``engine.launch.plan_launch``) to completion; kill it on timeout.
        ``started`` is told the process as soon as it runs (to cut or kill it meanwhile).

        The streams are read as they come and at most ``max_output`` bytes of
        each are kept, its first and last halves, the rest counted in the
        result's ``*_dropped``: what a sandbox prints must not grow the host
        (``communicate()`` buffered it all; 600 MB printed took the host to 1.4 GB)."""
        if max_output < 2:
            raise ValueError(f"max_output must be at least 2 bytes, got {max_output}")
        child = await self.start(spec)
        process = child.process
        out, err = _HeadTail(max_output), _HeadTail(max_output)

        async def communicate() -> None:
            await asyncio.gather(_feed(process.stdin, stdin), _drain(process.stdout, out), _drain(process.stderr, err))
            await process.wait()

        try:
            if started is not None:
                started(child)  # (a caller's error here still kills it, below)
            await asyncio.wait_for(communicate(), timeout=timeout)
        except asyncio.TimeoutError:
            await child.kill()
            return _result(-1, out, err, timed_out=True)  # what it printed until then
        except BaseException:
            await child.kill()
            raise
        await child.kill()  # helpers (the user-mode network) go with it
        return _result(process.returncode or 0, out, err)


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL a process started by ``spawn`` and its group (it leads its
    own session), without waiting: also from a caller being cancelled."""
    if process.returncode is not None:
        return
    targets: tuple[Callable[[], None], ...] = (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill)
    for target in targets:
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


async def spawn(
    argv: Sequence[str],
    limits: ResourceLimits,
    env: Mapping[str, str] | None,
    cwd: str | None,
    pass_fds: Sequence[int] = (),
    run_as: tuple[int, int] | None = None,
    join: Callable[[], None] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` in its own session with pipes and rlimits (shared by
    backends). Between fork and exec, in this order: ``join`` (e.g. enter the
    sandbox's cgroup, which needs this process's privileges), then the switch
    to the host ``run_as`` (uid, gid) with no supplementary groups (root's
    would otherwise stay), then the rlimits."""

    def prepare() -> None:
        if join is not None:
            join()
        if run_as is not None:
            os.setgroups([])
            os.setresgid(run_as[1], run_as[1], run_as[1])
            os.setresuid(run_as[0], run_as[0], run_as[0])
        limits.apply()

    creation = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=prepare,
            limit=1 << 24,
            pass_fds=tuple(pass_fds),
        )
    )
    try:
        return await asyncio.shield(creation)
    except asyncio.CancelledError:
        # Cancelled between the fork and the pipes' connection, asyncio kills
        # the process alone and waits until its pipes close, which children
        # in its group held open: the caller hung for ever (a user-mode
        # network sandbox waits for the host). The creation is let finish (a
        # few ms: the caller's fds in ``pass_fds`` stay open until the fork
        # is done), then the whole group is killed.
        while not creation.done():
            try:
                await asyncio.shield(creation)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        if not creation.cancelled() and creation.exception() is None:
            process = creation.result()
            kill_group(process)
            reap = asyncio.ensure_future(process.wait())  # its pipes close once the group is gone
            _REAPING.add(reap)
            reap.add_done_callback(_REAPING.discard)
        raise


#: processes killed by ``spawn`` for a cancelled caller, until reaped
_REAPING: set[asyncio.Future[int]] = set()
