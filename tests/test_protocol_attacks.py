"""Every field of sandbox origin that a frontend may render passes the output
policy (class 5), and malformed requests get an error reply naming the field
while the kernel stays responsive and keeps its state (class 8)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from frames import read_frame
from kernel_helpers import SandboxKernelHandle, bwrap_kernel


def request(k: SandboxKernelHandle, msg_type: str, content: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    """Send a raw shell request (any content, as a hostile client would) and
    return its reply's content."""
    msg = k.kc.session.msg(msg_type, content)
    session = k.kc.session
    packer = session.pack
    # ASCII-escaped JSON carries what jupyter_client refuses to encode (lone
    # surrogates): a hostile client is not bound by it
    session.pack = lambda obj: json.dumps(obj, ensure_ascii=True, default=str).encode()
    try:
        k.kc.shell_channel.send(msg)
    finally:
        session.pack = packer
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = k.kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]
    raise AssertionError(f"no reply to {msg_type}")


def execute(k: SandboxKernelHandle, **content: Any) -> dict[str, Any]:
    base = {
        "code": "",
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": False,
    }
    return request(k, "execute_request", {**base, **content})


# ---- class 5: what reaches the frontend ---------------------------------------------------


def test_pager_payload_html_is_sanitised(kernel: SandboxKernelHandle) -> None:
    reply = execute(
        kernel,
        code=(
            "from IPython.core import page\n"
            "page.page({'text/html': '<img src=x onerror=\"fetch(1)\"><b>shown</b>', 'text/plain': 'shown',"
            " 'application/javascript': 'alert(1)'})"
        ),
    )
    assert reply["status"] == "ok", reply
    [payload] = reply["payload"]
    assert payload["source"] == "page"
    html = payload["data"].get("text/html", "")
    assert "onerror" not in html and "<b>shown</b>" in html, payload
    assert "application/javascript" not in payload["data"]


def test_reply_bundles_too_large_to_clean_are_a_note(kernel: SandboxKernelHandle) -> None:
    """Replies are not charged to the cell's output budget and a frame holds
    64 MB: pages of that much held the host's GIL up to 4 s in one cleaning
    call (an attack review). Over 4 MB, a page or an expression's value is a
    note; smaller values are untouched (the pager's own test is above)."""
    reply = execute(
        kernel,
        code=(
            "from IPython.core import page\n"
            "big = '<svg xmlns=\"http://www.w3.org/2000/svg\">' + '<g/>' * 1_500_000 + '</svg>'\n"
            "page.page({'image/svg+xml': big, 'text/plain': 'big'})"
        ),
        user_expressions={"value": "{'text/html': big}", "fine": "len(big)"},
    )
    assert reply["status"] == "ok", reply
    [page] = [p["data"] for p in reply["payload"] if p["source"] == "page"]
    assert list(page) == ["text/plain"] and "too large to clean" in page["text/plain"], page
    value = reply["user_expressions"]["value"]
    assert value["status"] == "ok" and "too large to clean" in value["data"]["text/plain"], value
    assert reply["user_expressions"]["fine"]["data"]["text/plain"] == str(len("<g/>") * 1_500_000 + 46)


def test_help_pager_still_works(kernel: SandboxKernelHandle) -> None:
    reply = execute(kernel, code="zip?")
    assert reply["status"] == "ok" and reply["payload"][0]["source"] == "page"
    assert "zip" in reply["payload"][0]["data"]["text/plain"]


