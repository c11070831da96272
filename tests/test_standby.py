"""What the standby process does before its request arrives (the set-up and
warm-ups that keep copy-on-write faults off a cell's path) must be invisible:
no user code runs twice, output still streams, cells back to back and spaced
out give the same answers (real bwrap, through jupyter_client)."""

from __future__ import annotations

import time

from kernel_helpers import SandboxKernelHandle

COUNTING_TRANSFORMS = """
calls = {'cleanup': 0, 'line': 0, 'post': 0}
def count_cleanup(lines):
    calls['cleanup'] += 1
    return lines
def count_line(lines):
    calls['line'] += 1
    return lines
def count_post(lines):
    calls['post'] += 1
    return lines
ip = get_ipython()
ip.input_transformers_cleanup.append(count_cleanup)
ip.input_transformer_manager.line_transforms.append(count_line)
ip.input_transformers_post.append(count_post)
"""


def test_transforms_a_user_registered_run_once_per_cell(kernel: SandboxKernelHandle) -> None:
    """The standby runs IPython's own transforms on a dummy cell to warm them;
    a user's transforms are user code and must see each cell exactly once."""
    assert kernel.run(COUNTING_TRANSFORMS).status == "ok"
    before = kernel.run("print(calls['cleanup'], calls['line'], calls['post'])").stdout.split()
    for i in range(4):
        assert kernel.run(f"y = {i}").status == "ok"
        time.sleep(0.1)  # idle time: the standby does all of its warm-ups
    after = kernel.run("print(calls['cleanup'], calls['line'], calls['post'])").stdout.split()
    # five cells ran in between (four, and the one that printed)
    assert [int(a) - int(b) for a, b in zip(after, before, strict=True)] == [5, 5, 5]
    # and the registered transforms are still in place and still used
    assert (
        kernel.run(
            "count_cleanup in ip.input_transformers_cleanup and count_line in "
            "ip.input_transformer_manager.line_transforms"
        ).result["text/plain"]
        == "True"
    )


def test_a_partial_line_streams_while_the_cell_runs(kernel: SandboxKernelHandle) -> None:
    """Text without a newline is flushed by the standby's flusher thread within
    the flush interval, not held until the cell ends."""
    msg_id = kernel.kc.execute("import time\nprint('partial', end='')\ntime.sleep(1.5)\nprint(' done')")
    arrivals = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            arrivals.append((time.monotonic(), msg["content"]["text"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle_at = time.monotonic()
            break
    kernel.kc.get_shell_msg(timeout=10)
    assert "".join(t for _, t in arrivals) == "partial done\n"
    assert arrivals[0][1] == "partial"
    assert idle_at - arrivals[0][0] > 1.0  # it came while the cell slept


def test_cells_back_to_back_and_spaced_out_agree(kernel: SandboxKernelHandle) -> None:
    """Back to back, the standby skips its warm-ups (a request is waiting);
    spaced out, it runs them: either way every cell sees the last one's state,
    its own output, and nothing else."""
    assert kernel.run("n = 0").status == "ok"
    for i in range(30):
        run = kernel.run("n += 1\nprint(n)")
        assert run.status == "ok" and run.stdout == f"{i + 1}\n" and run.stderr == ""
        if i % 3 == 0:
            time.sleep(0.08)
    assert kernel.run("n").result["text/plain"] == "30"


def test_fd_output_reaches_the_right_stream_from_one_reader(kernel: SandboxKernelHandle) -> None:
    """Fds 1 and 2 are read by one thread: bytes from C code and subprocesses
    land on stdout and stderr as written, cell after cell."""
    run = kernel.run(
        "import os, subprocess\n"
        "os.write(1, b'fd-out\\n')\n"
        "os.write(2, b'fd-err\\n')\n"
        "subprocess.run(['sh', '-c', 'echo sub-out; echo sub-err 1>&2'])\n"
    )
    assert run.status == "ok"
    assert run.stdout == "fd-out\nsub-out\n"
    assert run.stderr == "fd-err\nsub-err\n"
    run = kernel.run("os.write(1, b'after\\n'); os.write(2, b'late\\n'); None")
    assert run.status == "ok"
    assert run.stdout == "after\n" and run.stderr == "late\n"
