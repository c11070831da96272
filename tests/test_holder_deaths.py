"""The process that holds a session's state killed at the worst moments (real bwrap).

Guarantee 4: a kill loses no state of earlier cells and leaves the kernel
serving. Each cell runs in a process forked from the holder of the last good
state, and takes over as the holder when it ends well. These tests kill the
holder where nothing watched it before:
- between cells, from a process a cell started (``kill -9 $PPID``): its standby,
  a copy forked after the last cell, takes over;
- while a cell runs, from the cell itself: the cell's process takes over and
  still says the cell ended;
- the cell's process right after its cell, before it forked its own standby
  (an at-fork hook of the cell): the old holder keeps the state from before.
Before, in each case the sandbox was replaced, and without a checkpoint every
variable was gone. Each test holds a generator, which no checkpoint can carry:
if it goes on, the state is the live one, not a replacement sandbox's.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, iopub_until, is_idle, ok

from sandbox_kernel.worker.channel import Channel

KEEP = "import os, signal\nkept = 41\ngenerator = (i for i in range(100)); next(generator)\n"
#: an executor whose thread lives on after the cell: later cells run in the holder, beside it
POOL = (
    "from concurrent.futures import ThreadPoolExecutor\n"
    "pool = ThreadPoolExecutor(1, thread_name_prefix='pool-of-cell')\npool.submit(abs, 0).result()\n"
)
#: what a death of the holder beside that thread says
POOL_ENDED = "the threads earlier cells started ended with it (pool-of-cell_0)"


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path, "--SandboxKernel.cell_timeout=30")
    yield handle
    handle.shutdown()


def _stderr_under(messages: list[dict[str, Any]], msg_id: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == "stderr" and m["parent_header"].get("msg_id") == msg_id
    )


def _sandbox_pids(kernel: SandboxKernelHandle) -> set[int]:
    return {p.pid for p in kernel.sandboxes()}


@pytest.mark.timeout(240)
def test_the_holder_killed_between_cells_by_a_process_its_cell_started(kernel: SandboxKernelHandle) -> None:
    ok(kernel, KEEP)
    sandboxes = _sandbox_pids(kernel)
    for round_ in range(3):  # (a kill as a frame came in splits it: seen about once in 24)
        # the process kills its parent, the cell's process, once told to:
        # after the cell ended, when that process holds the state
        go = f"go-{round_}"
        msg_id = kernel.kc.execute(
            "import subprocess\n"
            f"subprocess.Popen(['sh', '-c', 'while [ ! -e /workspace/{go} ]; do sleep 0.02; done; kill -9 $PPID'], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
        )
        messages = iopub_until(kernel.kc, lambda got, msg_id=msg_id: any(is_idle(m, msg_id) for m in got))
        (kernel.workspace / go).touch()
        messages += iopub_until(
            kernel.kc, lambda got, msg_id=msg_id: "between cells" in _stderr_under(got, msg_id), timeout=30
        )
        note = _stderr_under(messages, msg_id)
        assert "The process that held the session's state was killed by SIGKILL between cells" in note, note
        assert "every variable is kept" in note, note
        assert ok(kernel, "print(kept, next(generator))").strip() == f"41 {round_ + 1}"
    assert _sandbox_pids(kernel) == sandboxes  # the same sandbox all along


@pytest.mark.timeout(240)
def test_the_holder_killed_by_the_cell_it_runs(kernel: SandboxKernelHandle) -> None:
    ok(kernel, KEEP)
    sandboxes = _sandbox_pids(kernel)
    run = kernel.run("changed = 7\nos.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(0.3)\nprint('done')")
    assert run.status == "ok", run.errors
    assert run.stdout == "done\n"
    assert "The process that held the session's state was killed by SIGKILL while this cell ran" in run.stderr
    # the cell's own changes are kept: its process holds the state
    assert ok(kernel, "print(kept, changed, next(generator))").strip() == "41 7 1"
    assert ok(kernel, "print(next(generator))").strip() == "2"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
def test_the_holder_killed_during_a_completion_still_answers_it(kernel: SandboxKernelHandle) -> None:
    """A completion runs in a child of the holder; a completer a cell
    registered kills the holder from there. The standby takes over, and the
    completion's child answers the request itself (the host would otherwise
    wait 30 s, then replace the sandbox)."""
    ok(
        kernel,
        KEEP + "def deadly(text):\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    return ['zz_answer_of_the_dead']\n"
        "get_ipython().Completer.custom_matchers.append(deadly)\n",
    )
    sandboxes = _sandbox_pids(kernel)
    reply = kernel.kc.complete("zz_", 3, reply=True, timeout=20)["content"]
    assert reply["status"] == "ok" and "zz_answer_of_the_dead" in reply["matches"], reply
    assert ok(kernel, "print(kept, next(generator))").strip() == "41 1"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
def test_a_cells_process_killed_before_it_took_over_leaves_the_state_from_before_it(
    kernel: SandboxKernelHandle,
) -> None:
    ok(kernel, KEEP)
    sandboxes = _sandbox_pids(kernel)
    # its process dies at its first fork, that of its own standby, after the
    # cell was reported as ended well
    msg_id = kernel.kc.execute(
        "changed = 7\nnext(generator)\nos.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGKILL))"
    )
    messages = iopub_until(kernel.kc, lambda got: "what this cell changed is lost" in _stderr_under(got, msg_id))
    note = _stderr_under(messages, msg_id)
    assert "This cell's process was killed by SIGKILL right after the cell ended" in note, note
    assert ok(kernel, "print(kept, 'changed' in globals(), next(generator))").strip() == "41 False 1"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
def test_beside_threads_the_backup_keeps_the_state_from_before_a_cell_whose_process_died_after_it(
    kernel: SandboxKernelHandle,
) -> None:
    """With threads of earlier cells alive, a cell runs in the holder itself
    and a forked backup keeps the state from before it: the backup holds it
    again when the holder dies after the cell, before its next backup."""
    ok(
        kernel,
        KEEP + POOL,
    )
    msg_id = kernel.kc.execute("changed = 7\nos.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGKILL))")
    messages = iopub_until(kernel.kc, lambda got: "what this cell changed is lost" in _stderr_under(got, msg_id))
    note = _stderr_under(messages, msg_id)
    assert POOL_ENDED in note, note
    assert ok(kernel, "print(kept, 'changed' in globals(), next(generator))").strip() == "41 False 1"


@pytest.mark.timeout(240)
def test_beside_threads_a_cell_that_kills_its_backup_ends_well_and_loses_nothing(kernel: SandboxKernelHandle) -> None:
    """The backup watches a request that runs in the holder, and reports its
    end. Killed by the cell (its parent's children, read in /proc), it cannot:
    the holder says the request ended itself. Before, the holder failed to
    report to it, and died with every variable and thread."""
    ok(
        kernel,
        KEEP + POOL,
    )
    sandboxes = _sandbox_pids(kernel)
    run = kernel.run(
        "changed = 7\n"
        "backups = open(f'/proc/{os.getpid()}/task/{os.getpid()}/children').read().split()\n"
        "for pid in backups:\n"
        "    os.kill(int(pid), signal.SIGKILL)\n"
        "print(len(backups))"
    )
    assert run.status == "ok", run.errors
    assert run.stdout == "1\n"
    assert "[sandbox_kernel]" not in run.stderr, run.stderr  # nothing was lost
    assert ok(kernel, "print(kept, changed, next(generator), pool.submit(abs, -3).result())").strip() == "41 7 1 3"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
def test_a_holder_that_cannot_go_on_ends_the_sandbox_once(kernel: SandboxKernelHandle) -> None:
    """A holder whose own code fails (here: a cell broke the host's channel
    in its process, which holds the state after it) must not hand over to
    its standby, which would fail the same way, and the next one after it,
    for ever: the sandbox is replaced once, from the checkpoint."""
    ok(kernel, "kept = 41")
    time.sleep(1.5)  # the checkpoint after it
    run = kernel.run(
        "import sandbox_kernel_worker.comms as comms\n"
        "def broken():\n"
        "    raise ValueError('broken on purpose')\n"
        "comms._channel.recv = broken"
    )
    assert run.status == "ok", run.errors
    # the next request finds the sandbox ended by that holder at once (the
    # standbys taking over one after the other never answered: the host
    # killed the sandbox once the cell timed out, 30 s later)
    after = kernel.run("print(kept)", timeout=60)
    assert after.status == "error" and after.errors[0]["ename"] == "CellDied", after.errors
    assert "the sandbox closed its channel" in after.errors[0]["evalue"], after.errors
    assert ok(kernel, "print(kept)").strip() == "41"  # from the checkpoint, in a new sandbox


@pytest.mark.timeout(240)
def test_a_cells_process_whose_own_code_fails_ends_alone(kernel: SandboxKernelHandle) -> None:
    """The other side of the test above: a cell's process, not yet the
    holder, that fails in the worker's code (here: a cell broke how it
    reports) dies alone, as a cell that crashed, and the holder goes on."""
    ok(kernel, KEEP)
    sandboxes = _sandbox_pids(kernel)
    run = kernel.run(
        "import sandbox_kernel_worker.main as main\n"
        "def broken(*args, **kwargs):\n"
        "    raise ValueError('broken on purpose')\n"
        "main.Holder._finish_child = broken\n"
        "changed = 7"
    )
    assert run.status == "error" and run.errors[0]["ename"] == "CellDied", run.errors
    assert "exited with code 1" in run.errors[0]["evalue"], run.errors
    assert ok(kernel, "print(kept, 'changed' in globals(), next(generator))").strip() == "41 False 1"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
def test_a_request_passed_to_a_backup_that_looked_only_after_the_holder_died(kernel: SandboxKernelHandle) -> None:
    """Beside threads the request runs in the holder and its backup watches
    it. Found in CI (2 cores, cells back to back): the backup had not run yet
    when the holder passed it the request and died of it, so it saw a holder
    dead *between* cells, took over, and left the request in its pipe; the
    host waited for the cell timeout and replaced the sandbox. A hook of an
    earlier cell delays the backup here, as a busy machine did."""
    ok(
        kernel,
        KEEP + POOL + "import time\nslow = [1]\nos.register_at_fork(after_in_child=lambda: slow and time.sleep(1.5))",
    )
    sandboxes = _sandbox_pids(kernel)
    died = kernel.run("kept = 6\nos._exit(3)")  # sent at once: the backup sleeps in the hook
    assert died.status == "error" and died.errors[0]["ename"] == "CellDied", died.errors
    assert f"exited with code 3; {POOL_ENDED}" in died.errors[0]["evalue"], died.errors
    assert ok(kernel, "slow.clear()\nprint(kept, next(generator))").strip() == "41 1"
    assert _sandbox_pids(kernel) == sandboxes


BACKUP_STOPPER = (
    "import os, signal, time\n"
    "holder, me = os.getppid(), os.getpid()\n"
    "def children():\n"
    "    return set(open(f'/proc/{holder}/task/{holder}/children').read().split()) - {str(me)}\n"
    "before = children()\n"  # the backup of the cell that started this process
    "while not children() - before:\n"
    "    time.sleep(0.01)\n"
    "backup = int((children() - before).pop())\n"
    "time.sleep(0.3)\n"  # it waits for the request by now
    "os.kill(backup, signal.SIGSTOP)\n"
    "open('/workspace/stopped', 'w').close()\n"
    "while os.getppid() == holder:\n"
    "    time.sleep(0.01)\n"
    "time.sleep(0.5)\n"  # the anchor reaped the holder by now
    "os.kill(backup, signal.SIGCONT)\n"
)


@pytest.mark.timeout(240)
def test_a_backup_stopped_until_its_holder_was_reaped_still_reports_the_request(kernel: SandboxKernelHandle) -> None:
    """A process a cell started stops the next cell's backup before the
    holder passes it the request, and lets it go on once the holder died of
    the request and was reaped: the backup can no longer open a pidfd on it,
    and the process the request forked keeps copies of the holder's pipes
    open, so no end of file comes. Before, the backup asked waitpid about
    the holder, not its child, and took the error for a failed fork: the
    request was never answered."""
    ok(
        kernel,
        KEEP + POOL + f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {BACKUP_STOPPER!r}])",
    )
    sandboxes = _sandbox_pids(kernel)
    deadline = time.monotonic() + 30
    while not (kernel.workspace / "stopped").exists():
        assert time.monotonic() < deadline, "the backup was never stopped"
        time.sleep(0.02)
    died = kernel.run("if os.fork() == 0:\n    time.sleep(5)\n    os._exit(0)\nkept = 6\nos._exit(3)")
    assert died.status == "error" and died.errors[0]["ename"] == "CellDied", died.errors
    assert f"exited with code 3; {POOL_ENDED}" in died.errors[0]["evalue"], died.errors
    assert ok(kernel, "print(kept, next(generator))").strip() == "41 1"
    assert _sandbox_pids(kernel) == sandboxes


HOLDER_KILLER = (
    "import os, time\n"
    "holder, me = os.getppid(), os.getpid()\n"
    "def others():\n"
    "    return [p for p in open(f'/proc/{holder}/task/{holder}/children').read().split() if int(p) != me]\n"
    "while not others():\n"
    "    time.sleep(0.01)\n"
    "time.sleep(1.0)\n"  # the request, sent at once, was passed by now
    "os.kill(holder, 9)\n"
)


@pytest.mark.timeout(240)
def test_a_request_passed_to_a_standby_that_looked_only_after_the_holder_died(kernel: SandboxKernelHandle) -> None:
    """The holder passes the request to its standby, which has not run yet
    (a hook of an earlier cell delays it, as a busy machine may), and is
    killed by a process a cell started. The standby must run the request,
    not take over as if the holder had died between cells and leave the
    request unanswered."""
    ok(
        kernel,
        KEEP + "import subprocess, sys, time\n"
        "slow = [1]\nos.register_at_fork(after_in_child=lambda: slow and time.sleep(3))\n"
        f"subprocess.Popen([sys.executable, '-c', {HOLDER_KILLER!r}])",
    )
    sandboxes = _sandbox_pids(kernel)
    run = kernel.run("slow.clear()\nchanged = 7\nprint(next(generator))")
    assert run.status == "ok", run.errors
    assert run.stdout == "1\n"
    assert "was killed by SIGKILL" in run.stderr, run.stderr
    assert ok(kernel, "print(kept, changed, next(generator))").strip() == "41 7 2"
    assert _sandbox_pids(kernel) == sandboxes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("threads", [False, True], ids=["standby", "backup beside threads"])
def test_a_request_the_holder_took_and_died_with_is_reported(kernel: SandboxKernelHandle, threads: bool) -> None:
    """The holder reads a request from the host's channel and passes it on;
    killed in between (a process a cell started, the OOM killer), it takes
    the request with it. Here the cell makes its process, the next holder,
    kill itself right after taking the next request. The standby (beside
    threads, the backup) takes over and must end that request, which the host waits for without a limit in
    real use (no cell timeout by default): before, nothing did, and only the
    cell timeout ended it, with the sandbox replaced and every variable lost."""
    ok(
        kernel,
        KEEP + "from sandbox_kernel_worker import inflight\n"
        "holder, real = os.getpid(), inflight.taken\n"
        "def taken(op, request_id):\n"
        "    real(op, request_id)\n"
        "    if os.getpid() == holder:\n"
        "        os.kill(holder, signal.SIGKILL)\n"
        "inflight.taken = taken\n" + (POOL if threads else ""),
    )
    sandboxes = _sandbox_pids(kernel)
    lost = kernel.run("changed = 7")
    assert lost.status == "error" and lost.errors[0]["ename"] == "CellDied", lost.errors
    said = lost.errors[0]["evalue"]
    assert "was killed by SIGKILL as it took this request, before it ran" in said, lost.errors
    assert (POOL_ENDED in said) == threads, said
    assert ok(kernel, "print(kept, 'changed' in globals(), next(generator))").strip() == "41 False 1"
    assert _sandbox_pids(kernel) == sandboxes


def _pipe_channel() -> tuple[Channel, int]:
    read_fd, write_fd = os.pipe()
    return Channel(read_fd, write_fd), write_fd


def test_a_reader_after_a_dead_one_reads_the_frame_whose_header_it_took() -> None:
    """The frame reader of the worker (a real pipe): a holder killed between
    a frame's header and its body leaves the body to the next reader, which
    must read it whole and stop at its end, whatever its strings hold."""
    channel, write_fd = _pipe_channel()
    first = {"op": "execute", "code": 'print("{[}]\\"\\\\", "é ☃")', "nested": [1, {"a": "}"}]}
    second = {"op": "checkpoint", "id": "c1"}
    for msg in (first, second):
        body = json.dumps(msg, ensure_ascii=False).encode()
        os.write(write_fd, struct.pack(">I", len(body)) + body)
    assert len(os.read(channel.read_fd, 4)) == 4  # the dead reader's
    assert channel.recv() == first
    assert channel.recv() == second
    os.close(write_fd)
    os.close(channel.read_fd)


def test_a_frame_that_is_neither_a_header_nor_a_body_is_refused() -> None:
    channel, write_fd = _pipe_channel()
    os.write(write_fd, b"\x7f\x00\x00\x01junk")
    with pytest.raises(ValueError, match="over the limit"):
        channel.recv()
    os.close(write_fd)
    os.close(channel.read_fd)
