"""Threads a finished cell left running go on writing while later cells run,
from another process (the holder) than the running cell's: the frames must
stay whole, and no process may inherit a lock such a thread held (real bwrap)."""

from __future__ import annotations

import pytest
from kernel_helpers import SandboxKernelHandle

BACKGROUND_WRITER = """
import sys, threading, time
bound = sys.stdout  # what a logging handler made in this cell keeps
def loop():
    while True:
        bound.write('b' * 200000 + '\\n')  # frames far over PIPE_BUF, and over the pipe's 64 KiB
        bound.flush()
        time.sleep(0.002)
threading.Thread(target=loop, daemon=True).start()
kept = 41
print('started')
"""


@pytest.mark.timeout(240)
def test_a_finished_cells_writer_thread_never_breaks_the_channel(kernel: SandboxKernelHandle) -> None:
    assert "started" in kernel.run(BACKGROUND_WRITER).stdout.split("\n")
    for i in range(40):
        # one stream message (under the worker's 256 Ki-character chunk), four times the pipe's 64 KiB
        run = kernel.run(f"print('c' * 250000)\nkept + {i}", timeout=60)
        assert run.status == "ok", run.stderr[-500:]
        assert "replaced" not in run.stderr and "protocol" not in run.stderr, run.stderr[-500:]
        assert run.result["text/plain"] == str(41 + i)  # the state of earlier cells is there
        lines = run.stdout.split("\n")
        assert "c" * 250000 in lines
        # every line is whole: the background thread's and the cell's frames never mixed
        assert all(line in ("", "c" * 250000, "b" * 200000) for line in lines), {len(x) for x in lines}