def test_injected_payloads_are_dropped_or_cut(kernel: SandboxKernelHandle) -> None:
    reply = execute(
        kernel,
        code=(
            "ip = get_ipython()\n"
            "ip.payload_manager.write_payload({'source': 'edit_magic', 'filename': '/etc/passwd', 'line_number': 1})\n"
            "ip.payload_manager.write_payload({'source': 'evil', 'data': {'text/html': '<script>x()</script>'}})\n"
            "ip.payload_manager.write_payload({'source': 'ask_exit', 'keepkernel': 'yes', 'extra': '<script>'})\n"
            "ip.set_next_input('print(1)\\x00\\x1b[31m' + 'x' * 200_000)\n"
        ),
    )
    assert reply["status"] == "ok", reply
    sources = [p["source"] for p in reply["payload"]]
    assert "edit_magic" not in sources and "evil" not in sources, reply["payload"]
    exit_payload = next(p for p in reply["payload"] if p["source"] == "ask_exit")
    assert exit_payload == {"source": "ask_exit", "keepkernel": False}
    nxt = next(p for p in reply["payload"] if p["source"] == "set_next_input")
    assert len(nxt["text"]) <= 100_000 and "\x00" not in nxt["text"] and "\x1b" not in nxt["text"]
    assert nxt["text"].startswith("print(1)")


def test_a_failed_cells_payloads_pass_the_policy_too(kernel: SandboxKernelHandle) -> None:
    """A failed cell's reply carries its payloads, as ipykernel's does: the
    same policy cleans them there (and no user_expressions come with it)."""
    reply = execute(
        kernel,
        code=(
            "ip = get_ipython()\n"
            "ip.payload_manager.write_payload({'source': 'edit_magic', 'filename': '/etc/passwd', 'line_number': 1})\n"
            "ip.payload_manager.write_payload({'source': 'page', 'data': {'text/html': "
            "'<b>shown</b><img src=x onerror=\"fetch(1)\">', 'application/javascript': 'x()'}})\n"
            "1/0"
        ),
        user_expressions={"asked": "1"},
    )
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError", reply
    assert [p["source"] for p in reply["payload"]] == ["page"], reply["payload"]
    data = reply["payload"][0]["data"]
    assert "onerror" not in data.get("text/html", "") and "<b>shown</b>" in data["text/html"]
    assert "application/javascript" not in data
    assert reply["user_expressions"] == {}


def test_user_expressions_are_sanitised_and_only_those_asked(kernel: SandboxKernelHandle) -> None:
    reply = execute(
        kernel,
        code="class H:\n    def _repr_html_(self): return '<img src=x onerror=\"fetch(1)\">h'\nh = H()",
        user_expressions={"asked": "h", "bad": "1/0"},
    )
    assert reply["status"] == "ok"
    values = reply["user_expressions"]
    assert set(values) == {"asked", "bad"}
    assert "onerror" not in values["asked"]["data"].get("text/html", "")
    assert values["bad"]["status"] == "error" and values["bad"]["ename"] == "ZeroDivisionError"
    # the sandbox is the attacker: it answers for names nobody asked, with script
    execute(
        kernel,
        code=(
            "ip = get_ipython()\n"
            "ip.user_expressions = lambda e: {**{k: {'status': 'ok', 'data': {'text/html': '<script>x()</script>ok'}, 'metadata': {}} for k in e},"
            " 'injected': {'status': 'ok', 'data': {'text/html': '<script>steal()</script>'}, 'metadata': {}}}"
        ),
    )
    reply = execute(kernel, code="1", user_expressions={"asked": "1"})
    try:
        assert set(reply["user_expressions"]) == {"asked"}, reply["user_expressions"]
        assert "<script" not in str(reply["user_expressions"])
    finally:
        execute(kernel, code="del get_ipython().user_expressions")


