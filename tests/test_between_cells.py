"""What threads and tasks of cells send after their cell ended (real bwrap).

In ipykernel a thread's prints and the widgets it updates reach the frontend at
once, under the last request's parent: the ipywidgets documentation's own
example moves a progress bar from a thread after its cell ended. Here that
output goes out as it comes, and the host's memory stays bounded whatever the
sandbox writes while no cell runs (the sandbox's frames are untrusted).
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from kernel_helpers import (
    SandboxKernelHandle,
    bwrap_kernel,
    iopub_until,
    iopub_until_idle,
    is_idle,
    ok,
    status_of,
    stock_kernel,
)

# ipywidgets' "Asynchronous Widgets" example, "Updating a widget in the background"
PROGRESS_FROM_A_THREAD = """
import threading, time
import ipywidgets as widgets
from IPython.display import display
progress = widgets.FloatProgress(value=0.0, min=0.0, max=1.0)
def work(progress):
    for i in range(8):
        time.sleep(0.2)
        progress.value = float(i + 1) / 8
    print('work done')
display(progress)
threading.Thread(target=work, args=(progress,)).start()
"""


def _idle_index(messages: list[dict[str, Any]], msg_id: str) -> int:
    return next(i for i, m in enumerate(messages) if is_idle(m, msg_id))


def _progress_after_idle(kc: Any) -> tuple[list[float], list[str], str]:
    msg_id = kc.execute(PROGRESS_FROM_A_THREAD)
    messages = iopub_until(
        kc, lambda got: any(m["msg_type"] == "stream" and "work done" in m["content"]["text"] for m in got)
    )
    after = messages[_idle_index(messages, msg_id) + 1 :]
    values = [
        m["content"]["data"]["state"]["value"]
        for m in after
        if m["msg_type"] == "comm_msg" and "value" in m["content"]["data"].get("state", {})
    ]
    parents = sorted({m["parent_header"].get("msg_id") for m in after if m["msg_type"] in ("comm_msg", "stream")})
    return values, parents, msg_id


@pytest.mark.timeout(120)
def test_a_progress_bar_a_thread_moves_after_its_cell_ended_moves_as_in_ipykernel(
    kernel: SandboxKernelHandle, tmp_path: Path
) -> None:
    values, parents, msg_id = _progress_after_idle(kernel.kc)
    # every step reaches the frontend without another cell being run, under the cell's parent
    # (before: none until the next cell, and 'work done' never)
    assert values[-4:] == [0.625, 0.75, 0.875, 1.0], values
    assert parents == [msg_id]
    with stock_kernel(tmp_path) as client:
        stock_values, stock_parents, stock_id = _progress_after_idle(client)
    assert stock_parents == [stock_id]
    assert values[-4:] == stock_values[-4:]


BACKGROUND_PRINTERS = """
import asyncio, threading, time
def ticks():
    for i in range(10):
        time.sleep(0.2)
        print('thread', i, flush=True)
threading.Thread(target=ticks).start()
async def beats():
    for i in range(10):
        await asyncio.sleep(0.2)
        print('task', i, flush=True)
