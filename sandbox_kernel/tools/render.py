"""Compact text an LLM reads well: one cell, or a whole notebook, as plain text.

Long outputs are cut in the middle (head and tail kept) with a note saying how
to get the full text; the full output stays in the notebook. Images are not
put in the text: they are listed by a placeholder and returned next to the
text (MCP image content, PydanticAI binary content).

Once the session is private (``private=True``) every output's text is
defanged here, whatever the engine already did: the text of an HTML-only
output is made here (tags stripped, entities decoded), so ``https&#58;//``
in the sandbox's HTML, harmless in a page, came back as a live
``https://`` for an agent that follows links (guarantee 8; an attack
review), and an exception's class name is any string a cell chooses.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..outputs.links import defang_text
from ..terminal_text import terminal_safe_output
from .notebook import Cell, CellOutput, CellState, Notebook, OutputType

MAX_OUTPUT_CHARS = 4000
MAX_CODE_LINES_IN_LIST = 3
FULL_OUTPUT_CHARS = 200_000

_TAGS = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.S | re.I)


@dataclass
class ToolResult:
    """What a tool returns: text, plus images (mime type, base64) when there are any."""

    text: str
    images: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


def strip_ansi(text: str) -> str:
    """Tool text for an agent: no colours, and none of the sequences a
    terminal showing the result would obey."""
    return terminal_safe_output(text, keep_colours=False)


def truncate(text: str, limit: int, hint: str = "") -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[-(limit - len(head)) :]
    cut = len(text) - len(head) - len(tail)
    note = f"\n[... {cut} characters truncated{'; ' + hint if hint else ''} ...]\n"
    return head + note + tail


def bundle_text(data: dict[str, Any] | None) -> str:
    """The best text form of a MIME bundle."""
    data = data or {}
    for mime in ("text/plain", "text/markdown"):
        text = data.get(mime)
        if isinstance(text, str):
            return text
    if isinstance(data.get("text/html"), str):
        return html.unescape(_TAGS.sub("", data["text/html"])).strip()
    if "application/json" in data:
        return json.dumps(data["application/json"], indent=1)[:FULL_OUTPUT_CHARS]
    kinds = ", ".join(sorted(data)) or "empty"
    return f"[output of type {kinds}]"


def output_text(out: CellOutput, image_counter: list[int], private: bool = False) -> tuple[str, str]:
    """(label, text) of one output, defanged when the session is ``private``."""
    label, text = _output_text(out, image_counter)
    return label, defang_text(text) if private else text


def _output_text(out: CellOutput, image_counter: list[int]) -> tuple[str, str]:
    if out.output_type == OutputType.STREAM:
        return (out.name or "stdout", strip_ansi(out.text or ""))
    if out.output_type == OutputType.ERROR:
        tb = "\n".join(strip_ansi(line) for line in out.traceback or [])
        return ("error", tb or f"{out.ename}: {out.evalue}")
    if out.images:
        parts = []
        for mime, _ in out.images:
            image_counter[0] += 1
            parts.append(f"[image #{image_counter[0]}: {mime}]")
        alt = (out.data or {}).get("text/plain")
        if isinstance(alt, str):
            parts.append(alt)
        return ("display" if out.output_type == OutputType.DISPLAY_DATA else "result", "\n".join(parts))
    label = "result" if out.output_type == OutputType.EXECUTE_RESULT else "display"
    return (label, strip_ansi(bundle_text(out.data)))


def render_cell(
    cell: Cell,
    number: int,
    *,
    full: bool = False,
    limit: int = MAX_OUTPUT_CHARS,
    show_code: bool = True,
    private: bool = False,
) -> ToolResult:
    count = cell.execution_count if cell.execution_count is not None else " "
    head = f"Cell {number} [{count}] {cell.state.value.upper()}"
    if cell.duration is not None:
        head += f" ({cell.duration:.2f} s)"
    lines = [head]
    if show_code:
        lines += ["--- code ---", cell.code]
    budget = FULL_OUTPUT_CHARS if full else limit
    images: list[tuple[str, str]] = []
    counter = [0]
    hint = f"call repl_show_cell({number}, full=True) for the full output"
    for out in cell.outputs:
        label, text = output_text(out, counter, private)
        images += out.images
        lines.append(f"--- {label} ---")
        lines.append(truncate(text.rstrip("\n"), budget, "" if full else hint))
    if not cell.outputs and cell.state in (CellState.COMPLETED,):
        lines.append("(no output)")
    if cell.state == CellState.IDLE:
        lines.append("(not executed)")
    if cell.privacy_raised:
        p = cell.privacy_raised
        ds = f" (datasets: {', '.join(p.get('datasets') or [])})" if p.get("datasets") else ""
        lines.append(f"--- privacy --- this cell raised the session from {p.get('from')} to {p.get('to')}{ds}")
    return ToolResult("\n".join(lines), images)


def render_notebook(nb: Notebook, header: str = "", private: bool = False) -> str:
    if not nb.cells:
        return (header + "\n" if header else "") + "The notebook is empty."
    lines = [header] if header else []
    lines.append(f"Notebook of session {nb.session_id}: {len(nb.cells)} cell(s)")
    for i, cell in enumerate(nb.cells):
        count = cell.execution_count if cell.execution_count is not None else " "
        code_lines = cell.code.splitlines() or [""]
        shown = "\n    ".join(code_lines[:MAX_CODE_LINES_IN_LIST])
        more = (
            f"\n    ... ({len(code_lines) - MAX_CODE_LINES_IN_LIST} more lines)"
            if len(code_lines) > MAX_CODE_LINES_IN_LIST
            else ""
        )
        summary = ""
        if cell.state == CellState.ERROR and cell.error is not None:
            summary = f" -> {cell.error.ename}: {truncate(cell.error.evalue or '', 200)}"
            summary = defang_text(summary) if private else summary
        elif cell.outputs:
            counter = [0]
            first = " ".join(output_text(o, counter, private)[1] for o in cell.outputs).strip().replace("\n", " ")
            summary = f" -> {truncate(first, 120)}" if first else ""
        lines.append(f"[{i}] ({count}) {cell.state.value.upper()}{summary}\n    {shown}{more}")
    return "\n".join(lines)
