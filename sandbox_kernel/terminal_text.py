"""Text a sandbox chose, on its way to the terminal that runs the host's processes.

Why: the kernel's log goes to the stderr of ``jupyter lab`` (or of whatever
started the kernel), and the MCP server's to its client's log; both are read
in terminals. Some log lines carry what a sandbox wrote: the names and reasons
of variables a restore dropped come from the checkpoint manifest the sandbox
writes, and error texts quote what the worker sent. A control sequence in
them is obeyed by the terminal: OSC 52 sets the user's clipboard (pasted into
a host shell next), OSC 8 makes a link, CSI and OSC sequences move the cursor
and rewrite what the screen shows, and some terminals answer queries by typing
into their own input. Measured: a cell wrote ``\\x1b]52;c;…\\x07`` into the
manifest, the sandbox died, and the restore's warning sent it to the kernel's
stderr as it was.

So every line the host's loggers write is made visible text first: control
characters but newline and tab, and format characters such as the
bidirectional overrides (which make a terminal show text in another order
than it is) are written as their Python escapes (:func:`escape_controls`).

A cell's own output reaches terminals too: ``jupyter console`` prints it,
``papermill --log-output`` logs it, an agent's command line shows what a tool
returned. :func:`terminal_safe_output` keeps what notebooks use (colours and
text styles; the cursor moves and erasures of ``%clear`` and progress bars;
newline, carriage return, tab, backspace) and removes every other escape
sequence and control character, which JupyterLab does not show anyway.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from tornado.log import LogFormatter
from traitlets.config.application import LevelFormatter


def escape_controls(text: str, keep: str = "\n\t") -> str:
    """``text`` with every character that is not printable (controls, escape,
    format characters such as the bidirectional overrides, line separators)
    written as its Python escape; the characters of ``keep`` stay as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


# In cell output: colours and text styles (SGR) and, with keep_colours, the
# cursor moves and erasures of %clear and progress bars (CSI with numeric
# parameters ending in A-H, J, K or f), kept; any other escape sequence or
# control character removed (those include the queries a terminal answers by
# typing into its input, its modes and its window operations). Strings (OSC,
# DCS, SOS, PM, APC) run to BEL or ST; one not ended in this text loses its
# introducer only, so nothing after it (in this text or the next) can continue it.
_OUTPUT_CONTROLS = re.compile(
    r"(?P<sgr>\x1b\[[0-9;:]*m)"
    r"|(?P<cursor>\x1b\[[0-9;]*[A-HJKf])"
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"  # a string, ended
    r"|\x1b[ -/]*[0-~]"  # nF, Fp, Fe, Fs escapes (the introducer of an unended string too)
    r"|[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]"  # other controls, lone ESC included
)

_MAY_HOLD_CONTROLS = re.compile("[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]")

# The bidirectional controls (embeddings, overrides, isolates, marks): in text
# for an agent, ``invoice_\u202efdp.exe`` is shown as ``invoice_exe.pdf`` by
# whatever displays the tool's result. Other format characters (the zero-width
# joiners of emoji and of Indic and Persian text) are kept.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_AGENT_MAY_HOLD = re.compile(f"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}]")
_AGENT_CONTROLS = re.compile(f"{_OUTPUT_CONTROLS.pattern}|[{_BIDI}]")


def _drop(match: re.Match[str]) -> str:
    return ""


def _keep_styles(match: re.Match[str]) -> str:
    return match.group("sgr") or match.group("cursor") or ""


def terminal_safe_output(text: str, keep_colours: bool = True) -> str:
    """``text`` (a cell's output) with colours, text styles, cursor moves and
    erasures kept (unless not ``keep_colours``: text for an agent) and every
    other escape sequence and control character removed (newline, carriage
    return, tab and backspace kept). Without ``keep_colours`` the
    bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
    U+061C) go too: nothing but a terminal's own rendering needs them."""
    if keep_colours:
        return _OUTPUT_CONTROLS.sub(_keep_styles, text) if _MAY_HOLD_CONTROLS.search(text) else text
    # a function, not "": the substitution then lets other threads in between
    # matches (a 10 MB stream of controls held the GIL 0.8 s in one call)
    return _AGENT_CONTROLS.sub(_drop, text) if _AGENT_MAY_HOLD.search(text) else text


_DISPLAY_KINDS = frozenset({"display_data", "update_display_data", "execute_result"})


def terminal_safe_message(kind: str, content: dict[str, Any]) -> dict[str, Any]:
    """An iopub message's content with :func:`terminal_safe_output` applied to
    what a terminal frontend prints of it: a stream's text, an error's name,
    value and traceback, a display's ``text/plain`` (the same dict when none
    of them holds a control character)."""
    if kind == "stream" and isinstance(content.get("text"), str):
        text = terminal_safe_output(content["text"])
        return content if text is content["text"] else {**content, "text": text}
    if kind == "error":
        from .outputs.sizing import text_of  # (outputs imports this module)

        traceback = content.get("traceback")
        return {
            **content,
            "ename": terminal_safe_output(text_of(content.get("ename", ""))),
            "evalue": terminal_safe_output(text_of(content.get("evalue", ""))),
            "traceback": [terminal_safe_output(text_of(line)) for line in traceback]
            if isinstance(traceback, list)
            else [],
        }
    data = content.get("data")
    if kind in _DISPLAY_KINDS and isinstance(data, dict) and isinstance(data.get("text/plain"), str):
        text = terminal_safe_output(data["text/plain"])
        return content if text is data["text/plain"] else {**content, "data": {**data, "text/plain": text}}
    return content


class TerminalSafeFormatter(LevelFormatter):
    """traitlets' log formatter, whose lines (message, traceback and all) hold
    no control character."""

    def format(self, record: logging.LogRecord) -> str:
        return escape_controls(super().format(record))


class TerminalSafeServerFormatter(LogFormatter):
    """The Jupyter server's log formatter (Tornado's: coloured level and time on
    a terminal) whose records' text (message, arguments, traceback) holds no
    control character. The record is escaped, not the line, so the formatter's
    own colours stay. The server logs paths a sandbox named: "Saving file at
    <path>" on every save of a file whose name (or folder's) holds an escape
    sequence, "Creating new notebook in <folder>", "delete <path>"."""

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)
        safe.msg, safe.args = escape_controls(record.getMessage()), None
        if record.exc_info:
            safe.exc_text = record.exc_text or self.formatException(record.exc_info)
        safe.exc_info = None
        if safe.exc_text:
            safe.exc_text = escape_controls(safe.exc_text)
        if safe.stack_info:
            safe.stack_info = escape_controls(safe.stack_info)
        return super().format(safe)


def make_handlers_terminal_safe(logger: logging.Logger) -> None:
    """Wrap the formatter of every handler of ``logger`` (a handler without
    one gets logging's default format, escaped)."""
    for handler in logger.handlers:
        inner = handler.formatter or logging.Formatter()
        if not isinstance(inner, _Escaping):
            handler.setFormatter(_Escaping(inner))


class _Escaping(logging.Formatter):
    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return escape_controls(self.inner.format(record))


__all__ = [
    "TerminalSafeFormatter",
    "TerminalSafeServerFormatter",
    "escape_controls",
    "make_handlers_terminal_safe",
    "terminal_safe_message",
    "terminal_safe_output",
]
