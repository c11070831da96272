"""A notebook user's everyday experience on the sandboxed kernel (real bwrap)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

from kernel_helpers import SandboxKernelHandle, bwrap_kernel


def test_state_persists_across_cells(kernel: SandboxKernelHandle) -> None:
    assert kernel.run("import math\nx = 20\ndef double(v):\n    return 2 * v\nclass Box:\n    size = 3").status == "ok"
    run = kernel.run("double(x) + Box.size + math.floor(1.5)")
    assert run.status == "ok"
    assert run.result["text/plain"] == "44"


def test_print_streams_while_the_cell_runs(kernel: SandboxKernelHandle) -> None:
    arrivals, _ = kernel.stream_arrivals(
        "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.6)"
    )
    text = "".join(t for _, t in arrivals)
    assert text == "tick 0\ntick 1\ntick 2\n"
    # live: the first line arrived well before the last one
    assert len(arrivals) >= 2 and arrivals[-1][0] - arrivals[0][0] > 0.8


def test_a_stream_kept_from_an_earlier_cell_writes_into_the_running_cell(kernel: SandboxKernelHandle) -> None:
    """As in ipykernel, where sys.stdout is one stream: ``out = sys.stdout``
    kept by a cell (a logging handler without flush, ``tqdm(file=...)``, a
    default argument) writes into whichever cell runs, in order with
    print. Each cell's process has its own stream objects; a write to an
    earlier one waited unsent in its buffer and came out cells later."""
    kernel.run("import sys, time\nout, err = sys.stdout, sys.stderr\ndef say(text, file=sys.stdout): file.write(text)")
    for pause in (0.0, 0.3):  # back to back, and after the standby warmed up
        time.sleep(pause)
        run = kernel.run("out.write('a\\n'); print('b'); say('c\\n'); err.write('d\\n'); out.write('e')")
        assert run.status == "ok", run.errors
        assert run.stdout == "a\nb\nc\ne" and run.stderr == "d\n", (run.stdout, run.stderr)
    assert kernel.run("print('f')").stdout == "f\n"  # nothing of the earlier cells came late


def test_dataframe_renders_as_table(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert run.status == "ok"
    html = run.result["text/html"]
    assert ("<table" in html and "<th>" in html.replace(' halign="left"', "")) or "<th" in html
    assert "x" in run.result["text/plain"]


def test_matplotlib_figure_inline(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert run.status == "ok", run.reply
    pngs = [d["data"]["image/png"] for d in run.of("display_data") if "image/png" in d["data"]]
    assert pngs, run.messages
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG")


def test_display_and_clear_output(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "from IPython.display import display, clear_output, Markdown\n"
        "display(Markdown('**first**'))\nclear_output(wait=True)\ndisplay('second')"
    )
    assert run.status == "ok"
    assert run.of("display_data")[0]["data"]["text/markdown"] == "**first**"
    assert run.of("clear_output") == [{"wait": True}]
    assert run.of("display_data")[-1]["data"]["text/plain"] == "'second'"


def test_display_id_updates(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("h = display('one', display_id=True)\nh.update('two')")
    assert run.status == "ok"
    first = run.of("display_data")[0]
    update = run.of("update_display_data")[0]
    assert first["transient"]["display_id"] == update["transient"]["display_id"]
    assert update["data"]["text/plain"] == "'two'"


def test_magics_and_shell_escape(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("%timeit -n 3 -r 1 sum(range(100))")
    assert run.status == "ok" and "per loop" in run.stdout
    (kernel.workspace / "visible.txt").write_text("hello")
    run = kernel.run("!ls")
    assert run.status == "ok" and "visible.txt" in run.stdout


def test_input_asks_the_frontend(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("name = input('who? ')\nprint('hi', name)", allow_stdin=True, stdin_answers=["ada"])
    assert run.status == "ok", run.reply
    assert "hi ada" in run.stdout


def test_input_without_stdin_is_a_clear_error(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("input('x')", allow_stdin=False)
    assert run.status == "error"
    assert run.reply["ename"] == "StdinNotImplementedError"
    assert "does not support input" in run.reply["evalue"]


def test_exceptions_keep_side_effects(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("partial = 'kept'\nraise ValueError('boom')")
    assert run.status == "error" and run.reply["ename"] == "ValueError"
    assert any("boom" in line for line in run.errors[0]["traceback"])
    assert kernel.run("partial").result["text/plain"] == "'kept'"


def test_completion_and_inspection(kernel: SandboxKernelHandle) -> None:
    kernel.run("my_special_variable = 1")
    reply = kernel.kc.complete("my_spec", 7, reply=True)["content"]
    assert "my_special_variable" in reply["matches"]
    reply = kernel.kc.inspect("zip", 3, reply=True)["content"]
    assert reply["found"] and "zip" in reply["data"]["text/plain"]


def test_the_completer_stays_warm_across_cells(tmp_path: Path) -> None:
    """Completions run in a throw-away process, and jedi loaded what every
    completion needs (its grammar, the builtins' stubs) there, to lose it
    with that process: each completion paid for it again (0.3-0.7 s with
    pandas loaded; see bench/completion_latency.py). The first completion
    now loads it in the process that holds the state, as ipykernel's first
    does in its own, so later cells and completions start with it."""
    k = bwrap_kernel(tmp_path)
    loaded = "import sys\nprint('jedi' in sys.modules)"
    try:
        assert k.stdout_of("my_special_variable = 1\n" + loaded) == "False\n"
        assert "my_special_variable" in k.kc.complete("my_spec", 7, reply=True)["content"]["matches"]
        assert k.stdout_of(loaded) == "True\n"
        assert k.stdout_of("my_special_variable += 1\n" + loaded + "\nprint(my_special_variable)") == "True\n2\n"
        assert "my_special_variable" in k.kc.complete("my_spec", 7, reply=True)["content"]["matches"]
    finally:
        k.shutdown()


def test_pager_payload(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("zip?")
    payload = run.reply["payload"]
    assert payload and payload[0]["source"] == "page"
    assert "zip" in payload[0]["data"]["text/plain"]


def test_is_complete_and_history(kernel: SandboxKernelHandle) -> None:
    def is_complete(code: str) -> str:
        msg_id = kernel.kc.is_complete(code)
        reply = kernel.kc.get_shell_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == msg_id
        return reply["content"]["status"]

    assert is_complete("def f():") == "incomplete"
    assert is_complete("x = 1") == "complete"
    assert is_complete("x = (") == "incomplete"
    kernel.run("history_marker = 12345")
    tail = kernel.kc.history(hist_access_type="tail", n=2, reply=True)["content"]["history"]
    assert any("history_marker" in entry[2] for entry in tail)
    found = kernel.kc.history(hist_access_type="search", pattern="history_marker*", reply=True)["content"]["history"]
    assert found and found[-1][2].startswith("history_marker")
    # as IPython: session 0 (the current one, the default) is named 0 in the reply
    for session, label in ((0, 0), (1, 1)):
        ranged = kernel.kc.history(hist_access_type="range", session=session, start=1, stop=10**6, reply=True)
        entries = ranged["content"]["history"]
        assert entries and {entry[0] for entry in entries} == {label}, (session, entries)


def test_kernel_info_is_honest(kernel: SandboxKernelHandle) -> None:
    info = kernel.kc.kernel_info(reply=True)["content"]
    assert info["language_info"]["name"] == "python"
    assert "kernel subshells" not in info.get("supported_features", [])
    assert info["implementation"] == "sandbox_kernel"


def test_a_result_whose_formatting_raises_fails_its_cell(kernel: SandboxKernelHandle) -> None:
    """As in ipykernel: a ``_repr_html_`` that raises shows its error, the
    result still shows as text, and the cell's reply is an error (Run All stops)."""
    run = kernel.run("class Bad:\n    def _repr_html_(self):\n        raise ValueError('repr fails')\nBad()")
    assert run.reply["status"] == "error"
    assert (run.reply["ename"], run.reply["evalue"]) == ("ValueError", "repr fails")
    assert [m["msg_type"] for m in run.messages if m["msg_type"] in ("error", "execute_result")] == [
        "error",
        "execute_result",
    ]
    assert run.result is not None and list(run.result) == ["text/plain"]
    assert kernel.run("'fine'").reply["status"] == "ok"  # the next cell starts clean


def test_prints_of_processes_a_cell_forks_are_shown(kernel: SandboxKernelHandle) -> None:
    """A multiprocessing worker's prints were lost: buffered for the flush
    interval, and the pool terminated before (``Pool.__exit__``)."""
    run = kernel.run(
        "import multiprocessing as mp\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "def square(x):\n"
        "    print('in worker', x)\n"
        "    return x * x\n"
        "with mp.Pool(1) as pool:\n"
        "    results = pool.map(square, [3])\n"
        "with ProcessPoolExecutor(1) as ex:\n"
        "    results += list(ex.map(square, [4]))\n"
        "child = mp.Process(target=square, args=(5,))\n"
        "child.start(); child.join()\n"
        "results"
    )
    assert run.reply["status"] == "ok", run.reply
    assert run.result == {"text/plain": "[9, 16]"}
    assert sorted(run.stdout.splitlines()) == ["in worker 3", "in worker 4", "in worker 5"], run.stdout


def test_output_of_c_code_comes_before_what_follows_it(kernel: SandboxKernelHandle) -> None:
    """What C code (or a subprocess) wrote to fd 1 is sent before a later
    display, error or result (it came after them: the pipe's reader had not
    read it yet when they were sent)."""
    run = kernel.run(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.printf(b'from C\\n'); libc.fflush(None)\n"
        "display('shown')\n"
        "os.system('echo from a subprocess')\n"
        "'result'"
    )
    order = [
        m["content"]["text"] if m["msg_type"] == "stream" else m["msg_type"]
        for m in run.messages
        if m["msg_type"] in ("stream", "display_data", "execute_result")
    ]
    assert order == ["from C\n", "display_data", "from a subprocess\n", "execute_result"], order


def test_a_flush_of_a_stream_an_earlier_cell_kept_sends_the_output(kernel: SandboxKernelHandle) -> None:
    """A logging handler made in one cell keeps that cell's ``sys.stderr``;
    its flush after each record sent nothing (the lines had gone to the
    current stream), so a cell's log lines came after all its prints. As
    in ipykernel, each record now goes out when the handler flushes."""
    kernel.run(
        "import logging, sys\nkept_log = logging.getLogger('kept')\nkept_log.addHandler(logging.StreamHandler())"
    )
    run = kernel.run("print('a')\nkept_log.warning('b')\nprint('c')")
    lines = [
        (m["content"]["name"], line)
        for m in run.messages
        if m["msg_type"] == "stream"
        for line in m["content"]["text"].splitlines()
    ]
    assert sorted(lines) == [("stderr", "b"), ("stdout", "a"), ("stdout", "c")], lines
    assert lines.index(("stderr", "b")) < lines.index(("stdout", "c")), lines
