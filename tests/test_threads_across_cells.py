"""Threads earlier cells left running, used by later cells, as in ipykernel (real bwrap).

Every cell runs in a process forked from the last good state, and threads do
not follow a fork: a ``ThreadPoolExecutor`` or ``multiprocessing.Pool`` made
in one cell was found without its threads in the next, and ``submit``/``map``
waited forever. While cells' threads are alive the request runs in the state
holder, where they are, and a forked backup keeps the state from before it.
These tests use what the threads do (executors, pools, a counter), kill the
request's process beside them (os._exit, SIGSEGV, the cell timeout), kill it
while idle from one of its own threads, interrupt it, answer input() and a
widget message through it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, ok

PROCESS_COUNT = "import os\nprint(sum(name.isdigit() for name in os.listdir('/proc')))"


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path, "--SandboxKernel.cell_timeout=8")
    yield handle
    handle.shutdown()


@pytest.mark.timeout(240)
def test_executors_pools_and_threads_made_in_one_cell_work_in_later_ones(kernel: SandboxKernelHandle) -> None:
    ok(
        kernel,
        "from concurrent.futures import ThreadPoolExecutor, ProcessPoolExecutor\n"
        "import multiprocessing, threading, time\n"
        "executor = ThreadPoolExecutor(2)\n"
        "pool = multiprocessing.get_context('fork').Pool(2)\n"
        "processes = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('fork'))\n"
        "print(executor.submit(abs, -1).result(), pool.map(abs, [-2]), processes.submit(abs, -3).result())\n"
        "ticks = []\n"
        "stop = threading.Event()\n"
        "def tick():\n"
        "    while not stop.wait(0.01):\n"
        "        ticks.append(1)\n"
        "ticker = threading.Thread(target=tick, daemon=True)\n"
        "ticker.start()\n",
    )
    before = int(ok(kernel, PROCESS_COUNT))
    for i in range(30):  # back to back, and each use in a cell of its own
        assert ok(kernel, f"print(executor.submit(abs, -{i}).result())").strip() == str(i)
    assert ok(kernel, "print(pool.map(abs, [-4, -5]))").strip() == "[4, 5]"
    assert ok(kernel, "print(processes.submit(abs, -6).result())").strip() == "6"
    # the thread went on between and during cells, in the process that runs them
    first = int(ok(kernel, "print(len(ticks))"))
    time.sleep(0.3)
    assert int(ok(kernel, "time.sleep(0.2); print(len(ticks), ticker.is_alive())").split()[0]) > first + 10
    # no process left behind by 35 cells (a backup per cell, each reaped)
    assert int(ok(kernel, PROCESS_COUNT)) <= before + 1
    # the threads end: the next cells are forked again, and still work
    ok(kernel, "stop.set(); ticker.join(); executor.shutdown(); pool.terminate(); processes.shutdown()")
    assert ok(kernel, "print(threading.active_count())").strip() == "1"
    assert ok(kernel, "print(len(ticks) > 0, ticker.is_alive())").strip() == "True False"


@pytest.mark.timeout(240)
def test_a_request_that_dies_beside_threads_keeps_the_state_before_it(kernel: SandboxKernelHandle) -> None:
    start = (
        "import threading, os, signal, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "executor = ThreadPoolExecutor(1, thread_name_prefix='worker-of-cell')\n"
        "executor.submit(abs, 0).result()\n"
        "generator = (i for i in range(10)); next(generator)\n"  # cannot be pickled: no replacement sandbox
    )
    ok(kernel, start)
    ok(kernel, "kept = 5")
    died = kernel.run("kept = 6\nos._exit(3)")
    assert died.status == "error" and died.errors[0]["ename"] == "CellDied", died.errors
    text = died.errors[0]["evalue"]
    assert "exited with code 3; the threads earlier cells started ended with it (worker-of-cell_0)" in text, text
    assert ok(kernel, "print(kept, next(generator))").strip() == "5 1"
    # the executor's thread died with that process: a new one works
    ok(kernel, start.replace("next(generator)", "next(generator); next(generator)"))
    died = kernel.run("os.kill(os.getpid(), signal.SIGSEGV)")
    assert "SIGSEGV" in died.errors[0]["evalue"], died.errors
    assert ok(kernel, "print(kept, next(generator))").strip() == "5 2"
    # the cell timeout kills the holder itself: the backup goes on
    ok(kernel, start)
    died = kernel.run("kept = 7\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)", timeout=90)
    assert died.status == "error", died.errors
    assert "timed out after 8 s and was killed; the threads earlier cells started ended" in died.errors[0]["evalue"]
    assert ok(kernel, "print(kept, next(generator), threading.active_count())", timeout=60) == "5 1 1\n"


@pytest.mark.timeout(240)
def test_the_holder_killed_by_its_own_thread_while_idle(kernel: SandboxKernelHandle) -> None:
    ok(
        kernel,
        "import os, threading\n"
        "generator = (i for i in range(10)); next(generator)\n"
        "kept = 9\n"
        "threading.Timer(0.5, os._exit, (0,)).start()\n",
    )
    time.sleep(2)
    # the backup took over with the state (a replacement sandbox could not carry the generator)
    assert ok(kernel, "print(kept, next(generator))").strip() == "9 1"


@pytest.mark.timeout(240)
def test_interrupt_input_and_widgets_beside_threads(kernel: SandboxKernelHandle) -> None:
    pytest.importorskip("ipywidgets")
    ok(
        kernel,
        "import threading, time\n"
        "stop = threading.Event()\n"
        "ticker = threading.Thread(target=stop.wait, daemon=True); ticker.start()\n"
        "kept = 1\n",
    )
    msg_id = kernel.kc.execute("kept = 2\ntime.sleep(60)")
    time.sleep(1.5)
    kernel.km.interrupt_kernel()
    deadline = time.monotonic() + 30
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "error":
            assert msg["content"]["ename"] == "KeyboardInterrupt"
            break
    kernel.kc.get_shell_msg(timeout=30)
    # as in ipykernel: the interrupted cell's changes up to the interrupt stay, and so does the thread
    assert ok(kernel, "print(kept, ticker.is_alive())").strip() == "2 True"
    answered = kernel.run("print(input('name? ') + '!')", allow_stdin=True, stdin_answers=["ada"])
    assert answered.status == "ok" and answered.stdout.strip() == "ada!", (answered.errors, answered.stdout)

    from test_widgets_kernel import comm_id_of, update

    run = kernel.run(
        "import ipywidgets\n"
        "seen = []\n"
        "slider = ipywidgets.IntSlider()\n"
        "slider.observe(lambda change: seen.append(change['new']), 'value')\n"
        "slider"
    )
    update(kernel, comm_id_of(run, "IntSliderModel"), {"value": 42})
    assert ok(kernel, "print(seen, slider.value, ticker.is_alive())").strip() == "[42] 42 True"