def test_completion_and_inspection_data_from_the_sandbox_are_cleaned(kernel: SandboxKernelHandle) -> None:
    execute(
        kernel,
        code=(
            "import sys\n"
            "m = sys.modules['sandbox_kernel_worker.main']\n"
            "saved = (m.Holder._complete, m.Holder._inspect)\n"
            "m.Holder._complete = lambda self, msg, ctl: {'status': 'ok', 'matches': ['a', 7], 'cursor_start': -5, 'cursor_end': 10**9,"
            " 'metadata': {'evil': '<script>', '_jupyter_types_experimental': [{'text': 'a', 'type': '<img onerror=x>' * 1000, 'start': 0, 'end': 1}]}}\n"
            "m.Holder._inspect = lambda self, msg, ctl: {'status': 'ok', 'found': True, 'data': {'text/html': '<script>steal()</script><i>doc</i>',"
            " 'text/plain': 'doc', 'application/javascript': 'x'}, 'metadata': {'evil': 1}}\n"
        ),
    )
    try:
        comp = request(kernel, "complete_request", {"code": "ab", "cursor_pos": 2})
        assert comp["status"] == "ok" and comp["matches"] == ["a"], comp
        assert 0 <= comp["cursor_start"] <= 2 and 0 <= comp["cursor_end"] <= 2
        assert set(comp["metadata"]) <= {"_jupyter_types_experimental"}, comp["metadata"]
        assert all(len(t.get("type", "")) <= 100 for t in comp["metadata"].get("_jupyter_types_experimental", []))
        insp = request(kernel, "inspect_request", {"code": "ab", "cursor_pos": 2, "detail_level": 0})
        assert insp["status"] == "ok" and "<script" not in str(insp["data"]) and insp["metadata"] == {}
        assert "application/javascript" not in insp["data"]
    finally:
        execute(kernel, code="m.Holder._complete, m.Holder._inspect = saved")


#: what a terminal frontend (jupyter console) obeys: OSC 52 sets its clipboard,
#: a status query makes it type its answer into its input, OSC 8 a link
TERMINAL_ATTACK = "\x1b]52;c;ZWNobyBwd25lZAo=\x07\x1b[6n\x1b]8;;http://127.0.0.1:9/\x07here\x1b]8;;\x07"


def test_reply_text_holds_no_sequence_a_terminal_would_obey(kernel: SandboxKernelHandle) -> None:
    """iopub's text was made terminal-safe, the replies' was not: a
    docstring's and a repr's OSC 52 and status query reached the client in the
    pager payload, the inspection and a user expression (an attack review)."""
    execute(
        kernel,
        code=(
            f"class Rigged:\n    {('doc' + TERMINAL_ATTACK)!r}\n"
            f"    def __repr__(self):\n        return {('R' + TERMINAL_ATTACK + chr(27) + '[31mred' + chr(27) + '[0m')!r}\n"
            "rigged = Rigged()"
        ),
    )
    paged = execute(kernel, code="Rigged?")
    inspected = request(kernel, "inspect_request", {"code": "Rigged", "cursor_pos": 6, "detail_level": 0})
    expressed = execute(kernel, code="1", user_expressions={"r": "rigged"})
    texts = {
        "page": [p["data"].get("text/plain", "") for p in paged.get("payload", []) if p.get("source") == "page"],
        "inspect": [inspected["data"].get("text/plain", "")],
        "user_expressions": [expressed["user_expressions"]["r"]["data"].get("text/plain", "")],
    }
    for where, found in texts.items():
        assert found and all("doc" in t or "R" in t for t in found), (where, found)
        for text in found:
            assert "\x1b]" not in text and "\x1b[6n" not in text, (where, text)
    assert "\x1b[31mred" in texts["user_expressions"][0]  # colours are kept, as on iopub


def test_is_complete_answers_code_it_cannot_judge(kernel: SandboxKernelHandle) -> None:
    """IPython's check compiles the code: ``1+1+...`` raised RecursionError,
    and the client never got a reply (an attack review); a long cell is
    judged off the event loop, or "unknown" past 1 MiB."""
    deep = request(kernel, "is_complete_request", {"code": "1" + "+1" * 100_000}, timeout=60)
    assert deep == {"status": "unknown"}, deep
    large = request(kernel, "is_complete_request", {"code": "x = 1\n" * 200_000}, timeout=60)
    assert large == {"status": "unknown"}, large
    assert request(kernel, "is_complete_request", {"code": "for i in x:"}) == {"status": "incomplete", "indent": "    "}
    assert request(kernel, "is_complete_request", {"code": "x = 1"}) == {"status": "complete"}


