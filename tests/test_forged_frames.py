"""Frames a cell forges on its own channel to the host.

A cell runs in the worker's process, so it holds the worker's channel to the
host (``get_ipython().display_pub.channel``) and can write any frame on it:
prompts without end, huge or deeply built JSON, requests whose replies it
never reads. The host must stay up, bounded in memory and responsive, and
keep the session's state (an attack review, helper 38, found each of these
taking the host kernel down, or holding hundreds of MB of it).
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, iopub_until, peak_mib

pytestmark = pytest.mark.timeout(300)

#: what a cell runs to write frames of its own on the worker's channel
FORGE = """
import json, os, struct
_channel = get_ipython().display_pub.channel
def forge(msg, raw=None):
    body = raw if raw is not None else json.dumps(msg).encode()
    frame = memoryview(struct.pack('>I', len(body)) + body)
    with _channel._lock:
        while frame:
            frame = frame[os.write(_channel.write_fd, frame):]
"""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path)
    yield handle
    handle.shutdown()


def test_a_burst_of_prompts_does_not_crash_the_kernel_or_garble_its_messages(kernel: SandboxKernelHandle) -> None:
    """Each prompt is asked in a thread on the kernel's stdin socket, and the
    prompt a new one supersedes goes on polling for a moment: threads used the
    zmq socket at once, and libzmq aborted the kernel (SIGABRT) in half of the
    runs, or the client got messages with invalid signatures."""
    assert kernel.run("kept = 'state'").status == "ok"
    process = kernel.km.provisioner.process  # type: ignore[union-attr]
    msg_id = kernel.kc.execute(
        FORGE + "for burst in range(5):\n"
        "    for i in range(20_000):\n"
        "        forge({'type': 'input_request', 'prompt': f'forged {i}', 'password': False, 'req': 10**6 + i})\n"
        "print(input('real prompt> '))",
        allow_stdin=True,
    )
    prompts, garbled, reply = 0, 0, None
    deadline = time.monotonic() + 120
    while reply is None and time.monotonic() < deadline:
        assert process.poll() is None, f"the kernel died: exit status {process.poll()}"
        try:
            request = kernel.kc.get_stdin_msg(timeout=0.05)
            prompts += 1
            if request["content"]["prompt"] == "real prompt> ":
                kernel.kc.input("the answer")
        except queue.Empty:
            pass
        except ValueError:  # jupyter_client refuses a message whose signature is wrong
            garbled += 1
        try:
            shell = kernel.kc.get_shell_msg(timeout=0)
            if shell["parent_header"].get("msg_id") == msg_id:
                reply = shell["content"]
        except queue.Empty:
            pass
    assert reply is not None and reply["status"] == "ok", reply
    assert garbled == 0
    assert 1 <= prompts < 100_000  # superseded prompts are mostly never sent
    run = kernel.run("print(kept)")
    assert run.status == "ok" and run.stdout == "state\n"


@pytest.mark.parametrize("loop", ["time.sleep(0.1)", "print('still here', flush=True); time.sleep(0.1)"])
def test_an_interrupt_ends_a_cell_that_stopped_its_holder_and_the_state_comes_back(
    kernel: SandboxKernelHandle, loop: str
) -> None:
    """The holder reads the host's ops while a cell runs; a cell that stops
    it (SIGSTOP) never gets the interrupt, nor the kill it escalates to: the
    cell showed as running for good, and only a restart, which loses the
    state, ended it. After the kill's own grace the sandbox goes, and the
    state comes back from the checkpoint; also while the cell goes on
    printing (the last resort waits for a host that is behind, not for a
    worker that talks)."""
    assert kernel.run("kept = 'state'").status == "ok"
    time.sleep(2)  # the checkpoint at idle
    msg_id = kernel.kc.execute(
        "import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\nwhile True:\n    " + loop
    )
    time.sleep(2)
    started = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = None
    while reply is None and time.monotonic() - started < 60:
        try:
            shell = kernel.kc.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if shell["parent_header"].get("msg_id") == msg_id:
            reply = shell["content"]
    assert reply is not None, "no reply a minute after the interrupt"
    assert reply["status"] == "error", reply
    assert "did not stop within 5 s of the interrupt and was killed" in reply["evalue"], reply
    run = kernel.run("print(kept)")
    assert run.status == "ok" and run.stdout == "state\n", (run.reply, run.stderr)


def test_a_frame_of_millions_of_tiny_values_is_not_parsed(kernel: SandboxKernelHandle) -> None:
    """JSON of ``[{},{},...]`` costs the host some 25 times its size once
    parsed (a 32 MB frame took 890 MB). A frame of more values than the host
    parses becomes a notice, and the sandbox and its state stay."""
    assert kernel.run("kept = 'state'").status == "ok"
    before = peak_mib(kernel.pid)
    run = kernel.run(
        FORGE + "junk = b'[' + b'{},' * ((16 << 20) // 3) + b'{}]'\n"
        'forge(None, b\'{"type": "stream", "name": "stdout", "text": "forged", "junk": \' + junk + b\'}\')\n'
        "print('sent')",
        timeout=120,
    )
    assert run.status == "ok", (run.reply, run.stderr)
    grown = peak_mib(kernel.pid) - before
    assert grown < 150, f"the host kernel's peak grew by {grown} MiB"
    assert run.stdout == "sent\n" and "JSON values from the sandbox was dropped" in run.stderr, run.stderr
    assert kernel.run("print(kept)").stdout == "state\n"


def test_text_full_of_commas_and_brackets_is_still_an_output(kernel: SandboxKernelHandle) -> None:
    """Only values are counted, not the commas in a string: 3 million of
    them in a printed CSV are one value."""
    run = kernel.run("import sys\nsys.stdout.write('1,[2],{3}\\n' * 600_000)", timeout=120)
    assert run.status == "ok" and run.stdout.count("1,[2],{3}\n") == 600_000, run.stderr[-300:]
    run = kernel.run("from IPython.display import JSON\ndisplay(JSON({'values': list(range(200_000))}))")
    bundles = [content["data"] for content in run.of("display_data")]
    assert bundles and bundles[0]["application/json"]["values"][-1] == 199_999


def test_a_sandbox_that_stops_reading_the_host_is_killed_before_the_host_fills_up(
    kernel: SandboxKernelHandle,
) -> None:
    """The cell forges requests the host answers, and reads none of the
    answers: its holder, relaying them to the cell, stops reading the host,
    whose unsent bytes grew without end (580 MB for 12 frames in the
    review). Past the limit the sandbox is killed, and the state comes back."""
    assert kernel.run("kept = 'state'").status == "ok"
    time.sleep(2)  # the checkpoint at idle
    host = psutil.Process(kernel.pid)
    before = host.memory_info().rss
    run = kernel.run(
        FORGE + "import time\n"
        "request = json.dumps({'type': 'ratchet', 'kind': 'mount', 'name': 'A' * 2000}).encode()\n"
        "for _ in range(200_000):\n"
        "    forge(None, request)\n"
        "time.sleep(60)",
        timeout=120,
    )
    grown = (host.memory_info().rss - before) >> 20
    assert run.status == "error", run.reply
    assert "stopped reading what the host sends" in run.reply["evalue"], run.reply
    assert grown < 200, f"the host kernel grew by {grown} MiB"
    assert kernel.run("print(kept)").stdout == "state\n"


def test_a_refused_ratchet_request_does_not_echo_a_huge_name(tmp_path: Path) -> None:
    from sandbox_kernel.engine.ratchet import MAX_ERROR_TEXT, Ratchet
    from sandbox_kernel.privacy import PrivacyStore

    ratchet = Ratchet("alice", "s1", PrivacyStore(tmp_path / "privacy"), workspace=tmp_path)
    answer = ratchet.handle_request({"kind": "mount", "name": "A" * (8 << 20)})
    assert answer["ok"] is False and answer["error"].startswith("no private dataset named 'AAA")
    assert len(answer["error"]) <= MAX_ERROR_TEXT


BUDGET = 1_000_000


@pytest.fixture
def budget_kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path, f"--SandboxKernel.max_output_bytes={BUDGET}")
    yield handle
    handle.shutdown()


@pytest.mark.parametrize(
    "code",
    [
        FORGE + "for i in range(20):\n"
        "    forge({'type': 'display_data', 'data': {'text/plain': 'x'}, 'metadata': {'pad': 'M' * 500_000}})",
        FORGE + "for i in range(20):\n"
        "    forge({'type': 'update_display_data', 'data': {'text/plain': 'x'}, 'metadata': {},\n"
        "           'transient': {'display_id': f'{i}' + 'D' * 500_000}})",
        FORGE + "for i in range(30):\n"
        "    forge({'type': 'error', 'ename': 'E', 'evalue': 'V' * 100_000, 'traceback': []})",
    ],
    ids=["metadata", "display_id", "evalue"],
)
def test_what_goes_beside_an_outputs_data_counts_against_the_budget(
    budget_kernel: SandboxKernelHandle, code: str
) -> None:
    """Only a bundle's data, or an error's traceback, were charged by the
    host: a cell writing its own frames (the worker charges what IPython
    sends) sent 300 MB of metadata, display ids or error values past a 10 MB
    budget. The whole message counts now."""
    run = budget_kernel.run(code, timeout=120)
    sent = sum(len(json.dumps(m["content"])) for m in run.messages if m["msg_type"] != "status")
    assert sent < 1.6 * BUDGET, f"{sent:,} bytes went out for a budget of {BUDGET:,}"
    assert "output truncated" in run.stderr + json.dumps(run.reply), run.stderr[-500:]


def test_clear_output_in_a_loop_is_charged_too(budget_kernel: SandboxKernelHandle) -> None:
    """A message without data costs the host and the client all the same:
    200,000 of them kept the host busy for 30 s. Within the budget they
    pass, as a live plot's redraws do."""
    run = budget_kernel.run(
        "from IPython.display import clear_output\nfor _ in range(20_000):\n    clear_output(wait=True)", timeout=120
    )
    cleared = len(run.of("clear_output"))
    assert 1000 < cleared <= BUDGET // 256 + 1, cleared
    assert budget_kernel.run("from IPython.display import clear_output\nclear_output()").of("clear_output")