task = asyncio.get_running_loop().create_task(beats())
"""


@pytest.mark.timeout(120)
def test_what_threads_and_tasks_print_goes_out_at_once_under_the_cell_ipykernel_names(
    kernel: SandboxKernelHandle,
) -> None:
    kc = kernel.kc
    first = kc.execute(BACKGROUND_PRINTERS)
    messages = iopub_until(kc, lambda got: sum(m["msg_type"] == "stream" for m in got) >= 4, timeout=30)
    second = kc.execute("time.sleep(0.6)\nprint('second done')")

    def all_ticks(got: list[dict[str, Any]]) -> bool:
        text = "".join(m["content"]["text"] for m in messages + got if m["msg_type"] == "stream")
        return "thread 9" in text and "task 9" in text and "second done" in text

    messages += iopub_until(kc, all_ticks, timeout=30)
    streams = [
        (m["parent_header"].get("msg_id"), line)
        for m in messages
        if m["msg_type"] == "stream"
        for line in m["content"]["text"].splitlines()
    ]
    lines = [line for _, line in streams]
    # nothing lost (before: every line printed while no cell ran was dropped)
    assert sorted(line for line in lines if line.startswith("thread")) == [f"thread {i}" for i in range(10)]
    assert sorted(line for line in lines if line.startswith("task")) == [f"task {i}" for i in range(10)]
    # a task's lines go under the cell that created it, as in ipykernel (its parent is a
    # contextvar the task copied), also those printed after the second cell began
    second_sent = next(
        m["arrived"] for m in messages if m["msg_type"] == "status" and m["parent_header"].get("msg_id") == second
    )
    late_tasks = [
        m
        for m in messages
        if m["msg_type"] == "stream" and "task" in m["content"]["text"] and m["arrived"] > second_sent
    ]
    assert late_tasks, "no task line came after the second cell began"
    assert {parent for parent, line in streams if line.startswith("task")} == {first}
    # a thread's lines printed while no cell ran go under the last cell, those printed
    # while the second runs under it, as in ipykernel (a thread has no parent of its own)
    idle_at = messages[_idle_index(messages, first)]["arrived"]
    between = [
        m["parent_header"].get("msg_id")
        for m in messages
        if m["msg_type"] == "stream" and "thread" in m["content"]["text"] and idle_at < m["arrived"] < second_sent
    ]
    assert between and set(between) == {first}, between
    assert any(parent == second and line.startswith("thread") for parent, line in streams), streams


def test_a_thread_printing_without_pause_across_the_end_of_its_cell_loses_no_line(
    kernel: SandboxKernelHandle,
) -> None:
    """The holder stops its flusher thread before each fork; a stream that
    waited for it stayed marked so, and every later line of the thread was
    held back for good (3 lines of 2000 arrived)."""
    kc = kernel.kc
    kc.execute(
        "import threading, time\n"
        "def ticks():\n"
        "    for i in range(2000):\n"
        "        print('tick', i)\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=ticks).start()"
    )

    def lines(got: list[dict[str, Any]]) -> list[str]:
        return "".join(m["content"]["text"] for m in got if m["msg_type"] == "stream").splitlines()

    messages = iopub_until(kc, lambda got: "tick 1999" in lines(got), timeout=60)
    assert lines(messages) == [f"tick {i}" for i in range(2000)]


WRITER = (
    "import sys, time\n"
    "time.sleep(1.5)\n"
    "for i in range(300):\n"
    "    sys.stdout.write('x' * 1000 + '\\n'); sys.stdout.flush()\n"
    "sys.stderr.write('finished\\n')\n"
)


def test_what_a_process_a_cell_started_writes_after_later_cells_still_arrives(kernel: SandboxKernelHandle) -> None:
    """A server or ``Popen`` a cell started writes into the pipes that cell's
    process read; that process exits when the next cell's takes over. The
    pipes were then left unread: 0 of 300 lines arrived (and past the pipe's
    64 KiB the writer blocks). As in ipykernel, all of it arrives."""
    kc = kernel.kc
    ok(kernel, f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {WRITER!r}])")
    ok(kernel, "1")
    ok(kernel, "2")  # two holders later

    def text(got: list[dict[str, Any]], name: str) -> str:
        return "".join(m["content"]["text"] for m in got if m["msg_type"] == "stream" and m["content"]["name"] == name)

    messages = iopub_until(kc, lambda got: "finished" in text(got, "stderr"), timeout=60)
    assert text(messages, "stdout") == ("x" * 1000 + "\n") * 300
    assert ok(kernel, "print(p.wait(10))") == "0\n"


def test_a_silent_request_does_not_take_the_output_of_threads_between_cells(kernel: SandboxKernelHandle) -> None:
    """Extensions (variable inspectors) send silent requests between cells;
    a thread's output after one still goes out at once, under the last cell."""
    kc = kernel.kc
    first = kc.execute(
        "import threading, time\n"
        "gate = threading.Event()\n"
        "threading.Thread(target=lambda: (gate.wait(), time.sleep(0.5), print('after silent', flush=True))).start()"
    )
    iopub_until_idle(kc, first)
    quiet = kc.execute("gate.set()", silent=True)
    messages = iopub_until(kc, lambda got: sum("after silent" in m["content"].get("text", "") for m in got) >= 1)
    text = [(m["parent_header"].get("msg_id"), m["content"]["text"]) for m in messages if m["msg_type"] == "stream"]
    assert text and all(parent == first for parent, _ in text), (quiet, text)


