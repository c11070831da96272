"""Cells and the asyncio event loop, as in ipykernel (real bwrap, through jupyter_client).

ipykernel runs every cell inside its running event loop: a sync cell finds it
(``asyncio.get_running_loop()``, ``create_task``), tasks a cell starts run on
between cells, and a later cell can ``await`` them. The sandbox used to run
``await`` cells on IPython's runner: a sync cell found no running loop, a
task from an earlier cell belonged to another loop, and an interrupted
``await`` stayed pending, so the rest of the interrupted cell ran later in
another cell. (``tests/test_notebook_parity.py`` compares such a notebook's
outputs with ipykernel's.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, iopub_until_idle, ok


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path, "--SandboxKernel.cell_timeout=8")
    yield handle
    handle.shutdown()


TICKER = (
    "import asyncio, os\n"
    "ticks = 0\n"
    "async def tick():\n"
    "    global ticks\n"
    "    while True:\n"
    "        ticks += 1\n"
    "        await asyncio.sleep(0.01)\n"
    "ticker = asyncio.get_running_loop().create_task(tick())\n"
    "pid = os.getpid()"
)


@pytest.mark.timeout(120)
def test_asyncio_is_loaded_only_once_a_cell_uses_it(kernel: SandboxKernelHandle) -> None:
    """Loaded up front, asyncio (and ssl, concurrent.futures: 38 modules)
    made every process the worker forks larger. A cell that imports it and
    at once uses the running loop still finds it, as in ipykernel."""
    name = "'asyn' + 'cio'"  # a cell that says the word would be taken for an async one
    assert ok(kernel, f"import sys\nprint({name} in sys.modules)") == "False\n"
    out = ok(kernel, "import asyncio\nt = asyncio.create_task(asyncio.sleep(0.05, result=3))\nprint(t.done())")
    assert out == "False\n"
    assert ok(kernel, "print(await t)") == "3\n"


@pytest.mark.timeout(120)
def test_a_task_runs_on_between_cells_and_later_cells_await_it(kernel: SandboxKernelHandle) -> None:
    ok(kernel, TICKER)
    before = int(ok(kernel, "print(ticks)"))
    time.sleep(1.0)  # no cell runs: the task goes on all the same, as in ipykernel
    after = int(ok(kernel, "print(ticks)"))
    assert after - before > 20, (before, after)
    # cells sent back to back beside it, each in the holder, where the task is
    for _ in range(10):
        assert ok(kernel, "print(os.getpid() == pid)").strip() == "True"
    assert int(ok(kernel, "await asyncio.sleep(0.3)\nprint(ticks)")) > after + 10
    ok(kernel, "answer = asyncio.ensure_future(asyncio.sleep(0.1, result=42))")
    assert ok(kernel, "print(await answer)").strip() == "42"
    ok(kernel, "ticker.cancel()")
    frozen = int(ok(kernel, "print(ticks)"))
    time.sleep(0.3)
    assert int(ok(kernel, "print(ticks)")) == frozen
    # nothing waits on the loop any more: cells run in forked children again
    pids = {ok(kernel, "print(os.getpid())") for _ in range(3)}
    assert len(pids) == 3, pids


@pytest.mark.timeout(120)
def test_a_sync_cell_is_inside_the_loop_and_what_it_schedules_shows_in_it(kernel: SandboxKernelHandle) -> None:
    """The loop is running for a cell's synchronous code, as in ipykernel, and
    what the code scheduled or woke takes its first steps before the cell's
    idle (ipykernel runs them right after; nbclient would miss their output).
    A task prints under the cell that created it, as in ipykernel."""
    out = ok(
        kernel,
        "import asyncio\n"
        "loop = asyncio.get_running_loop()\n"
        "async def say():\n    print('task')\n"
        "asyncio.ensure_future(say())\n"
        "loop.call_soon(print, 'soon')\n"
        "print('cell', loop.is_running(), asyncio.get_event_loop() is loop)",
    )
    assert out == "cell True True\ntask\nsoon\n", out
    for code in ("loop.run_until_complete(asyncio.sleep(0))", "asyncio.run(asyncio.sleep(0))"):
        run = kernel.run(code)
        assert [e["ename"] for e in run.errors] == ["RuntimeError"], (code, run.errors)
    kc = kernel.kc
    creating = kc.execute(
        "fut = loop.create_future()\nasync def waiter():\n    print('got', await fut)\nw = asyncio.ensure_future(waiter())"
    )
    waking = kc.execute("fut.set_result(5)\nprint('set')")
    streams = [
        (m["parent_header"].get("msg_id"), m["content"]["text"])
        for m in iopub_until_idle(kc, waking)
        if m["msg_type"] == "stream"
    ]
    # the woken task ran before the idle, and printed under the cell that created it, as in ipykernel
    assert streams == [(waking, "set\n"), (creating, "got 5\n")], streams
    for _ in (creating, waking):
        kc.get_shell_msg(timeout=30)
    assert ok(kernel, "print(w.done())") == "True\n"


@pytest.mark.timeout(120)
def test_an_interrupted_await_never_resumes_in_a_later_cell(kernel: SandboxKernelHandle) -> None:
    ok(kernel, "import asyncio\nkept = 1")
    msg_id = kernel.kc.execute("kept = 2\nawait asyncio.sleep(2)\nprint('resumed')\nkept = 3")
    time.sleep(1.0)
    kernel.km.interrupt_kernel()
    errors = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            errors.append(msg["content"]["ename"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert errors == ["CancelledError"], errors  # what ipykernel shows
    # the loop runs for longer than the interrupted sleep had left: nothing of it comes back
    out = ok(kernel, "await asyncio.sleep(1.5)\nprint(kept)")
    assert out == "2\n", out


@pytest.mark.timeout(120)
def test_a_request_that_dies_beside_a_task_keeps_the_state_and_the_task(kernel: SandboxKernelHandle) -> None:
    ok(kernel, TICKER + "\ngenerator = (i for i in range(10)); next(generator)")  # cannot be pickled
    ok(kernel, "kept = 5")
    died = kernel.run("kept = 6\nos._exit(3)")
    assert died.status == "error" and died.errors[0]["ename"] == "CellDied", died.errors
    assert "exited with code 3" in died.errors[0]["evalue"]
    assert ok(kernel, "print(kept, next(generator), ticker.done())").strip() == "5 1 False"
    # the backup's copy of the task goes on where it was
    before = int(ok(kernel, "print(ticks)"))
    time.sleep(0.5)
    assert int(ok(kernel, "print(ticks)")) > before + 10


@pytest.mark.timeout(120)
def test_a_reader_a_dead_cell_registered_does_not_make_later_loops_spin(kernel: SandboxKernelHandle) -> None:
    """A forked process that runs the loop gets an epoll instance of its own.
    They used to share the holder's: a reader a cell registered there outlived
    the cell when its process died, and a pipe with data nobody reads woke
    every later loop at once, for ever (a busy loop during each ``await``)."""
    ok(kernel, "import asyncio, os, time\nr, w = os.pipe()\nos.write(w, b'x')")
    died = kernel.run("asyncio.get_running_loop().add_reader(r, lambda: None)\nawait asyncio.sleep(0)\nos._exit(1)")
    assert died.errors[0]["ename"] == "CellDied", died.errors
    out = ok(kernel, "cpu = time.process_time()\nawait asyncio.sleep(0.5)\nprint(time.process_time() - cpu)")
    assert float(out) < 0.25, out
