"""What the standby process does before its request arrives (the set-up and
warm-ups that keep copy-on-write faults off a cell's path) must be invisible:
no user code runs twice, output still streams, cells back to back and spaced
out give the same answers (real bwrap, through jupyter_client)."""

from __future__ import annotations

import random
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
    kernel.stdout_of(
        "ip.input_transformers_cleanup.remove(count_cleanup)\n"
        "ip.input_transformer_manager.line_transforms.remove(count_line)\n"
        "ip.input_transformers_post.remove(count_post)",
    )


WARM_UPS = "import sys\nprint(sys.modules['sandbox_kernel_worker.warmup'].runs)"

COUNTING_EVENTS = """
seen = {'pre_execute': 0, 'pre_run_cell': 0, 'post_execute': 0, 'post_run_cell': 0, 'cleanup': 0, 'line': 0}
def counter(event):
    def count(*args):
        seen[event] += 1
    return count
ip = get_ipython()
callbacks = {event: counter(event) for event in ('pre_execute', 'pre_run_cell', 'post_execute', 'post_run_cell')}
for event, callback in callbacks.items():
    ip.events.register(event, callback)
def count_cleanup(lines):
    seen['cleanup'] += 1
    return lines
def count_line(lines):
    seen['line'] += 1
    return lines
ip.input_transformers_cleanup.append(count_cleanup)
ip.input_transformer_manager.line_transforms.append(count_line)
"""


def _spaced(kernel: SandboxKernelHandle, cells: int, first: int = 0) -> None:
    for i in range(first, first + cells):
        kernel.stdout_of(f"y = {i}")
        time.sleep(0.1)  # idle time: the standby does all of its warm-ups


def _warm_ups_over_spaced_cells(kernel: SandboxKernelHandle, cells: int) -> int:
    """How many ``run_cell`` warm-ups ran around ``cells`` spaced cells."""
    before = int(kernel.stdout_of(WARM_UPS))
    _spaced(kernel, cells)
    return int(kernel.stdout_of(WARM_UPS)) - before


def _calls_over_spaced_cells(kernel: SandboxKernelHandle, counter: str, cells: int) -> tuple[int, int]:
    """How far ``calls[counter]`` (kept by the user's code) moved over
    ``cells`` spaced cells and the two that read it, and how many warm-ups
    ran meanwhile."""
    warm_before = int(kernel.stdout_of(WARM_UPS))
    before = int(kernel.stdout_of(f"print(calls[{counter!r}])"))
    _spaced(kernel, cells)
    seen = int(kernel.stdout_of(f"print(calls[{counter!r}])")) - before
    return seen, int(kernel.stdout_of(WARM_UPS)) - warm_before


def test_the_run_cell_warm_up_runs_no_callback_and_leaves_no_trace(kernel: SandboxKernelHandle) -> None:
    """The standby runs a silent ``pass`` through the whole ``run_cell`` while
    it waits. Event callbacks and transforms a user registered must see each
    cell once, and the shell must look as if only the user's cells ran: the
    last result, the execution count, the input history, the cached sources."""
    kernel.stdout_of(COUNTING_EVENTS)
    warm_before = int(kernel.stdout_of(WARM_UPS))
    before = kernel.stdout_of("print(dict(seen))")
    _spaced(kernel, 4)
    after = kernel.stdout_of("print(dict(seen))")
    warm_after = int(kernel.stdout_of(WARM_UPS))
    assert warm_after - warm_before >= 4, "the warm-up did not run: this test would prove nothing"
    # five: the four cells, and the reads' own (what fired after the first
    # read's code and before the second's makes one cell)
    assert {k: v - eval(before)[k] for k, v in eval(after).items()} == dict.fromkeys(eval(after), 5)
    sizes = "import linecache\nprint(ip.execution_count, len(In), len(ip.compile._filename_map), len(linecache.cache))"
    first = [int(n) for n in kernel.stdout_of(sizes).split()]
    _spaced(kernel, 3, first=10)  # sources not run before (a cell's name is its source's hash, as in ipykernel)
    kernel.stdout_of("marker = 'the last cell'")
    time.sleep(0.1)
    last = kernel.stdout_of("print(ip.last_execution_result.info.raw_cell == \"marker = 'the last cell'\")")
    assert last == "True\n"
    second = [int(n) for n in kernel.stdout_of(sizes).split()]
    # count and input history: one more for each of the six cells since; cached
    # sources: one for each new source (the second read of the sizes is the
    # first's source again); none for the warm-ups
    assert [b - a for a, b in zip(first, second, strict=True)] == [6, 6, 5, 5]
    kernel.stdout_of(
        "for event, callback in callbacks.items():\n    ip.events.unregister(event, callback)\n"
        "ip.input_transformers_cleanup.remove(count_cleanup)\n"
        "ip.input_transformer_manager.line_transforms.remove(count_line)",
    )


