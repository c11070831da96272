"""``breakpoint()`` as a notebook user meets it: under nbclient and papermill,
which answer no ``input()``, a leftover ``breakpoint()`` runs through, as it
does with ipykernel (whose debugpy hook does nothing while no debugger is
attached); in a frontend that answers ``input()``, pdb stops in the frame
that called it."""

from __future__ import annotations

from pathlib import Path

import nbformat
from kernel_helpers import bwrap_kernel, require_bwrap
from nbclient import NotebookClient

CELLS = [
    "def g(a):\n    b = a * 2\n    breakpoint()\n    return b",
    "print(g(21))",
]


def _run_notebook(kernel_name: str, cwd: Path) -> list[list[dict]]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, kernel_name=kernel_name, timeout=60, resources={"metadata": {"path": str(cwd)}}).execute()
    return [[dict(o) for o in cell.outputs] for cell in nb.cells]


def test_a_leftover_breakpoint_runs_through_under_nbclient_as_with_ipykernel(tmp_path: Path) -> None:
    require_bwrap()
    stock = _run_notebook("python3", tmp_path)
    ours = _run_notebook("sandbox-python", tmp_path)
    assert stock[1] == [{"output_type": "stream", "name": "stdout", "text": "42\n"}]
    assert ours == stock


def test_breakpoint_stops_in_the_callers_frame_when_input_is_answered(tmp_path: Path) -> None:
    k = bwrap_kernel(tmp_path)
    try:
        assert k.run(CELLS[0]).status == "ok"
        run = k.run(CELLS[1], allow_stdin=True, stdin_answers=["p a, b", "c"])
        prompts = [m["content"]["prompt"] for m in run.messages if m["msg_type"] == "input_request"]
        assert prompts == ["(Pdb) ", "(Pdb) "]
        assert "g()\n-> return b" in run.stdout, run.stdout  # the cell's function, not the hook
        assert "(21, 42)\n" in run.stdout and run.stdout.endswith("42\n")
        # without input, in the same kernel: it runs through
        assert k.run("print(g(1))").stdout == "2\n"
    finally:
        k.shutdown()


def test_a_hook_the_user_chose_is_kept(tmp_path: Path) -> None:
    k = bwrap_kernel(tmp_path)
    try:
        assert k.run("import sys\nsys.breakpointhook = lambda *a, **kw: print('my hook', a)").status == "ok"
        assert k.run("breakpoint(1)", allow_stdin=True, stdin_answers=["c"]).stdout == "my hook (1,)\n"
        # PYTHONBREAKPOINT=0 turns breakpoint() off, as in Python
        assert (
            k.run("sys.breakpointhook = sys.__breakpointhook__\nimport os\nos.environ['PYTHONBREAKPOINT'] = '0'").status
            == "ok"
        )
        run = k.run("breakpoint()\nprint('on')", allow_stdin=True, stdin_answers=["c"])
        assert run.stdout == "on\n" and not any(m["msg_type"] == "input_request" for m in run.messages)
        # or names another debugger (here a function of a module the cell wrote)
        k.stdout_of("open('mydebugger.py', 'w').write('def stop(*a):\\n    print(\\'mine\\', a)\\n')")
        k.stdout_of("os.environ['PYTHONBREAKPOINT'] = 'mydebugger.stop'")
        assert k.run("breakpoint(2)", allow_stdin=True, stdin_answers=["c"]).stdout == "mine (2,)\n"
    finally:
        k.shutdown()
