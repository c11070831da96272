"""The asyncio event loop a request's code runs in, as in ipykernel.

ipykernel runs every cell inside its own running event loop, so in a cell
``asyncio.get_running_loop()`` and ``asyncio.create_task()`` work, a task one
cell starts runs on between cells, and a later cell can ``await`` it. Run
with IPython's own runner instead, cells found no running loop ("no running
event loop"), a task made in one cell belonged to another loop than the one
the next cell's ``await`` ran ("attached to a different loop"), and an
interrupted ``await`` was left pending on the loop, so the rest of the
interrupted cell ran later, in the middle of some other cell.

Here there is one loop per process chain (IPython's, set as the current
one), and every request runs inside it (``run_cell``, ``call``). An
interrupted ``await`` is cancelled, as in ipykernel. While tasks are pending
between requests, the worker runs requests in the holder and runs the loop
there while idle (``busy``, ``run_until_readable``), as it does for threads
of cells: a forked child would find the tasks frozen.

A forked process gets an epoll instance of its own (``_own_selector``): the
holder and its children shared one, and what a cell registered there
outlived it in the others' (a level-triggered event nobody reads makes a
loop spin).
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

#: how long an abandoned request's task may take to end once cancelled
CANCEL_GRACE = 1.0

_loop: asyncio.AbstractEventLoop | None = None
_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)


def loop() -> asyncio.AbstractEventLoop:
    """The loop requests run in: IPython's (its runner and magics use the same)."""
    global _loop
    if _loop is None or _loop.is_closed():
        from IPython.core.async_helpers import get_asyncio_loop

        _loop = get_asyncio_loop()
        asyncio.set_event_loop(_loop)
    return _loop


def _finish(task: asyncio.Future[Any]) -> None:
    """End a request's task that an exception out of the loop (an interrupt
    that came while asyncio itself, or a background task, was running) left
    pending: left there, the rest of its cell would run in a later one."""
    if task.done():
        return
    task.cancel()
    current = loop()
    stop = current.call_later(CANCEL_GRACE, current.stop)
    try:
        current.run_until_complete(task)
    except BaseException:
        pass
    finally:
        stop.cancel()


def _run(coro: Any) -> Any:
    current = loop()
    task = current.create_task(coro)
    try:
        return current.run_until_complete(task)
    finally:
        _finish(task)


def call(body: Callable[[], T]) -> T:
    """Run ``body`` (a request's handling, synchronous) with the loop running,
    as ipykernel runs its handlers."""

    async def inside() -> T:
        return body()

    result: T = _run(inside())
    return result


def run_cell(shell: Any, code: str, store_history: bool, silent: bool) -> Any:
    """IPython's ``run_cell`` inside the running loop; a cell with a top-level
    ``await`` is awaited there, as ipykernel does. Returns the
    ExecutionResult, or None if the cell was stopped before its code ran."""

    async def inside() -> Any:
        # should_run_async parses the cell; only one that says await or
        # async can need it (a long cell is not transformed twice)
        if "await" in code or "async" in code:
            preprocessing_exc_tuple = None
            try:
                transformed = shell.transform_cell(code)
            except Exception:
                transformed, preprocessing_exc_tuple = code, sys.exc_info()
            if shell.should_run_async(
                code, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing_exc_tuple
            ):
                cell = asyncio.ensure_future(
                    shell.run_cell_async(
                        code,
                        store_history=store_history,
                        silent=silent,
                        transformed_cell=transformed,
                        preprocessing_exc_tuple=preprocessing_exc_tuple,
                    )
                )
                res = None
                try:
                    with _cancel_on_sigint(cell):
                        res = await cell
                except asyncio.CancelledError:
                    return None  # cancelled before its code ran
                finally:
                    shell.events.trigger("post_execute")
                    if not silent:
                        shell.events.trigger("post_run_cell", res)
                return res
        return shell.run_cell(code, store_history=store_history, silent=silent)

    return _run(inside())


def _waiting(frame: Any) -> bool:
    """Whether an interrupt came while the loop waited or ran its own code
    (not a cell's): there, a KeyboardInterrupt would leave through the loop."""
    filename = getattr(getattr(frame, "f_code", None), "co_filename", "")
    return filename == selectors.__file__ or filename.startswith(_ASYNCIO_DIR)


@contextmanager
def _cancel_on_sigint(cell: asyncio.Future[Any]) -> Iterator[None]:
    """While a cell awaits: an interrupt cancels it (its ``await`` raises
    CancelledError, shown as ipykernel shows it); one that comes while the
    cell's own code runs raises KeyboardInterrupt there, as in any cell."""
    current = loop()

    def handler(signum: int, frame: Any) -> None:
        if _waiting(frame):
            current.call_soon_threadsafe(cell.cancel)  # wakes the loop's wait too
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def busy() -> bool:
    """Whether tasks or callbacks are waiting on the loop: they go on only
    in the process that has them, so requests must run in the holder."""
    current = _loop
    if current is None or current.is_closed():
        return False
    return bool(asyncio.all_tasks(current) or getattr(current, "_scheduled", None) or getattr(current, "_ready", None))


def run_until_readable(fd: int) -> None:
    """Run the loop (the tasks of cells, between requests) until ``fd`` has data."""
    current = loop()
    ready = current.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    current.add_reader(fd, wake)
    try:
        _run(_wait(ready))
    finally:
        current.remove_reader(fd)


async def _wait(ready: asyncio.Future[None]) -> None:
    await ready


def _own_selector() -> None:
    """In a forked child: an epoll instance of its own with the same
    registrations (see the module's docstring)."""
    current = _loop
    selector = getattr(current, "_selector", None)
    if current is None or current.is_closed() or selector is None:
        return
    fresh = type(selector)()
    for key in selector.get_map().values():
        fresh.register(key.fileobj, key.events, key.data)
    current._selector = fresh  # type: ignore[attr-defined]
    selector.close()  # this process's copy of the shared instance


os.register_at_fork(after_in_child=_own_selector)