def test_a_shell_method_a_user_wrapped_sees_each_cell_once(kernel: SandboxKernelHandle) -> None:
    """A user who wraps ``run_code`` (to time cells, say) or adds an AST
    transformer: the ``run_cell`` warm-up would run their code, so it is
    skipped, and each cell reaches it once."""
    kernel.stdout_of(
        "ip = get_ipython()\ncalls = {'run_code': 0, 'ast': 0}\n"
        "original = ip.run_code\n"
        "async def run_code(*args, **kwargs):\n"
        "    calls['run_code'] += 1\n"
        "    return await original(*args, **kwargs)\n"
        "ip.run_code = run_code",
    )
    seen, warm_ups = _calls_over_spaced_cells(kernel, "run_code", 4)
    assert seen == 5
    assert warm_ups == 0, "the warm-up ran through the user's wrapper"
    kernel.stdout_of(
        "del ip.run_code\nimport ast\n"
        "class Count(ast.NodeTransformer):\n"
        "    def visit_Module(self, node):\n"
        "        calls['ast'] += 1\n"
        "        return node\n"
        "ip.ast_transformers.append(Count())",
    )
    seen, warm_ups = _calls_over_spaced_cells(kernel, "ast", 4)
    assert seen == 5
    assert warm_ups == 0, "the warm-up ran the user's AST transformer"
    kernel.stdout_of("ip.ast_transformers.clear()")
    # a tracer a cell set stays for later cells (the thread is the holder's): it must not see warm-ups
    kernel.stdout_of(
        "import sys\ntraced = set()\n"
        "def tracer(frame, event, arg):\n"
        "    traced.add(frame.f_code.co_filename)\n"
        "sys.settrace(tracer)",
    )
    assert _warm_ups_over_spaced_cells(kernel, 3) == 0, "the warm-up ran under the user's tracer"
    kernel.stdout_of("sys.settrace(None)")
    assert _warm_ups_over_spaced_cells(kernel, 2) > 0, "with the user's code gone, the warm-up is back"


def test_a_partial_line_streams_while_the_cell_runs(kernel: SandboxKernelHandle) -> None:
    """Text without a newline is flushed by the standby's flusher thread within
    the flush interval, not held until the cell ends."""
    arrivals, idle_at = kernel.stream_arrivals("import time\nprint('partial', end='')\ntime.sleep(1.5)\nprint(' done')")
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


def test_the_random_module_goes_on_across_cells_as_in_ipykernel(kernel: SandboxKernelHandle) -> None:
    """CPython reseeds ``random`` in every forked child, and every cell runs in
    one: after ``random.seed(42)`` the next cell drew other numbers than in
    ipykernel, where a seeded notebook gives the same results on every run.
    Back to back and spaced out (the warm-ups run first), ``gauss``'s cached
    second value included, and after a cell that died (the state is the one
    the cell before it left)."""
    expected = random.Random(42)
    assert kernel.run("import random\nrandom.seed(42)").status == "ok"
    drawn = []
    for i in range(6):
        drawn.append(kernel.run("print(repr(random.random()))").stdout.strip())
        if i >= 3:
            time.sleep(0.1)  # idle: the standby warms up before the next cell
    assert drawn == [repr(expected.random()) for _ in range(6)]
    assert kernel.run("random.seed(7)\nfirst = random.gauss(0, 1)").status == "ok"
    second = kernel.run("print(repr(random.gauss(0, 1)))").stdout.strip()
    expected.seed(7)
    expected.gauss(0, 1)
    assert second == repr(expected.gauss(0, 1))
    assert kernel.run("random.seed(3)").status == "ok"
    died = kernel.run("random.random()\nimport os\nos._exit(1)")
    assert died.status == "error"
    expected.seed(3)
    assert kernel.run("print(repr(random.random()))").stdout.strip() == repr(expected.random())


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


MAPPINGS = "print(len(open('/proc/self/maps').readlines()))"


def test_spaced_cells_leave_no_memory_mappings_behind(kernel: SandboxKernelHandle) -> None:
    """Each cell's process is forked from the last. A thread of ours alive at
    a fork (the flusher, which prints partial lines), or one that returned but
    had not yet exited, left its 16 KiB frame chunk mapped in the child and in
    every process after it: one more mapping per spaced cell, for good (400
    cells, 440 mappings; at 65,530 no process of the sandbox can map memory).
    A partial line in each cell starts the flusher in the request too."""
    before = int(kernel.stdout_of(MAPPINGS, after_idle=0.05))
    for _ in range(40):
        assert kernel.stdout_of("print('partial', end='')", after_idle=0.03) == "partial"
    after = int(kernel.stdout_of(MAPPINGS, after_idle=0.05))
    assert after - before < 10, f"{after - before} more memory mappings after 40 spaced cells"
