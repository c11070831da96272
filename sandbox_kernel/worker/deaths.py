"""Exit statuses the anchor reaped, for a process that is not the dead one's parent.

When earlier cells left threads running, a request runs in the state holder
itself and a forked copy of it (the backup) watches (see
``Holder._spawn_backup``). If the holder dies, only its parent, the anchor,
can wait for it; the backup, which reports the death to the host, reads the
status here. A table of the last ``SLOTS`` deaths in shared memory, written by
the anchor alone: ``(sequence, pid, status)`` per slot, the latest sequence
number first. A pid seen only in entries older than a reader's ``mark()`` is
another process that had the same pid.
"""

from __future__ import annotations

import os
import struct
import time

from .shared_memory import shared_memory

SLOTS = 64
_HEADER = struct.Struct("<Q")
_ENTRY = struct.Struct("<Qii")
_SIZE = _HEADER.size + SLOTS * _ENTRY.size

_fd: int | None = None


def share() -> None:
    """Create the table (before the first fork; without memfd there is none,
    and a death is then reported without its cause)."""
    global _fd
    _fd = shared_memory("deaths", _SIZE)


def record(pid: int, status: int) -> None:
    """The anchor, after each wait()."""
    if _fd is None:
        return
    try:
        (seq,) = _HEADER.unpack(os.pread(_fd, _HEADER.size, 0))
        seq += 1
        os.pwrite(_fd, _ENTRY.pack(seq, pid, status), _HEADER.size + (seq % SLOTS) * _ENTRY.size)
        os.pwrite(_fd, _HEADER.pack(seq), 0)
    except (OSError, struct.error):
        pass


def mark() -> int:
    """The sequence number now: only deaths recorded after it count."""
    if _fd is None:
        return 0
    try:
        return int(_HEADER.unpack(os.pread(_fd, _HEADER.size, 0))[0])
    except (OSError, struct.error):
        return 0


def status_of(pid: int, after: int, timeout: float = 0.5) -> int | None:
    """``pid``'s wait status once the anchor has reaped it (it has exited
    when this is asked), or None if it did not within ``timeout``."""
    if _fd is None:
        return None
    deadline = time.monotonic() + timeout
    while True:
        try:
            table = os.pread(_fd, _SIZE, 0)
        except OSError:
            return None
        for slot in range(SLOTS):
            seq, dead, status = _ENTRY.unpack_from(table, _HEADER.size + slot * _ENTRY.size)
            if dead == pid and seq > after:
                return int(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.002)
