"""Memory every process of the worker's tree shares: a memfd made before the first fork.

The frame lock (``channel``), the anchor's table of deaths (``deaths``) and
the note of a request taken but not passed on (``inflight``) each live in
one; forked processes inherit the descriptor, and ``pread``/``pwrite`` or
``lockf`` on it reach the same pages from all of them.
"""

from __future__ import annotations

import os


def shared_memory(name: str, size: int = 0) -> int | None:
    """A memfd of ``size`` bytes named ``sandbox-kernel-<name>`` (closed on
    exec), or None where none can be had (no memfd, or a full fd table): each
    user then does without what it is for, as its docstring says."""
    try:
        fd = os.memfd_create(f"sandbox-kernel-{name}", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    if size:
        try:
            os.ftruncate(fd, size)
        except OSError:
            os.close(fd)
            return None
    return fd
