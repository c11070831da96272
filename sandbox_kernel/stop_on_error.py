"""After a cell fails, abort the requests queued behind it, and only those.

ipykernel (7.4) aborts the execute requests queued behind a failed cell by
raising a flag and posting a "stop aborting" marker into the shell queue, both
*after* the error's reply is sent. A client that answers that reply at once
(nbclient or papermill with ``allow_errors``, testbook, an agent's next call)
can get its next request into the queue before the marker: that request comes
back ``aborted`` without running (ipython/ipykernel#609). Measured through
jupyter_client with the kernels logging at DEBUG (which widens the window), a
cell that raised and then ``1+1`` at once: 11 of 300 second cells aborted
here, 1 of 300 under stock ipykernel (the host's threads that serve the
sandbox make the window wider); at the default log level about 1 in 100 after
an interrupted cell.

Here the flag is raised and the marker posted, and its posting awaited, before
the reply goes out: what the client sent before it saw the error is aborted
(as Run All expects), nothing it sent after.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ipykernel.kernelbase import Kernel


class StopOnError:
    """What one kernel did ahead of the base class's abort."""

    def __init__(self) -> None:
        #: the request whose queue was already aborted before its reply
        self._done_for: str | None = None

    async def before_reply(self, kernel: Kernel, parent: dict[str, Any], reply: dict[str, Any]) -> None:
        """Abort the queue now if the base class would after ``reply``."""
        content = parent.get("content") or {}
        if reply.get("status") != "error" or content.get("silent", False) or not content.get("stop_on_error", True):
            return
        thread = getattr(kernel, "shell_channel_thread", None)
        if thread is None:  # no channel thread: the base class flushes the queue itself
            return
        header = parent.get("header") or {}
        Kernel._abort_queues(kernel, header.get("subshell_id"))
        loop = asyncio.get_running_loop()
        posted: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            if not posted.done():
                posted.set_result(None)

        # the channel thread runs its callbacks in order: this one after the marker's
        thread.io_loop.add_callback(lambda: loop.call_soon_threadsafe(done))
        await posted
        self._done_for = header.get("msg_id")

    def already_done(self, parent: dict[str, Any]) -> bool:
        """Whether the base class's abort for ``parent`` was done ahead (then
        it must not run again: its marker would come after the client's next
        request)."""
        msg_id = (parent.get("header") or {}).get("msg_id")
        done = msg_id is not None and msg_id == self._done_for
        self._done_for = None
        return done
