"""No control character a sandbox chose reaches the terminal that runs the host's
processes through their logs (sandbox_kernel/terminal_text.py).

The attack: a cell writes the checkpoint manifest of its session (the sandbox
writes its own checkpoints) with a "dropped" reason holding OSC 52 (set the
clipboard), OSC 0 (the window title), a C1 CSI and a bidirectional override;
the sandbox dies; the restore's warning quotes the reason in the kernel's
log, which ``jupyter lab`` shows in the user's terminal.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap

from sandbox_kernel.terminal_text import escape_controls, terminal_safe_message, terminal_safe_output

pytestmark = pytest.mark.timeout(180)

CLIPBOARD = "\x1b]52;c;ZWNobyBvd25lZAo=\x07"
TITLE = "\x1b]0;owned\x1b\\"
REASON = f"{CLIPBOARD}{TITLE}\x9b2J\u202egnp.exe\r"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def test_escape_controls_writes_every_control_as_text() -> None:
    assert escape_controls(REASON) == ("\\x1b]52;c;ZWNobyBvd25lZAo=\\x07\\x1b]0;owned\\x1b\\\\x9b2J\\u202egnp.exe\\r")
    assert escape_controls("line one\n\tline two: ünïcode ✓") == "line one\n\tline two: ünïcode ✓"
    assert escape_controls("\x00\x7f\u2066") == "\\x00\\x7f\\u2066"


def test_a_reason_the_sandbox_wrote_reaches_the_kernels_log_as_text(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    log_file = tmp_path / "kernel-stderr.log"
    with log_file.open("wb") as log:
        kernel = SandboxKernelHandle(
            tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=bwrap"], stderr=log
        )
        try:
            # the cell number is the sandbox's to write too: only a number is quoted
            manifest = {"cell": "1]; your session is public again [", "dropped": {"y": REASON}}
            run = kernel.run(
                "x = 1\nimport json\n"
                f"json.dump({json.dumps(manifest)}, open('/.sandbox_kernel/state/checkpoint.json', 'w'))"
            )
            assert run.status == "ok", run.errors
            assert kernel.kill_sandboxes() >= 1
            run = kernel.run("print(x)")
            assert "Dropped: y (" in run.stderr, run.stderr  # the restore quoted the manifest
            assert "public again" not in run.stderr and "no cell had finished" in run.stderr, run.stderr
        finally:
            kernel.shutdown()
    written = log_file.read_text(errors="replace")
    assert "Dropped: y (\\x1b]52;c;ZWNobyBvd25lZAo=\\x07" in written, written[-2000:]
    assert not [c for c in RAW if c in written], [c for c in RAW if c in written]


def _stderr_of(script: str) -> str:
    """What ``script`` (run in a fresh interpreter) wrote to stderr, which
    must hold none of the raw control characters of :data:`REASON`."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert not [c for c in RAW if c in done.stderr], done.stderr
    return done.stderr


def test_the_packages_own_loggers_write_through_the_safe_formatter(tmp_path: Path) -> None:
    """Module loggers (sandbox_kernel.engine, .privacy, .sandbox...) go
    through the application's handler, not logging's last resort."""
    script = (
        "import logging\n"
        "from sandbox_kernel.app import SandboxKernelApp\n"
        "app = SandboxKernelApp()\n"
        "app._configure_logging()\n"
        f"logging.getLogger('sandbox_kernel.privacy').warning('reason: %s', {REASON!r})\n"
        f"app.log.warning('app: %s', {REASON!r})\n"
    )
    stderr = _stderr_of(script)
    assert "reason: \\x1b]52;c;" in stderr, stderr
    assert "app: \\x1b]52;c;" in stderr, stderr
    assert "[sandbox_kernel.privacy] WARNING |" in stderr


def test_the_mcp_servers_log_is_escaped() -> None:
    script = (
        "import logging\n"
        "from sandbox_kernel.tools.mcp_app import MCPServerApp\n"
        "app = MCPServerApp()\n"
        "app.initialize(['--backend', 'subprocess'])\n"
        "app.init_root_logging()\n"
        f"logging.getLogger('sandbox_kernel.tools.mcp').error('fatal tool error: %s', {REASON!r})\n"
        f"app.log.warning('app: %s', {REASON!r})\n"
    )
    stderr = _stderr_of(script)
    assert "fatal tool error: \\x1b]52;c;" in stderr, stderr
    assert "app: \\x1b]52;c;" in stderr, stderr


# ---- a cell's output, on its way to terminal frontends --------------------------------

ESCAPES = {
    "clipboard (OSC 52, BEL)": "\x1b]52;c;ZWNobyBvd25lZAo=\x07",
    "title (OSC 0, ST)": "\x1b]0;owned\x1b\\",
    "hyperlink (OSC 8)": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "tmux passthrough (DCS)": "\x1bPtmux;\x1b\x1b]52;c;YQ==\x07\x1b\\",
    "alternate screen (CSI ?h)": "\x1b[?1049h",
    "bracketed paste off (CSI ?l)": "\x1b[?2004l",
    "device status query (CSI n)": "\x1b[6n",
    "C1 CSI": "\x9b2J",
    "C1 OSC": "\x9d0;owned\x9c",
    "report title (CSI t)": "\x1b[21t",
    "unended OSC": "\x1b]52;c;",
    "lone ESC at the end": "\x1b",
    "bell and NUL": "\x07\x00",
}


