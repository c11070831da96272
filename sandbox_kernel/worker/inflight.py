"""The request the state holder took from the host and has not passed on yet.

The holder reads each request from the host's channel, then passes it to the
process that runs it: its standby, or its backup when it runs the request
itself. Killed in between (by a process a cell started, or the OOM killer),
it took the request with it: the copy of the state that takes over never saw
it, and the host would wait for its end for ever (there is no cell timeout by
default). So the holder notes the request here, in memory every process of
the tree shares, before it passes it on, and clears the note once it has; a
process that takes over from a dead holder finds a note left and reports that
request as ended with the holder (``Holder._take_over_from_dead_holder``).

One slot: only the holder reads the channel, one request at a time. A cell
can write here as it can write anything of the worker's (its process is the
holder's); the host matches an end to the request it waits for by id.
"""

from __future__ import annotations

import os
import struct

from .shared_memory import shared_memory

_LENGTH = struct.Struct("<H")
_MOST = 256  # bytes of op and id (the host's ids are a letter and a number)
_SIZE = _LENGTH.size + _MOST

_fd: int | None = None


def share() -> None:
    """Create the slot (before the first fork; without memfd there is none,
    and a request lost with its holder is then not reported)."""
    global _fd
    _fd = shared_memory("inflight", _SIZE)


def taken(op: str, request_id: str) -> None:
    """The holder read this request from the host's channel."""
    if _fd is None:
        return
    data = f"{op}\0{request_id}".encode("utf-8", "replace")[:_MOST]
    try:
        os.pwrite(_fd, _LENGTH.pack(len(data)) + data, 0)
    except OSError:
        pass


def passed() -> None:
    """The request noted is in the pipe of the process that runs it (or was
    answered by the holder itself)."""
    if _fd is None:
        return
    try:
        os.pwrite(_fd, _LENGTH.pack(0), 0)
    except OSError:
        pass


def left() -> tuple[str, str] | None:
    """The (op, id) of a request a dead holder took and never passed on, cleared."""
    if _fd is None:
        return None
    try:
        raw = os.pread(_fd, _SIZE, 0)
        (length,) = _LENGTH.unpack_from(raw)
    except (OSError, struct.error):
        return None
    if not 0 < length <= _MOST:
        return None
    passed()
    op, _, request_id = raw[_LENGTH.size : _LENGTH.size + length].decode("utf-8", "replace").partition("\0")
    return op, request_id