def test_a_debug_request_is_answered_no_debugger(kernel: SandboxKernelHandle) -> None:
    msg = kernel.kc.session.msg("debug_request", {"type": "request", "seq": 3, "command": "initialize"})
    kernel.kc.control_channel.send(msg)
    reply = kernel.kc.control_channel.get_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    content = reply["content"]
    assert content["success"] is False and content["request_seq"] == 3 and content["command"] == "initialize"
    assert "no debugger" in content["message"]


# ---- class 8: malformed requests -----------------------------------------------------------

BAD_EXECUTES = [
    ({"code": 123}, "code"),
    ({"code": "x = 1\n" * 3_000_000}, "code"),  # 18 MB
    ({"code": "x = '\ud800'"}, "code"),
    ({"code": "1", "silent": "yes"}, "silent"),
    ({"code": "1", "store_history": 3}, "store_history"),
    ({"code": "1", "allow_stdin": None}, "allow_stdin"),
    ({"code": "1", "user_expressions": ["a"]}, "user_expressions"),
    ({"code": "1", "user_expressions": {"a": 5}}, "user_expressions"),
    ({"code": "1", "user_expressions": {"a": "x" * 100_000}}, "user_expressions"),
]


@pytest.mark.parametrize(("content", "field"), BAD_EXECUTES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_EXECUTES)])
def test_malformed_execute_gets_an_error_and_keeps_state(
    kernel: SandboxKernelHandle, content: dict[str, Any], field: str
) -> None:
    assert execute(kernel, code="kept = 'earlier state'")["status"] == "ok"
    reply = execute(kernel, **content)
    assert reply["status"] == "error" and reply["ename"] == "InvalidRequest", reply
    assert field in reply["evalue"], reply["evalue"]
    run = kernel.run("print(kept)")
    assert run.stdout.strip() == "earlier state", (run.stdout, run.stderr, run.errors)


BAD_OTHERS = [
    ("complete_request", {"code": 5, "cursor_pos": 0}, "code"),
    ("complete_request", {"code": "ab", "cursor_pos": -1}, "cursor_pos"),
    ("complete_request", {"code": "ab", "cursor_pos": "x"}, "cursor_pos"),
    ("complete_request", {"code": "ab", "cursor_pos": 10**12}, "cursor_pos"),
    ("inspect_request", {"code": "zip", "cursor_pos": 1, "detail_level": "x"}, "detail_level"),
    ("inspect_request", {"code": None, "cursor_pos": 1, "detail_level": 0}, "code"),
    ("is_complete_request", {"code": "x = 1\n" * 3_000_000}, "code"),
    ("is_complete_request", {"code": ["a"]}, "code"),
    ("history_request", {"hist_access_type": 5, "output": False, "raw": True}, "hist_access_type"),
    ("history_request", {"hist_access_type": "tail", "output": False, "raw": True, "n": "x"}, "n"),
    ("history_request", {"output": False}, "hist_access_type"),
    ("execute_request", {"silent": False}, "code"),
    ("complete_request", {"code": "ab"}, "cursor_pos"),
]


@pytest.mark.parametrize(
    ("msg_type", "content", "field"), BAD_OTHERS, ids=[f"{m}-{f}-{i}" for i, (m, _, f) in enumerate(BAD_OTHERS)]
)
def test_malformed_requests_get_an_error_naming_the_field(
    kernel: SandboxKernelHandle, msg_type: str, content: dict[str, Any], field: str
) -> None:
    reply = request(kernel, msg_type, content)
    assert reply["status"] == "error", reply
    assert field in reply.get("evalue", ""), reply
    assert kernel.run("1 + 1").result["text/plain"] == "2"


def test_unsolicited_and_misdirected_messages_are_ignored(kernel: SandboxKernelHandle) -> None:
    assert execute(kernel, code="kept2 = 5")["status"] == "ok"
    kernel.kc.input("nobody asked")  # input_reply with no prompt open
    for content in ({"comm_id": "no-such-comm", "data": {}}, {"comm_id": "x", "data": "not a dict"}, {"data": {}}):
        kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", content))
    kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_open", {"comm_id": "c1", "target_name": 5, "data": {}}))
    time.sleep(0.5)
    run = kernel.run("print(kept2)")
    assert run.stdout.strip() == "5", (run.stdout, run.stderr)


