"""The host kernel's own stdout/stderr, and the order of iopub against replies.

ipykernel flushes ``sys.stdout`` and ``sys.stderr`` twice per request (before
the reply, before the idle status) and then sleeps 0.5 ms, so that what the
cell printed in-process reaches the client before the reply. Each flush is a
round trip to the IO thread even when nothing was written, and here nothing
is: a cell's output comes from the sandbox and is published on iopub
directly. Those round trips and the sleep were about 1 ms of a 5 ms trivial
cell. :class:`HostOutStream` flushes only what was written, and
:func:`iopub_barrier` keeps the one guarantee the flushes gave: everything
published before a reply has been handed to the iopub socket before the
reply is sent. (The idle status needs no barrier: it travels the same queue
as the outputs, behind them.)
"""

from __future__ import annotations

import threading
from typing import Any

from ipykernel.iostream import OutStream

#: how long a reply waits for the IO thread (as ipykernel's own flush timeout)
BARRIER_TIMEOUT = 10.0


class HostOutStream(OutStream):
    """ipykernel's OutStream, whose flush costs nothing when nothing is pending.

    What host code writes (a library's warning) still reaches the frontend as
    before, in order: a write marks the stream pending until its flush."""

    def flush(self) -> None:
        # (an ipykernel without these flags gets its own flush, every time)
        if getattr(self, "_flush_pending", True) or getattr(self, "_subprocess_flush_pending", True):
            super().flush()  # type: ignore[no-untyped-call]


def iopub_barrier(iopub_thread: Any, timeout: float = BARRIER_TIMEOUT) -> bool:
    """Return once the IO thread has sent everything scheduled before this call
    (False if it did not answer within ``timeout`` or is not running)."""
    thread = getattr(iopub_thread, "thread", None)
    if thread is None or not thread.is_alive() or thread.ident == threading.get_ident():
        return False
    done = threading.Event()
    iopub_thread.schedule(done.set)
    return done.wait(timeout)
