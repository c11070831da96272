"""Framed JSON messages between the worker and the host.

A frame is a 4-byte big-endian length followed by UTF-8 JSON. Reads are
unbuffered and exact, so a process that stops reading mid-stream never
swallows bytes meant for the process that reads next (the state holder
hands the channel over to its child after every cell).

Writes come from more than one process: the running request's process, and
the holder, where threads a finished cell started live on (a thread that
logs through a handler bound to that cell's stream). A frame over PIPE_BUF
is not written atomically, so two processes' frames could interleave and the
host would see a broken protocol and replace the sandbox, losing its state.
A process-wide record lock (``lockf`` on a shared memfd: POSIX locks exclude
other processes, the threading lock other threads) makes each frame whole.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .protocol import HEADER, MAX_FRAME, MAX_OUTPUT_MESSAGE, OUTPUT_TYPES
from .shared_memory import shared_memory


class ChannelClosed(EOFError):
    pass


def frame_lock_fd() -> int | None:
    """A file for the frame lock, shared by every process forked after this
    (None where none can be had: frames are then only whole per process)."""
    return shared_memory("frames")


_channels: weakref.WeakSet[Channel] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held a channel's lock when it forked:
    # that thread does not exist here, so the lock would never be released.
    for channel in list(_channels):
        channel._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold back a KeyboardInterrupt until the frame is written.

    Raised between two partial writes, it left half a frame in the pipe; raised
    just after the record lock was taken, it left the lock held and the
    holder's DONE waiting for it forever (a stop pressed while a cell
    printed). Only the main thread runs Python signal handlers, so only it
    needs this; the interrupt is raised as soon as the frame is out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, caught[0])


class Channel:
    def __init__(self, read_fd: int, write_fd: int, frame_lock: int | None = None) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._lock = threading.Lock()
        self._frame_lock = frame_lock
        _channels.add(self)
        #: set to False to drop messages (background threads of a finished cell)
        self.enabled = True
        #: bytes of output the running cell may still send (None: no budget).
        #: The host enforces the budget too; counting here keeps a flood from
        #: ever crossing the pipe (and costing the HOST its decoding).
        self.output_budget: int | None = None
        self.dropped_output = 0

    def set_output_budget(self, budget: int | None) -> None:
        self.output_budget = budget if budget and budget > 0 else None
        self.dropped_output = 0

    @property
    def output_exhausted(self) -> bool:
        return self.output_budget is not None and self.output_budget <= 0

    def send(self, msg: dict[str, Any]) -> None:
        output = self.output_budget is not None and msg.get("type") in OUTPUT_TYPES
        if output and self.output_exhausted:
            self.dropped_output += _rough_size(msg)
            return
        data = json.dumps(msg, default=repr, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if output:
            if len(data) > MAX_OUTPUT_MESSAGE:
                self.dropped_output += len(data)
                return
            self.output_budget = (self.output_budget or 0) - len(data)
        frame = HEADER.pack(len(data)) + data
        with _interrupts_deferred(), self._lock:
            if self._frame_lock is not None:
                fcntl.lockf(self._frame_lock, fcntl.LOCK_EX)
            try:
                view = memoryview(frame)
                while view:
                    written = os.write(self.write_fd, view)
                    view = view[written:]
            finally:
                if self._frame_lock is not None:
                    fcntl.lockf(self._frame_lock, fcntl.LOCK_UN)

    def stop_sending(self) -> None:
        """Wait for a frame another thread is writing, and let no thread start
        one: for a process about to exit, which would otherwise leave half a
        frame in the pipe (the host then sees a broken protocol)."""
        self._lock.acquire()

    def resume_sending(self) -> None:
        """Undo ``stop_sending``: the process did not exit after all (it holds
        the state again, its successor having died before taking over)."""
        self._lock.release()

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self.read_fd, min(n, 1 << 20))
            if not chunk:
                raise ChannelClosed("host closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict[str, Any]:
        """The next frame. A reader that took over from one that died (a
        holder killed while idle) may find the dead one read a frame's
        header and not its body: a reader is woken by a frame, and a kill
        pending then lands as its first read returns (2 of 24 holders killed
        as a frame came died there, and the next reader took the body for a
        header). A body begins with ``{``, which no header can (its length
        would be over MAX_FRAME): the body is then read to the end of its
        JSON object."""
        head = self._read_exact(HEADER.size)
        if head[:1] == b"{":
            return _loads(self._read_object(head))
        (length,) = HEADER.unpack(head)
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit")
        return _loads(self._read_exact(length))

    def _read_object(self, start: bytes) -> bytes:
        """Read on from ``start`` to the end of the JSON object it begins,
        a byte at a time (nothing of the next frame may be taken)."""
        data = bytearray()
        depth, in_string, escaped = 0, False, False
        pending = memoryview(start)
        while True:
            if not pending:
                if len(data) > MAX_FRAME:
                    raise ValueError("a frame's body is over the limit")
                pending = memoryview(self._read_exact(1))
            byte, pending = pending[0], pending[1:]
            data.append(byte)
            if in_string:
                escaped, in_string = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
            elif byte == 0x22:
                in_string = True
            elif byte in (0x7B, 0x5B):
                depth += 1
            elif byte in (0x7D, 0x5D):
                depth -= 1
                if depth == 0:
                    if pending:
                        raise ValueError("a frame's body is shorter than its first bytes")
                    return bytes(data)


def _loads(body: bytes) -> dict[str, Any]:
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise ValueError("message is not a JSON object")
    return msg


def _rough_size(msg: dict[str, Any]) -> int:
    """Size of a message's payload without serialising it (strings only)."""
    size = 0
    for value in msg.values():
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, dict):
            size += sum(len(v) for v in value.values() if isinstance(v, str))
    return size