def test_what_a_thread_displays_after_its_cell_is_sanitised_like_the_cells_own(kernel: SandboxKernelHandle) -> None:
    """Output published between cells goes through the same output policy as a
    cell's: a script, an event handler or JavaScript a thread displays after
    its cell ended never reaches the browser (guarantee 8)."""
    kc = kernel.kc
    first = kc.execute(
        "import threading, time\n"
        "from IPython.display import display, HTML, Javascript\n"
        "def later():\n"
        "    time.sleep(0.5)\n"
        '    display(HTML(\'<b id="late">late</b><img src=x onerror="alert(1)"><script>alert(2)</script>\'))\n'
        "    display(Javascript('alert(3)'))\n"
        "    print('shown', flush=True)\n"
        "threading.Thread(target=later).start()"
    )
    messages = iopub_until(kc, lambda got: any("shown" in m["content"].get("text", "") for m in got))
    after = messages[_idle_index(messages, first) + 1 :]
    bundles = [m["content"]["data"] for m in after if m["msg_type"] == "display_data"]
    assert bundles and all(m["parent_header"].get("msg_id") == first for m in after if m["msg_type"] != "status")
    html = "".join(b.get("text/html", "") for b in bundles)
    assert '<b id="late">late</b>' in html or "<b>late</b>" in html, html
    assert "<script" not in html and "onerror" not in html and "alert" not in html, html
    assert not any("application/javascript" in b for b in bundles), bundles


@pytest.mark.timeout(120)
def test_a_thread_that_asks_the_host_after_its_cell_ended_gets_an_error_at_once(kernel: SandboxKernelHandle) -> None:
    """input() and the ratchet are answered through the cell's private pipe,
    closed once the cell ends: a thread that asked later sent its request to
    the host all the same and read the closed pipe (EBADF, or another pipe
    that had its fd number), and input() blamed the frontend."""
    ok(
        kernel,
        "import threading, time\n"
        "from sandbox_kernel import private\n"
        "asked = {}\n"
        "def ask_later():\n"
        "    time.sleep(0.5)\n"
        "    for name, call in (('input', lambda: input('later? ')), ('ratchet', lambda: private.mark_private())):\n"
        "        try:\n"
        "            call()\n"
        "        except Exception as exc:\n"
        "            asked[name] = f'{type(exc).__name__}: {exc}'\n"
        "asker = threading.Thread(target=ask_later)\n"
        "asker.start()",
    )
    time.sleep(1.0)
    out = ok(kernel, "asker.join(10)\nprint(asker.is_alive())\nfor name in sorted(asked): print(name, asked[name])")
    lines = out.splitlines()
    assert lines[0] == "False", out  # it did not hang
    assert lines[1].startswith("input StdinNotImplementedError: input() was called after its cell ended"), out
    assert lines[2].startswith("ratchet RuntimeError: sandbox_kernel.private was called after its cell ended"), out
    assert status_of(kernel)["private"] is False  # the call never reached the host