# ---- text Python can hold and UTF-8 cannot ------------------------------------------------

SURROGATES = r"""
import sys
from IPython.display import display
kept_before = 7
print("a file name read with surrogateescape: caf\udce9")
display({"text/plain": "shown \ud800 here"}, raw=True)
sys.modules["sandbox_kernel_worker.comms"]._channel.send({"type": "stream", "name": "stdout", "text": "raw \udfff\n"})
import time
time.sleep(0.5)
print("still this cell's")
raise ValueError("bad \udc80 value")
"""


def test_lone_surrogates_from_a_cell_reach_the_frontend_replaced_and_lose_nothing(tmp_path: Path) -> None:
    """A str may hold a lone surrogate (a file name decoded with
    surrogateescape, or a frame a cell writes), UTF-8 may not: the host's
    publish raised, the host stopped waiting for a cell still running, its
    later output went under the next request, and that next cell was killed
    at the timeout with every variable of the session. Each now arrives with
    U+FFFD in its place, under its own cell."""
    k = bwrap_kernel(tmp_path, "--SandboxKernel.cell_timeout=20")
    try:
        assert k.stdout_of("kept = 41") == ""
        run = k.run(SURROGATES)
        assert run.status == "error" and run.reply["ename"] == "ValueError", run.reply
        expected = "a file name read with surrogateescape: caf\ufffd\nraw \ufffd\nstill this cell's\n"
        assert run.stdout == expected, run.stdout
        assert [c["data"]["text/plain"] for c in run.of("display_data")] == ["shown \ufffd here"]
        assert run.errors[0]["evalue"] == "bad \ufffd value", run.errors
        assert k.stdout_of("print(kept + 1, kept_before)") == "42 7\n"
    finally:
        k.shutdown()


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"type": "stream", "name": "stdout", "text": "a\\ud800b"}', "a\ufffdb"),  # escaped, lone
        (b'{"type": "stream", "name": "stdout", "text": "\\ud83d\\ude00"}', "\U0001f600"),  # escaped pair
        (b'{"type": "stream", "name": "stdout", "text": "\xed\xa0\xbd\xed\xb8\x80"}', "\U0001f600"),  # raw pair
        (b'{"type": "stream", "name": "stdout", "\xed\xb3\xbf": "x", "text": "\xed\xb3\xbf"}', "\ufffd"),  # key too
        (b'{"type": "stream", "name": "stdout", "text": "\\\\ud800 is text"}', "\\ud800 is text"),  # not one
    ],
)
def test_the_host_reads_frames_without_lone_surrogates(body: bytes, text: str) -> None:
    msg = read_frame(body)
    assert msg["text"] == text
    json.dumps(msg, ensure_ascii=False).encode("utf-8")  # what jupyter_client's packer needs


def test_a_frame_of_too_many_lone_surrogates_is_a_notice() -> None:
    """Each lone surrogate is decoded, then replaced, by an error handler one
    at a time while the host holds the GIL: a 64 MB frame of them held it
    7.4 s (an attack review; the cut watchdog's thread needs it). More than
    ``MAX_FRAME_SURROGATES`` make the frame a notice; up to that many are
    replaced as before."""
    from sandbox_kernel.engine.channel import MAX_FRAME_SURROGATES

    def stream(raw: bytes) -> bytes:
        return b'{"type": "stream", "name": "stdout", "text": "' + raw + b'"}'

    kept = read_frame(stream(b"\xed\xa0\x80" * MAX_FRAME_SURROGATES))
    assert kept["name"] == "stdout" and kept["text"] == "\ufffd" * MAX_FRAME_SURROGATES
    for raw in (b"\xed\xa0\x80" * (21 << 20), b"\\udc80" * (MAX_FRAME_SURROGATES + 1)):
        dropped = read_frame(stream(raw))
        assert dropped["name"] == "stderr" and "lone surrogates" in dropped["text"], dropped["text"][:200]