def test_output_sent_under_earlier_cells_shares_one_more_budget(budget_kernel: SandboxKernelHandle) -> None:
    """An asyncio task prints under the cell that made it, so a frame may
    name any of the 32 recent parents, each with its own budget: one cell
    spent them all (9 MB for a 1 MB budget with 8 earlier cells). What goes
    to another cell's output is charged to one more budget as well."""
    budget_kernel.run("parents = []")
    for _ in range(8):
        run = budget_kernel.run(
            "import sys\nparents.append(sys.modules['sandbox_kernel_worker.streams'].writer_parent())"
        )
        assert run.status == "ok", run.reply
    msg_id = budget_kernel.kc.execute(
        FORGE + "chunk = 'A' * 200_000\n"
        "for parent in parents + [sys.modules['sandbox_kernel_worker.streams'].writer_parent()]:\n"
        "    for _ in range(5):\n"
        "        forge({'type': 'stream', 'name': 'stdout', 'text': chunk, 'parent': parent})\n"
        "print('sent')"
    )
    messages = iopub_until(
        budget_kernel.kc,
        lambda got: any(
            m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] == "status"
            and m["content"]["execution_state"] == "idle"
            for m in got
        ),
        timeout=120,
    )
    published = sum(
        len(m["content"]["text"]) for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )
    routed = sum(
        len(m["content"]["text"])
        for m in messages
        if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") != msg_id
    )
    assert 0 < routed <= BUDGET + 200_000, routed  # the earlier cells still get output, within one budget
    assert published <= 2 * BUDGET + 400_000, f"{published:,} bytes for a budget of {BUDGET:,}"


