"""A kernel that dies (SIGKILL, OOM) is resumed by the next kernel of its session
from the last checkpoint, and says from which cell; a clean restart starts afresh,
as ipykernel's does."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import psutil
from kernel_helpers import SandboxKernelHandle, require_bwrap


def _kernel(tmp_path: Path, session: str, name: str = "k") -> SandboxKernelHandle:
    require_bwrap()
    for sub in (f"{name}-ws", f"{name}-tmp"):
        (tmp_path / sub).mkdir(exist_ok=True)
    return SandboxKernelHandle(
        tmp_path / f"{name}-ws",
        tmp_path / f"{name}-tmp",
        extra_args=[
            "--SandboxKernel.backend=bwrap",
            "--SandboxKernel.user_id=tester",
            f"--SandboxKernel.session_id={session}",
        ],
        env={"SANDBOX_KERNEL_DATA_DIR": str(tmp_path / "data")},
    )


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the kernel did not die"
        time.sleep(0.05)


def test_a_kernel_killed_during_a_cell_is_resumed_and_says_from_which_cell(tmp_path: Path) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    k = _kernel(tmp_path, session)
    try:
        assert k.run("import math\nx = 41\ndef double(v):\n    return 2 * v").status == "ok"
        assert k.run("y = [1, 2, 3]").status == "ok"
        time.sleep(1.5)  # the background checkpoint after an idle moment
        state = tmp_path / "data" / "state" / "tester" / session
        assert (state / "sandbox" / "checkpoint.json").exists() and (state / "replay.json").exists()
        k.kc.execute("z = 'lost'\nimport time\ntime.sleep(60)")  # killed during this cell
        time.sleep(1)
        _kill(k.pid)
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=60)
        run = k.run("print(x + 1, double(2), math.floor(2.5), y)")
        assert run.stdout.strip() == "42 4 2 [1, 2, 3]", (run.stdout, run.stderr)
        assert "the previous kernel of this session stopped without shutting down" in run.stderr
        assert "checkpoint taken after cell [2]" in run.stderr
        assert k.run("print('z' in dir())").stdout.strip() == "False"  # the cell that was running is gone
        # a clean restart (what Lab's "Restart Kernel" sends) starts afresh, as in ipykernel
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        run = k.run("x", stop_on_error=False)
        assert run.status == "error" and run.reply["ename"] == "NameError"
        assert "stopped without shutting down" not in run.stderr
    finally:
        k.shutdown()
    assert not (tmp_path / "data" / "state" / "tester" / session).exists(), "a clean shutdown leaves no state"


def test_two_live_kernels_of_one_session_do_not_share_checkpoints(tmp_path: Path) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    a = _kernel(tmp_path, session, "a")
    b = _kernel(tmp_path, session, "b")
    try:
        assert a.run("v = 'a'").status == "ok"
        assert b.run("v = 'b'").status == "ok"
        time.sleep(1.5)
        assert a.run("print(v)").stdout.strip() == "a"
        assert b.run("print(v)").stdout.strip() == "b"
    finally:
        a.shutdown()
        b.shutdown()
