"""Guarantee 4 and 6: a crash, kill, timeout or interrupt of one cell loses no
earlier state and leaves the kernel serving; nothing is left behind."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, iopub_until, require_bwrap


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_os_exit_in_a_cell_discards_only_that_cell(kernel: SandboxKernelHandle) -> None:
    kernel.run("survivor = [1, 2, 3]")
    run = kernel.run("survivor.append(4)\nimport os\nos._exit(7)")
    assert run.status == "error" and run.reply["ename"] == "CellDied"
    assert "exited with code 7" in run.reply["evalue"]
    assert kernel.run("survivor").result["text/plain"] == "[1, 2, 3]"


def test_segfault_is_reported_with_its_signal(kernel: SandboxKernelHandle) -> None:
    kernel.run("before_crash = 'ok'")
    run = kernel.run("import ctypes\nctypes.string_at(0)")
    assert run.status == "error" and "SIGSEGV" in run.reply["evalue"]
    assert kernel.run("before_crash").result["text/plain"] == "'ok'"


def wait_for_stdout(kernel: SandboxKernelHandle, msg_id: str, text: str, timeout: float = 30) -> None:
    def printed(got: list[dict[str, Any]]) -> bool:
        return any(
            m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream" and text in m["content"]["text"]
            for m in got
        )

    iopub_until(kernel.kc, printed, timeout)


def test_interrupt_raises_keyboardinterrupt_and_keeps_state(kernel: SandboxKernelHandle) -> None:
    kernel.run("counter = 0")
    msg_id = kernel.kc.execute("import time\ncounter = 1\nprint('looping')\nwhile True:\n    time.sleep(0.05)")
    wait_for_stdout(kernel, msg_id, "looping")  # the cell runs: the interrupt is for it
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=20)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # a cell that raised keeps its side effects, as in IPython
    assert kernel.run("counter").result["text/plain"] == "1"


def test_an_interrupt_while_the_sandbox_restores_stops_the_waiting_cell(tmp_path: Path) -> None:
    """The cell showed as running while its new sandbox replayed state: the
    interrupt was dropped and the cell ran on (a cell with no end needed a
    second press); it is now stopped before it runs, and the state is kept."""
    handle = bwrap_kernel(tmp_path)
    try:
        handle.run("kept = 'yes'")
        handle.run("class Slow:\n    import time\n    time.sleep(4)")  # replayed: a restore takes 4 s
        time.sleep(2.0)  # let the background checkpoint land
        handle.kill_sandboxes()
        msg_id = handle.kc.execute("ran = True")
        time.sleep(1.0)
        handle.km.interrupt_kernel()
        reply = handle.kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert "none of it ran" in reply["content"]["traceback"][-1]
        assert handle.run("'ran' in dir(), kept").result["text/plain"] == "(False, 'yes')"
    finally:
        handle.shutdown()


def test_interrupt_escalates_to_kill_for_a_stubborn_cell(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.interrupt_grace=1"])
    try:
        handle.run("kept = 'yes'")
        handle.kc.execute(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nkept = 'no'\ntime.sleep(600)"
        )
        time.sleep(1.0)
        handle.km.interrupt_kernel()
        reply = handle.kc.get_shell_msg(timeout=30)["content"]
        assert reply["ename"] == "CellDied"
        assert "did not stop" in reply["evalue"]
        assert handle.run("kept").result["text/plain"] == "'yes'"
    finally:
        handle.shutdown()


def test_cell_timeout_kills_the_cell_and_keeps_state(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.cell_timeout=2"])
    try:
        handle.run("value = 10")
        started = time.monotonic()
        run = handle.run("value = 11\nwhile True:\n    pass")
        assert run.status == "error" and "timed out after 2 s" in run.reply["evalue"]
        assert time.monotonic() - started < 20
        assert handle.run("value").result["text/plain"] == "10"
    finally:
        handle.shutdown()


def test_memory_hog_dies_alone(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(
        tmp_path / "ws", tmp_path / "tmp", extra_args=[f"--SandboxKernel.memory_limit={2 << 30}"]
    )
    try:
        handle.run("small = list(range(10))")
        run = handle.run("big = bytearray(3 << 30)")
        assert run.status == "error" and run.reply["ename"] == "MemoryError"
        assert handle.run("len(small)").result["text/plain"] == "10"
    finally:
        handle.shutdown()


def test_sandbox_killed_from_outside_resumes_from_checkpoint(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    setup = (
        "import json, threading\n"
        "data = {'rows': [1, 2, 3]}\n"
        "def total(d):\n    return sum(d['rows'])\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        "p = Point(5)\n"
        "handle = open('/workspace/notes.txt', 'w')\n"
        "lock = threading.Lock()\n"
        "gen = (i for i in range(3))\n"
        "square = lambda v: v * v\n"
        "list = [9, 8]  # shadows a builtin: must be kept\n"
        "import random\n"
        "random.seed(11)\n"
    )
    assert k.run(setup).status == "ok"
    time.sleep(2.0)  # let the background checkpoint land
    assert k.kill_sandboxes() >= 1
    run = k.run("print(total(data), p.x, isinstance(p, Point), square(3), list, json.dumps([1]), random.random())")
    assert run.status == "ok", run.reply
    # a seeded random module draws on from where it was, as the namespace does
    assert f"6 5 True 9 [9, 8] [1] {random.Random(11).random()}" in run.stdout
    notice = run.stderr
    assert "sandbox was replaced" in notice
    assert "checkpoint taken after cell [1]" in notice
    for name, hint in (("handle", "file"), ("lock", "lock"), ("gen", "generator")):
        assert name in notice and hint in notice.split(name, 1)[1], notice


def _holders(k: SandboxKernelHandle) -> list[psutil.Process]:
    """The worker's state holder: the anchor's child (the anchor, the worker's
    first process, is bwrap's child)."""

    def is_python(p: psutil.Process) -> bool:
        return "python" in p.name()

    return [
        p
        for p in k.descendants()
        if is_python(p)
        and (parent := p.parent()) is not None
        and is_python(parent)
        and (grand := parent.parent()) is not None
        and not is_python(grand)
    ]


def test_state_holder_killed_from_the_host(fresh_kernel: SandboxKernelHandle) -> None:
    """SIGKILL of the worker's state holder only, from outside the sandbox
    (as the host's OOM killer would): its standby, forked after the last
    cell, takes over in the same sandbox with the live state. Killed with
    its standby, the sandbox is replaced and the state comes back from the
    checkpoint. Nothing leaks either way."""
    k = fresh_kernel
    assert k.run("x = 41\ndef answer():\n    return x + 1\ngen = (i for i in range(9))").status == "ok"
    time.sleep(1.5)  # the background checkpoint
    sandboxes = {p.pid for p in k.sandboxes()}
    holders = _holders(k)
    assert len(holders) == 1, holders
    holders[0].kill()
    psutil.wait_procs(holders, timeout=5)
    time.sleep(0.5)
    run = k.run("print(answer(), next(gen))")
    assert run.status == "ok" and run.stdout.strip() == "42 0", (run.stdout, run.stderr)
    assert "sandbox was replaced" not in run.stderr
    assert {p.pid for p in k.sandboxes()} == sandboxes
    assert not holders[0].is_running()
    # the holder and its standby together: nothing in the sandbox holds the state
    time.sleep(1.5)
    holders = _holders(k)
    assert len(holders) == 1, holders
    doomed = [*holders[0].children(), holders[0]]  # the standby first: it would take over
    for process in doomed:
        process.kill()
    psutil.wait_procs(doomed, timeout=5)
    time.sleep(0.5)
    run = k.run("print(answer())")
    assert run.status == "ok" and run.stdout.strip() == "42", (run.stdout, run.stderr)
    assert "sandbox was replaced" in run.stderr and "checkpoint taken after cell [2]" in run.stderr, run.stderr
    assert len(k.sandboxes()) >= 1 and all(p.is_running() for p in k.sandboxes())
    assert not any(p.is_running() for p in doomed)


def test_shutdown_leaves_no_process_or_temp_dir(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp)
    handle.run("import subprocess\nbg = subprocess.Popen(['sleep', '300'])\nx = 1")
    spawned = handle.descendants()
    assert handle.sandboxes()
    assert any(tmp.iterdir()), "the kernel should keep its runtime dir under TMPDIR"
    kernel_pid = handle.pid
    handle.shutdown()
    deadline = time.monotonic() + 10
    alive_now: list[psutil.Process] = []
    while time.monotonic() < deadline:
        alive_now = [p for p in spawned if alive(p)]
        if not alive_now:
            break
        time.sleep(0.2)
    assert not alive_now, alive_now
    assert not alive(psutil.Process(kernel_pid)) if psutil.pid_exists(kernel_pid) else True
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGKILL])
def test_kernel_killed_takes_its_sandbox_with_it(tmp_path: Path, signum: int) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp")
    handle.run("x = 1")
    spawned = handle.descendants()
    os.kill(handle.pid, signum)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in spawned):
        time.sleep(0.2)
    assert not [p for p in spawned if alive(p)]
    handle.kc.stop_channels()
    handle.km.cleanup_resources()