def test_answers_forged_for_the_next_requests_answer_nothing(kernel: SandboxKernelHandle) -> None:
    """Request ids counted up (x1, x2, ..., q1, ...): a cell queued a DONE
    for the next cells, which then ended before they ran (one said it dropped
    10**400 bytes, and every later cell failed formatting the number), and a
    completion reply whose matches were a number, which got no reply at all.
    Ids cannot be guessed now, and a number of any size is said."""
    assert kernel.run("x = 41").status == "ok"
    forged = kernel.run(
        FORGE + "import threading, time\n"
        "def later():\n"
        "    time.sleep(0.5)\n"
        "    for i in range(1, 60):\n"
        "        for kind in 'xq':\n"
        "            forge({'type': 'done' if kind == 'x' else 'reply', 'id': f'{kind}{i}', 'status': 'ok',\n"
        "                   'dropped_output': 10**400, 'matches': 5, 'cursor_start': 0, 'cursor_end': 0})\n"
        "threading.Thread(target=later).start()\n"
        "print('armed')"
    )
    assert forged.status == "ok" and forged.stdout == "armed\n", forged.reply
    time.sleep(1.5)
    run = kernel.run("print(x + 1)")
    assert run.status == "ok" and run.stdout == "42\n", (run.reply, run.stderr)
    msg_id = kernel.kc.complete("pri", 3)
    reply = kernel.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    assert "print" in reply["content"]["matches"], reply["content"]
    assert kernel.run("print(x + 2)").stdout == "43\n"


def test_a_huge_dropped_count_is_said_not_raised() -> None:
    from sandbox_kernel.outputs import OutputLimiter, format_bytes

    assert format_bytes(10**400).endswith(" MB")
    limiter = OutputLimiter(1000)
    limiter.discarded = 1 << 50
    assert "output truncated" in (limiter.truncation_note() or "")