def _no_escape_but_colours(text: str) -> bool:
    """No control character but newline, carriage return, tab and backspace
    once the colour (SGR) sequences and plain cursor moves are taken out."""
    rest = re.sub(r"\x1b\[[0-9;:]*m|\x1b\[[0-9;]*[A-HJKf]", "", text)
    return re.search(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]", rest) is None


@pytest.mark.parametrize("name", list(ESCAPES))
def test_output_keeps_colours_and_loses_every_other_sequence(name: str) -> None:
    text = f"before \x1b[1;31mred\x1b[0m {ESCAPES[name]}\nafter\r\n\tdone\b"
    safe = terminal_safe_output(text)
    assert _no_escape_but_colours(safe), repr(safe)
    assert safe.startswith("before \x1b[1;31mred\x1b[0m ") and safe.endswith("\nafter\r\n\tdone\b"), repr(safe)
    plain = terminal_safe_output(text, keep_colours=False)
    assert "\x1b" not in plain and plain.startswith("before red "), repr(plain)


def test_clear_and_progress_bars_keep_their_cursor_moves() -> None:
    assert terminal_safe_output("\x1b[H\x1b[2J") == "\x1b[H\x1b[2J"  # %clear
    assert terminal_safe_output("\r 50%\x1b[K\x1b[1A") == "\r 50%\x1b[K\x1b[1A"
    assert terminal_safe_output("\x1b[H\x1b[2J", keep_colours=False) == ""


def test_a_sequence_split_between_two_outputs_is_not_completed() -> None:
    """Stream text arrives in pieces: each piece is made safe alone, so no
    piece may end with the start of a sequence the next one finishes."""
    first, second = terminal_safe_output("text\x1b"), terminal_safe_output("]52;c;YQ==\x07")
    assert "\x1b" not in first + second and "\x07" not in first + second


def test_plain_text_is_left_as_it_is() -> None:
    text = "naïve ünïcode ✓ 表 \u202eright-to-left\u202c, tabs\tand lines\n"
    assert terminal_safe_output(text) is text


def test_the_messages_a_terminal_frontend_prints_are_made_safe() -> None:
    osc = ESCAPES["clipboard (OSC 52, BEL)"]
    stream = terminal_safe_message("stream", {"name": "stdout", "text": f"a{osc}b"})
    assert stream == {"name": "stdout", "text": "ab"}
    error = terminal_safe_message(
        "error", {"ename": f"E{osc}", "evalue": f"v{osc}", "traceback": [f"\x1b[31mline{osc}\x1b[0m"]}
    )
    assert error == {"ename": "E", "evalue": "v", "traceback": ["\x1b[31mline\x1b[0m"]}
    shown = terminal_safe_message(
        "execute_result", {"data": {"text/plain": f"x{osc}", "text/html": f"<b>{osc}</b>"}, "execution_count": 1}
    )
    assert shown["data"] == {"text/plain": "x", "text/html": f"<b>{osc}</b>"}  # HTML: the output policy's job
    assert terminal_safe_message("status", {"execution_state": "idle"}) == {"execution_state": "idle"}


def test_a_cells_output_reaches_frontends_without_terminal_sequences(tmp_path: Path) -> None:
    """What ``jupyter console`` prints (streams, errors, text/plain, the input
    prompt, the reply's traceback) holds no sequence but colours, whichever
    way the cell wrote it."""
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    kernel = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=bwrap"])
    osc = ESCAPES["clipboard (OSC 52, BEL)"] + ESCAPES["title (OSC 0, ST)"] + ESCAPES["C1 CSI"]
    try:
        run = kernel.run(
            "import os, subprocess, sys\n"
            f"OSC = {osc!r}\n"
            "print('print' + OSC)\n"
            "sys.stderr.write('stderr' + OSC + '\\n')\n"
            "os.write(1, ('fd1' + OSC + '\\n').encode())\n"
            "subprocess.run(['printf', 'child%s\\\\n', OSC])\n"
            "from IPython.display import display\n"
            "class Shown:\n"
            "    def __repr__(self): return 'repr' + OSC\n"
            "display(Shown())\n"
            "name = input('prompt' + OSC)\n"
            "raise ValueError('value' + OSC)\n",
            allow_stdin=True,
            stdin_answers=["typed"],
        )
        printed = [m["content"].get("prompt", "") for m in run.messages if m["msg_type"] == "input_request"]
        for msg in run.messages:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                printed.append(content["text"])
            elif msg["msg_type"] == "error":
                printed += [content["ename"], content["evalue"], *content["traceback"]]
            elif msg["msg_type"] in ("display_data", "execute_result"):
                printed.append(content["data"].get("text/plain", ""))
        printed += [run.reply.get("evalue", ""), *run.reply.get("traceback", [])]
        joined = "\n".join(printed)
        for word in ("print", "stderr", "fd1", "child", "repr", "prompt", "value"):
            assert word in joined, (word, joined)
        assert _no_escape_but_colours(joined), repr(joined)
        assert "\x1b[" in "".join(run.reply.get("traceback", [])), "IPython's colours were kept"
    finally:
        kernel.shutdown()
