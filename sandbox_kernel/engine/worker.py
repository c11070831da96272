"""One running sandbox with the worker inside, seen from the host."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ..sandbox import SandboxProcess
from ..worker.protocol import OUTPUT_TYPES
from .channel import ProtocolError, encode, read_message

DEAD = "_dead"

#: bytes of frames the queue may hold before the reader stops reading: the
#: sandbox's writers then wait on the full pipe. Frames come from untrusted
#: code at pipe speed, and between requests nothing takes them out of the
#: queue: a thread a cell left writing used to grow the kernel by hundreds
#: of MB a second, for as long as nobody ran a cell.
QUEUE_BYTES = 8 * 1024 * 1024


async def wait_then_cancel(tasks: list[asyncio.Future[Any]], timeout: float) -> None:
    """Give ``tasks`` (a killed sandbox's readers) ``timeout`` seconds to end,
    then cancel those still running. A task that ended cancelled is done. A
    cancellation of the caller is passed on, never swallowed: the privacy
    watcher is cancelled while it replaces a sandbox, and a caller that went
    on would keep the registry's close waiting for it (``asyncio.wait_for``
    raises the same error for both, so it cannot tell them apart)."""
    try:
        _, running = await asyncio.wait(tasks, timeout=timeout)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise
    for task in running:
        task.cancel()


#: bytes of a sandbox's stderr line kept (40 lines are)
STDERR_LINE_KEPT = 2048
#: bytes the host holds for a sandbox that does not read them, before it is killed
WRITE_BUFFER_LIMIT = 128 << 20


class WorkerHandle:
    """Reads the worker's frames into a queue; a dead or misbehaving worker
    becomes a single ``_dead`` message with the reason.

    Between requests, output frames (threads and tasks of earlier cells, and
    processes they started, go on printing and updating widgets, as in
    ipykernel) go to ``between`` as they arrive instead (``forward_between``)."""

    def __init__(self, process: SandboxProcess, log: logging.Logger) -> None:
        self.process = process
        self.log = log
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=40)
        self.dead_reason: str | None = None
        #: a request whose caller stopped waiting before its end (an agent's
        #: call cancelled by its client, the privacy watcher stopped while it
        #: replaced a sandbox): its id, and when its caller would have given
        #: up (None: never). The worker takes one request at a time and drops
        #: one sent meanwhile, so the next waits for this one's end first
        #: (``Session._settle``).
        self.abandoned: tuple[str, float | None] | None = None
        self._between: Callable[[dict[str, Any]], None] | None = None
        self._unread_kill: asyncio.Future[None] | None = None  # see ``send``
        self._queued = 0  # bytes of the frames in ``messages``
        self._sizes: dict[int, int] = {}  # id of a queued frame -> its size
        self._room = asyncio.Event()
        self._room.set()
        self._reader = asyncio.ensure_future(self._read())
        self._stderr = asyncio.ensure_future(self._drain_stderr())

    async def next_message(self) -> dict[str, Any]:
        """The next frame of the queue (what a request waits for)."""
        msg = await self.messages.get()
        self._queued -= self._sizes.pop(id(msg), 0)
        if self._queued <= QUEUE_BYTES:
            self._room.set()
        return msg

    def forward_between(self, forward: Callable[[dict[str, Any]], None]) -> None:
        """Until ``stop_forwarding``, pass output frames to ``forward`` as they
        arrive (those queued already first, in order), not to the queue."""
        self._between = forward
        kept: list[dict[str, Any]] = []
        while not self.messages.empty():
            msg = self.messages.get_nowait()
            size = self._sizes.pop(id(msg), 0)
            if msg.get("type") in OUTPUT_TYPES:
                self._queued -= size
                self._pass_on(msg)
            else:
                kept.append(msg)
                self._sizes[id(msg)] = size
        for msg in kept:
            self.messages.put_nowait(msg)
        if self._queued <= QUEUE_BYTES:
            self._room.set()

    def stop_forwarding(self) -> None:
        """Output frames go to the queue again: a request is about to start."""
        self._between = None

    def _pass_on(self, msg: dict[str, Any]) -> None:
        forward = self._between
        if forward is None:
            return
        try:
            forward(msg)
        except Exception:  # pragma: no cover - a frontend's emit failing must not stop the reader
            self.log.exception("forwarding output sent between requests failed")

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.process.returncode is None

    async def _read(self) -> None:
        reason = "the sandbox closed its channel"
        try:
            while True:
                await self._room.wait()
                sized = await read_message(self.process.stdout)
                if sized is None:
                    break
                msg, size = sized
                if self._between is not None and msg.get("type") in OUTPUT_TYPES:
                    self._pass_on(msg)
                    continue
                self._sizes[id(msg)] = size
                self._queued += size
                if self._queued > QUEUE_BYTES:
                    self._room.clear()
                self.messages.put_nowait(msg)
        except ProtocolError as exc:
            reason = f"the sandbox broke the protocol ({exc})"
        except Exception as exc:  # pragma: no cover - defensive
            reason = f"reading from the sandbox failed ({exc!r})"
        code = await self._exit_code(timeout=1.0)
        if code is not None:
            reason = f"{reason}; the sandbox exited with code {code}"
        self.dead_reason = self.dead_reason or reason  # keep the reason of a deliberate kill
        self.messages.put_nowait({"type": DEAD, "reason": self.dead_reason})

    async def _exit_code(self, timeout: float) -> int | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout)
        except asyncio.TimeoutError:
            return None

    async def _drain_stderr(self) -> None:
        """Keep the last lines of the sandbox's stderr (for the reason of a
        failed start), each cut to ``STDERR_LINE_KEPT`` bytes. A cell can
        write there (in a container, docker-init's stderr is open to it):
        whole lines of up to the stream's 16 MiB limit, forty of them kept,
        held over 1.2 GiB of the host's memory for the sandbox's life. So
        it is read in chunks, and a line's rest is dropped as it comes."""
        budget = 1 << 20  # log at most 1 MiB of a sandbox's stderr
        line = b""  # the line being read, cut to STDERR_LINE_KEPT + 1 bytes
        while True:
            chunk = await self.process.stderr.read(1 << 16)
            lines = (line + chunk).split(b"\n")
            line = lines.pop()[: STDERR_LINE_KEPT + 1]
            if not chunk and line:
                lines.append(line)
            for whole in lines:
                text = whole[:STDERR_LINE_KEPT].decode("utf-8", "replace").rstrip()
                if len(whole) > STDERR_LINE_KEPT:
                    text += " [cut]"
                self.stderr_tail.append(text)
                if budget > 0:
                    budget -= len(text)
                    self.log.debug("sandbox stderr: %s", text)
            if not chunk:
                return

    def send(self, msg: dict[str, Any]) -> None:
        """Queue ``msg`` for the sandbox. A sandbox that stops reading (a cell
        can stop its holder from reading, and forge requests whose answers
        pile up) would make the host keep every unread byte: past
        ``WRITE_BUFFER_LIMIT`` the sandbox is killed instead (a cell forging
        ratchet requests with a 48 MB name held 580 MB of the host)."""
        if self.process.returncode is not None:
            return
        try:
            self.process.stdin.write(encode(msg))
        except (ConnectionError, RuntimeError):
            return
        waiting = self.process.stdin.transport.get_write_buffer_size()
        if waiting > WRITE_BUFFER_LIMIT and self.dead_reason is None and self._unread_kill is None:
            self.dead_reason = f"the sandbox stopped reading what the host sends ({waiting >> 20} MiB waiting)"
            self.log.error("%s: killing it", self.dead_reason)
            self._unread_kill = asyncio.ensure_future(self.kill())

    async def kill(self) -> None:
        await self.process.kill()
        await wait_then_cancel([self._reader, self._stderr], 2.0)
