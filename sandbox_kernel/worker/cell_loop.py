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
one), and every request runs inside it (``run_cell``, ``call``): a cell with
a top-level ``await`` in the running loop, synchronous code in the loop as
marked running (``_seemingly_running``). An
interrupted ``await`` is cancelled, as in ipykernel. While tasks are pending
between requests, the worker runs requests in the holder and runs the loop
there while idle (``busy``, ``run_until_readable``), as it does for threads
of cells: a forked child would find the tasks frozen.

A forked process that runs the loop gets an epoll instance of its own
(``_own_selector``): the holder and its children shared one, and what a cell
registered there outlived it in the others' (a level-triggered event nobody
reads makes a loop spin).

asyncio itself is imported only once a cell needs it (``call``): with it,
ssl and concurrent.futures came 38 modules that made every process the
worker forks larger, and every fork and exit slower.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, TypeVar

from . import interrupts

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

#: how long an abandoned request's task may take to end once cancelled
CANCEL_GRACE = 1.0

_loop: asyncio.AbstractEventLoop | None = None
#: the process whose epoll instance the loop's selector is
_selector_pid = 0


def loop() -> asyncio.AbstractEventLoop:
    """The loop requests run in: IPython's (its runner and magics use the same)."""
    global _loop, _selector_pid
    if _loop is None or _loop.is_closed():
        import asyncio

        from IPython.core.async_helpers import get_asyncio_loop

        _loop = get_asyncio_loop()
        _selector_pid = os.getpid()
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


def _run(awaitable: Any) -> Any:
    """Run the loop until ``awaitable`` (a coroutine or a future) is done."""
    import asyncio

    current = loop()
    _own_selector(current)
    task = asyncio.ensure_future(awaitable, loop=current)
    try:
        return current.run_until_complete(task)
    finally:
        _finish(task)


#: while a request's synchronous code runs with the loop marked running: what
#: to put back after (the running loop before, the loop's own thread mark)
_marked: tuple[Any, Any] | None = None
#: a request's synchronous code is running (``call``)
_in_request = False


def _mark_running() -> None:
    """Mark the loop running, for synchronous code, without running it.

    In ipykernel a cell's synchronous code runs inside one of the loop's
    callbacks: ``get_running_loop()``, ``create_task()`` and ``ensure_future()``
    find the loop, ``is_running()`` is true, and ``asyncio.run()`` and
    ``run_until_complete()`` refuse. Marking the loop running gives all of
    that; actually running it cost a request's process 0.6 ms and 100
    copy-on-write faults (the loop's machinery, first touched after the
    fork). What the code schedules runs right after it (``_run_ready``),
    and later in awaits and between requests."""
    global _marked
    if _marked is not None or threading.get_ident() != threading.main_thread().ident:
        return  # (an import in a thread: the running loop is per thread)
    import asyncio

    current = loop()
    _marked = (asyncio._get_running_loop(), getattr(current, "_thread_id", None))
    asyncio._set_running_loop(current)
    current._thread_id = threading.get_ident()  # type: ignore[attr-defined]


def _unmark() -> bool:
    """Undo ``_mark_running``; whether it had been done."""
    global _marked
    if _marked is None or _loop is None:
        return False
    import asyncio

    previous, owner = _marked
    _marked = None
    _loop._thread_id = owner  # type: ignore[attr-defined]
    asyncio._set_running_loop(previous)
    return True


class _AsyncioImport:
    """A meta path finder that sees asyncio imported for the first time, during
    a request's synchronous code (``import asyncio`` then
    ``asyncio.create_task(...)`` in one cell), and marks the loop running as
    soon as the import ends. Only asyncio's spec is touched."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != "asyncio" or "asyncio" in sys.modules:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_mark(module: Any) -> None:
            exec_module(module)
            if _in_request:
                _mark_running()

        loader.exec_module = exec_then_mark  # type: ignore[union-attr, method-assign]
        return spec


def _watch_for_asyncio() -> None:
    if not any(isinstance(finder, _AsyncioImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AsyncioImport())


def _run_ready(current: asyncio.AbstractEventLoop) -> None:
    """Give what synchronous code just scheduled or woke (``create_task``, a
    future a widget's handler resolved for a task waiting on it) its first
    steps now, while the request's output still shows, as ipykernel's loop
    would right after the handler."""
    if getattr(current, "_ready", None):
        import asyncio

        _run(asyncio.sleep(0))


def call(body: Callable[[], T]) -> T:
    """Run ``body`` (a request's handling, synchronous) as ipykernel runs its
    handlers: inside the loop (``_mark_running``), once a cell has imported
    asyncio, the moment it has."""
    global _in_request
    if "asyncio" in sys.modules:
        _mark_running()
    else:
        _watch_for_asyncio()
    _in_request = True
    try:
        result = body()
    finally:
        _in_request = False
        marked = _unmark()
    if marked:
        _run_ready(loop())
    return result


def run_cell(shell: Any, code: str, store_history: bool, silent: bool) -> Any:
    """IPython's ``run_cell`` inside the loop; a cell with a top-level
    ``await`` is awaited in it, running, as ipykernel does. Returns the
    ExecutionResult, or None if the cell was stopped before its code ran."""
    # should_run_async parses the cell; only one that says await or async
    # can need it (a long cell is not transformed twice)
    if "await" in code or "async" in code:
        preprocessing_exc_tuple = None
        try:
            transformed = shell.transform_cell(code)
        except Exception:
            transformed, preprocessing_exc_tuple = code, sys.exc_info()
        if shell.should_run_async(code, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing_exc_tuple):
            return _run(_await_cell(shell, code, store_history, silent, transformed, preprocessing_exc_tuple))
    return call(lambda: shell.run_cell(code, store_history=store_history, silent=silent))


async def _await_cell(
    shell: Any, code: str, store_history: bool, silent: bool, transformed: str, preprocessing_exc_tuple: Any
) -> Any:
    import asyncio

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


def _waiting(frame: Any) -> bool:
    """Whether an interrupt came while the loop waited or ran its own code
    (not a cell's): there, a KeyboardInterrupt would leave through the loop."""
    import asyncio

    filename = getattr(getattr(frame, "f_code", None), "co_filename", "")
    return filename == selectors.__file__ or filename.startswith(os.path.dirname(asyncio.__file__))


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
            interrupts.note_raised()  # kept in case IPython's preparation swallows it
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
    import asyncio

    return bool(asyncio.all_tasks(current) or getattr(current, "_scheduled", None) or getattr(current, "_ready", None))


def run_until_readable(fd: int) -> None:
    """Run the loop (the tasks of cells, between requests) until ``fd`` has data."""
    current = loop()
    _own_selector(current)
    ready = current.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    current.add_reader(fd, wake)
    try:
        _run(ready)
    finally:
        current.remove_reader(fd)


def _own_selector(current: asyncio.AbstractEventLoop) -> None:
    """Before the loop runs in a process forked since its selector was made:
    an epoll instance of its own, with the same registrations (see the
    module's docstring). Only then, not at every fork: a request's process
    that never runs the loop (most do not) pays nothing. Synchronous code
    that registers a reader itself (``loop.add_reader``, not awaited) still
    does so in the instance it shares."""
    global _selector_pid
    if _selector_pid == os.getpid():
        return
    selector = getattr(current, "_selector", None)
    if selector is None:
        return
    fresh = type(selector)()
    for key in selector.get_map().values():
        fresh.register(key.fileobj, key.events, key.data)
    current._selector = fresh  # type: ignore[attr-defined]
    selector.close()  # this process's copy of the shared instance
    _selector_pid = os.getpid()