def test_a_frame_can_name_only_a_recent_cell_of_its_own_session(kernel: SandboxKernelHandle) -> None:
    """The sandbox says which earlier cell a task's output belongs to; the host
    looks the name up among its own recent requests and uses nothing else of it."""
    kc = kernel.kc
    earlier = kc.execute("pass")
    iopub_until_idle(kc, earlier)
    code = f"""
import sys
for parent in ({earlier!r}, 'never-sent', 7, ['x'], {{'msg_id': {earlier!r}}}):
    sys.stdout.channel.send({{"type": "stream", "name": "stdout", "text": f"named {{parent!r}}\\n", "parent": parent}})
"""
    later = kc.execute(code)
    messages = iopub_until_idle(kc, later)
    under = {
        m["content"]["text"].strip(): m["parent_header"].get("msg_id") for m in messages if m["msg_type"] == "stream"
    }
    assert under.pop(f"named {earlier!r}") == earlier
    assert under == {
        "named 'never-sent'": later,
        "named 7": later,
        "named ['x']": later,
        f"named {{'msg_id': {earlier!r}}}": later,
    }


def _watch(handle: SandboxKernelHandle, seconds: float) -> tuple[int, list[dict[str, Any]]]:
    """The most the kernel process grew (RSS, bytes) over ``seconds``, and
    the iopub messages that came meanwhile."""
    process = psutil.Process(handle.pid)
    start = peak = process.memory_info().rss
    messages = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, process.memory_info().rss)
        try:
            messages.append(handle.kc.get_iopub_msg(timeout=0.1))
        except queue.Empty:
            pass
    return peak - start, messages


# The sandbox's own output budget is bypassed: cell code can do anything the
# worker can, so the host must hold whatever arrives.
RAW_FRAMES = """
import sys, threading
channel = sys.stdout.channel
kept = 'still here'
def flood():
    channel.output_budget = None
    for i in range(300):
        channel.send({FRAME})
    open('/workspace/flood.done', 'w').close()
threading.Thread(target=flood, daemon=True).start()
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "frame",
    [
        # output: forwarded as it comes, within the cell's budget
        '{"type": "stream", "name": "stdout", "text": "x" * 1000000 + "\\n"}',
        # not output, and answering nothing: queued for the next request, up to a bound
        '{"type": "reply", "id": "q-junk", "pad": "x" * 1000000}',
    ],
    ids=["output", "junk"],
)
def test_frames_a_thread_floods_between_cells_do_not_grow_the_host(frame: str, tmp_path: Path) -> None:
    handle = bwrap_kernel(tmp_path, "--SandboxKernel.max_output_bytes=2000000")
    try:
        assert handle.run("1").status == "ok"
        msg_id = handle.kc.execute(RAW_FRAMES.replace("{FRAME}", frame))
        # 300 MB written meanwhile; before, the kernel held all of it (+420 MiB)
        growth, messages = _watch(handle, 6.0)
        assert growth < 100 * 1024 * 1024, f"the kernel grew by {growth >> 20} MiB"
        mine = [m for m in messages if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"]
        sent = sum(len(m["content"]["text"]) for m in mine)
        if "stream" in frame:
            # the budget holds after the cell ended too, and the cut is said once:
            # at the cell's end when the flood crossed the budget before it, else
            # when it crosses it afterwards (which comes first is the scheduler's)
            assert 1_000_000 < sent < 2_100_000, sent
            notes = [m["content"]["text"] for m in mine if "SandboxKernel.max_output_bytes" in m["content"]["text"]]
            assert len(notes) == 1, [m["content"]["text"][:80] for m in mine]
            assert "over the cell's budget" in notes[0] or "output truncated" in notes[0], notes
            # The flood's frames name no parent: any still coming when the next
            # cell runs are that cell's output, and spend its budget (a loaded
            # machine wrote them for longer than the watch above).
            deadline = time.monotonic() + 120
            while not (handle.workspace / "flood.done").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # what was in the pipe then is read
        else:
            assert sent == 0  # held back (the flood waits for room): the next cell drains it
        run = handle.run("kept", timeout=120)  # the next cell drains what was held back
        assert run.status == "ok", run.stderr
        assert run.result == {"text/plain": "'still here'"}
    finally:
        handle.shutdown()
