"""The agent's notebook: cells, their typed outputs, JSON persistence, .ipynb export.

A ``Notebook`` belongs to one (user_id, session_id). It runs cells on the
live engine session attached to it (``notebook.engine``: the same
``sandbox_kernel.engine.Session`` the Jupyter kernel uses), so the namespace,
workspace and private-data ratchet are the kernel's. The notebook is saved
as JSON after every operation, atomically; a file that cannot be read back
is reported (``NotebookCorruptError``) and left untouched.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..outputs import sanitize_bundle
from ..outputs.links import defang_text
from ..worker.language import language_info
from .frozen_json import freeze_dict, join_frozen, split_frozen, thaw_dict

if TYPE_CHECKING:
    from ..engine import Session

MAX_CELLS = 500
#: outputs a notebook keeps in all; beyond, the oldest cells' outputs are dropped.
#: Each call rewrites the whole notebook on the event loop: without a bound, one
#: agent printing 10 MB per cell made every save of every session stall it for
#: seconds (the privacy watcher included), and the file grew toward 5 GB
MAX_NOTEBOOK_BYTES = 32 * 1024 * 1024
MAX_CODE_CHARS = 1_000_000
MAX_TIMEOUT = 3600.0
SCHEMA_VERSION = 1
NOTEBOOK_FILE = "notebook.json"
KERNEL_NAME = "sandbox-python"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


class NotebookError(ValueError):
    """Bad input from the caller (unknown cell, bad code, full notebook...)."""


class NotebookFullError(NotebookError):
    pass


class CellNotFoundError(NotebookError, IndexError):
    pass


class NotebookCorruptError(RuntimeError):
    """The notebook file exists but cannot be read back; it was left as it is."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"the notebook file {path} is corrupt ({reason}); it was left untouched. "
            "Move it away (or repair it) to start a new notebook for this session."
        )
        self.path = path


class CellState(str, enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    TIMEOUT = "timeout"


class OutputType(str, enum.Enum):
    STREAM = "stream"
    EXECUTE_RESULT = "execute_result"
    DISPLAY_DATA = "display_data"
    ERROR = "error"


@dataclass
class CellOutput:
    output_type: OutputType
    #: stream: "stdout" | "stderr"
    name: str | None = None
    text: str | None = None
    #: execute_result / display_data: the (sanitised) MIME bundle; here and in
    #: ``metadata``, a structured value is kept as its text (``FrozenJson``)
    data: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    execution_count: int | None = None
    display_id: str | None = None
    ename: str | None = None
    evalue: str | None = None
    traceback: list[str] | None = None

    @property
    def images(self) -> list[tuple[str, str]]:
        """(mime type, base64 data) of the images in this output."""
        if not self.data:
            return []
        return [(m, self.data[m]) for m in IMAGE_TYPES if isinstance(self.data.get(m), str)]

    @property
    def is_image(self) -> bool:
        return bool(self.images)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("data", "metadata") and value:
                value, frozen = split_frozen(value)
                if frozen:
                    out[f"{f.name}_json"] = frozen
            if value not in (None, {}):
                out[f.name] = list(value) if f.name == "traceback" else value
        out["output_type"] = self.output_type.value
        return out

    @classmethod
    def from_json(cls, raw: Any) -> CellOutput:
        if not isinstance(raw, dict):
            raise ValueError("an output is not an object")
        kw = {k: raw.get(k) for k in ("name", "text", "execution_count", "display_id", "ename", "evalue", "traceback")}
        data = (
            join_frozen(raw.get("data"), raw.get("data_json"), "data") if "data" in raw or "data_json" in raw else None
        )
        metadata = join_frozen(raw.get("metadata"), raw.get("metadata_json"), "metadata")
        return cls(output_type=OutputType(raw.get("output_type")), data=data, metadata=metadata, **kw)


@dataclass
class Cell:
    code: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    state: CellState = CellState.IDLE
    outputs: list[CellOutput] = field(default_factory=list)
    execution_count: int | None = None
    started_at: float | None = None
    duration: float | None = None
    #: set when this cell's execution raised the session's private-data level
    privacy_raised: dict[str, Any] | None = None

    @property
    def stdout(self) -> str:
        return "".join(o.text or "" for o in self.outputs if o.output_type == OutputType.STREAM and o.name == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(o.text or "" for o in self.outputs if o.output_type == OutputType.STREAM and o.name == "stderr")

    @property
    def error(self) -> CellOutput | None:
        errors = [o for o in self.outputs if o.output_type == OutputType.ERROR]
        return errors[-1] if errors else None

    @property
    def result(self) -> dict[str, Any] | None:
        results = [o for o in self.outputs if o.output_type == OutputType.EXECUTE_RESULT]
        return thaw_dict(results[-1].data) if results else None

    @property
    def images(self) -> list[tuple[str, str]]:
        return [img for o in self.outputs for img in o.images]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "code": self.code,
            "state": self.state.value,
            "outputs": [o.to_json() for o in self.outputs],
            "execution_count": self.execution_count,
            "started_at": self.started_at,
            "duration": self.duration,
            "privacy_raised": self.privacy_raised,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Cell:
        if not isinstance(raw, dict) or not isinstance(raw.get("code"), str) or not isinstance(raw.get("id"), str):
            raise ValueError("a cell is not an object with 'id' and 'code' strings")
        return cls(
            code=raw["code"],
            id=raw["id"],
            state=CellState(raw.get("state", "idle")),
            outputs=[CellOutput.from_json(o) for o in raw.get("outputs") or []],
            execution_count=raw.get("execution_count"),
            started_at=raw.get("started_at"),
            duration=raw.get("duration"),
            privacy_raised=raw.get("privacy_raised"),
        )


#: characters of a stream's end defanged again when the next chunk joins it:
#: longer than any link marker (``javascript:``) and the boundary before it
_SEAM = 16


#: output events (stream chunks, displays, updates...) one cell's collector
#: takes: the budget counts bytes, and a cell's 400,000 one-character outputs
#: held 210 MiB of the agent's process and stalled its event loop (the privacy
#: watcher's too) for 25 s at each later save (an attack review)
MAX_OUTPUT_EVENTS = 20_000
#: a stream output is joined up to this many characters, then another begins:
#: each chunk joined copies the text before it
STREAM_PIECE = 64 * 1024


class OutputCollector:
    """Turns the engine's iopub-style events into a cell's outputs."""

    def __init__(self, cell: Cell, private: Callable[[], bool] = lambda: False) -> None:
        self.cell = cell
        self._clear_pending = False
        #: whether the session is private now: its streams are defanged chunk by
        #: chunk by the engine, and a marker split across two chunks is whole
        #: again once they are joined here
        self._private = private
        self._events = 0
        #: the outputs of each display id (an update looked through every output)
        self._displays: dict[str, list[CellOutput]] = {}

    def _clear(self) -> None:
        self.cell.outputs.clear()
        self._displays.clear()

    def __call__(self, kind: str, content: dict[str, Any]) -> None:
        outputs = self.cell.outputs
        if kind.startswith("comm_"):
            return  # widgets: an agent has no frontend to show them
        self._events += 1
        if self._events > MAX_OUTPUT_EVENTS:
            if self._events == MAX_OUTPUT_EVENTS + 1:
                note = (
                    f"[sandbox_kernel] more than {MAX_OUTPUT_EVENTS:,} outputs: the rest of this cell's are dropped\n"
                )
                outputs.append(CellOutput(OutputType.STREAM, name="stderr", text=note))
            return
        if kind == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        if kind == "update_display_data":
            display_id = (content.get("transient") or {}).get("display_id")
            for out in self._displays.get(display_id, []) if isinstance(display_id, str) else []:
                out.data = freeze_dict(content.get("data"))
                out.metadata = freeze_dict(content.get("metadata"))
            return
        if self._clear_pending:
            self._clear()
            self._clear_pending = False
        if kind == "stream":
            name, text = content.get("name"), content.get("text") or ""
            last = outputs[-1] if outputs else None
            if (
                last is not None
                and last.output_type == OutputType.STREAM
                and last.name == name
                and len(last.text or "") < STREAM_PIECE
            ):
                before = outputs[-1].text or ""
                if self._private():
                    # only the seam is defanged again (a marker is a few
                    # characters long): joining stays linear in the output
                    keep = max(0, len(before) - _SEAM)
                    outputs[-1].text = before[:keep] + defang_text(before[keep:] + text)
                else:
                    outputs[-1].text = before + text
            else:
                outputs.append(CellOutput(OutputType.STREAM, name=name, text=text))
        elif kind == "display_data":
            display_id = (content.get("transient") or {}).get("display_id")
            shown = CellOutput(
                OutputType.DISPLAY_DATA,
                data=freeze_dict(content.get("data")),
                metadata=freeze_dict(content.get("metadata")),
                display_id=display_id,
            )
            outputs.append(shown)
            if isinstance(display_id, str) and display_id:
                self._displays.setdefault(display_id, []).append(shown)
        elif kind == "execute_result":
            outputs.append(
                CellOutput(
                    OutputType.EXECUTE_RESULT,
                    data=freeze_dict(content.get("data")),
                    metadata=freeze_dict(content.get("metadata")),
                    execution_count=content.get("execution_count"),
                )
            )
        elif kind == "error":
            outputs.append(
                CellOutput(
                    OutputType.ERROR,
                    ename=content.get("ename"),
                    evalue=content.get("evalue"),
                    traceback=list(content.get("traceback") or []),
                )
            )


def _outputs_size(cell: Cell) -> int:
    return len(json.dumps([o.to_json() for o in cell.outputs], ensure_ascii=False))


def _dropped_note(max_bytes: int) -> str:
    return (
        f"[sandbox_kernel] this cell's outputs were dropped: the notebook keeps at most "
        f"{max_bytes / (1024 * 1024):g} MB of outputs, the oldest cells' go first\n"
    )


def _atomic_write(path: Path, text: str) -> None:
    # (a short name: "." + a 250-character name + the random part is too long)
    fd, tmp = tempfile.mkstemp(prefix=".~sk-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise NotebookError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise NotebookError(f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds, got {timeout!r}")
    return float(timeout)


def check_code(code: Any) -> str:
    if not isinstance(code, str):
        raise NotebookError(f"code must be a string, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise NotebookError(f"code is too long ({len(code)} characters, at most {MAX_CODE_CHARS})")
    problem = unicode_problem(code)
    if problem:
        # (a notebook holding it could not be saved again: every later call failed)
        raise NotebookError(f"code {problem}")
    return code


def unicode_problem(text: str) -> str:
    """Why ``text`` is not valid Unicode (a lone surrogate, which Python's API
    accepts and no JSON or UTF-8 writer does), or ""."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds a lone surrogate ({text[exc.start]!r}) at character {exc.start}: not valid Unicode"
    return ""


class Notebook:
    """The cells of one agent session, persisted at ``path`` (a JSON file)."""

    def __init__(
        self,
        user_id: str,
        session_id: str,
        path: Path,
        max_cells: int = MAX_CELLS,
        max_bytes: int = MAX_NOTEBOOK_BYTES,
    ) -> None:
        self.user_id = user_id
        self.session_id = session_id
        self.path = path
        self.max_cells = max_cells
        self.max_bytes = max_bytes
        #: the JSON size of each finished cell's outputs, by cell id
        self._sizes: dict[str, int] = {}
        self.cells: list[Cell] = []
        self.execution_count = 0
        self.created_at = time.time()
        #: every rise of the private-data level seen while running a cell
        self.privacy_events: list[dict[str, Any]] = []
        #: the engine's replay log (imports and definitions), for resuming after expiry
        self.replay: dict[str, Any] = {}
        self.engine: Session | None = None

    # ---- persistence -----------------------------------------------------------------
    @classmethod
    def load(
        cls,
        user_id: str,
        session_id: str,
        path: Path,
        max_cells: int = MAX_CELLS,
        max_bytes: int = MAX_NOTEBOOK_BYTES,
    ) -> Notebook:
        """Load the notebook from ``path``, or a new empty one when it does not exist."""
        nb = cls(user_id, session_id, path, max_cells, max_bytes)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return nb
        except (OSError, UnicodeDecodeError) as exc:
            raise NotebookCorruptError(path, f"unreadable: {exc}") from exc
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or raw.get("version") != SCHEMA_VERSION:
                raise ValueError(f"not a version-{SCHEMA_VERSION} notebook record")
            if raw.get("user_id") != user_id or raw.get("session_id") != session_id:
                raise ValueError("it belongs to another user or session")
            nb.cells = [Cell.from_json(c) for c in raw.get("cells") or []]
            nb.execution_count = int(raw.get("execution_count") or 0)
            nb.created_at = float(raw.get("created_at") or nb.created_at)
            events = raw.get("privacy_events") or []
            replay = raw.get("replay") or {}
            if not isinstance(events, list) or not isinstance(replay, dict):
                raise ValueError("bad privacy_events or replay")
            nb.privacy_events, nb.replay = events, replay
        except (ValueError, TypeError, KeyError) as exc:
            raise NotebookCorruptError(path, str(exc)) from exc
        for cell in nb.cells:  # the process stopped while it ran
            if cell.state == CellState.RUNNING:
                cell.state = CellState.ERROR
                cell.outputs.append(
                    CellOutput(
                        OutputType.ERROR,
                        ename="Interrupted",
                        evalue="the tool server stopped while this cell ran",
                        traceback=[],
                    )
                )
        return nb

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "created_at": self.created_at,
            "execution_count": self.execution_count,
            "cells": [c.to_json() for c in self.cells],
            "privacy_events": self.privacy_events,
            "replay": self.replay,
        }

    def save(self) -> None:
        _atomic_write(self.path, json.dumps(self.to_json(), ensure_ascii=False))

    async def save_off_loop(self) -> None:
        """:meth:`save`, the write and its fsync in a thread: the JSON is made
        here, so no thread reads cells the loop may be changing."""
        text = json.dumps(self.to_json(), ensure_ascii=False)
        await asyncio.to_thread(_atomic_write, self.path, text)

    def _fit_budget(self, current: Cell) -> None:
        """Drop the oldest cells' outputs (``current``'s last) until all of them
        fit in ``max_bytes``, each replaced by a note saying why. Sizes of
        finished cells are kept, so a call costs the size of the newest ones."""
        # the newest outputs: this cell's, and the last cells' (a thread of the
        # last one may still have printed into it)
        for cell in [current, *(c for c in self.cells[-2:] if c is not current)]:
            self._sizes[cell.id] = _outputs_size(cell)
        known = self._sizes  # cells deleted since are left out
        self._sizes = {c.id: known[c.id] if c.id in known else _outputs_size(c) for c in self.cells}
        total = sum(self._sizes.values())
        note = _dropped_note(self.max_bytes)
        for cell in [c for c in self.cells if c is not current] + [current]:
            if total <= self.max_bytes:
                return
            if not cell.outputs or (len(cell.outputs) == 1 and cell.outputs[0].text == note):
                continue
            cell.outputs = [CellOutput(OutputType.STREAM, name="stderr", text=note)]
            size = _outputs_size(cell)
            total -= self._sizes[cell.id] - size
            self._sizes[cell.id] = size

    # ---- cells -----------------------------------------------------------------------
    def get_cell(self, number: Any) -> Cell:
        if isinstance(number, bool) or not isinstance(number, int):
            raise CellNotFoundError(f"cell number must be an integer, got {number!r}")
        if not 0 <= number < len(self.cells):
            have = f"cells 0-{len(self.cells) - 1}" if self.cells else "no cells"
            raise CellNotFoundError(f"there is no cell {number}: the notebook has {have}")
        return self.cells[number]

    def index_of(self, cell: Cell) -> int:
        return next(i for i, c in enumerate(self.cells) if c is cell)

    async def add_cell(self, code: str, execute: bool = True, timeout: float = 30, number: int | None = None) -> Cell:
        check_code(code)
        timeout = check_timeout(timeout)
        if len(self.cells) >= self.max_cells:
            raise NotebookFullError(
                f"the notebook is full ({self.max_cells} cells, the maximum): delete cells or clear the notebook first"
            )
        if number is not None and (
            isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= len(self.cells)
        ):
            raise CellNotFoundError(
                f"cannot insert at position {number!r}: use 0-{len(self.cells)} or leave it empty to append"
            )
        cell = Cell(code=code)
        if number is None:
            self.cells.append(cell)
        else:
            self.cells.insert(number, cell)
        self.save()
        if execute:
            await self.execute_cell(cell, timeout)
        return cell

    async def rerun_cell(self, number: int, timeout: float = 30) -> Cell:
        timeout = check_timeout(timeout)
        cell = self.get_cell(number)
        await self.execute_cell(cell, timeout)
        return cell

    def delete_cell(self, number: int) -> Cell:
        cell = self.get_cell(number)
        del self.cells[number]
        self.save()
        return cell

    def clear(self) -> int:
        """Remove every cell (the session's variables stay: they live in the engine)."""
        n = len(self.cells)
        self.cells.clear()
        self.save()
        return n

    async def execute_cell(self, cell: Cell, timeout: float) -> Cell:
        engine = self.engine
        if engine is None:
            raise RuntimeError("this notebook has no engine session attached")
        await engine.refresh_privacy()
        before = engine.ratchet.state if engine.ratchet is not None else None
        self.execution_count += 1
        cell.execution_count = self.execution_count
        cell.outputs = []
        cell.state = CellState.RUNNING
        cell.started_at = time.time()
        cell.duration = None
        cell.privacy_raised = None
        self.save()
        collector = OutputCollector(cell, private=lambda: engine.private)
        t0 = time.monotonic()
        try:
            result = await engine.execute(
                cell.code, execution_count=cell.execution_count, emit=collector, timeout=timeout
            )
        except asyncio.CancelledError:
            cell.state = CellState.ERROR
            cell.duration = time.monotonic() - t0
            self.save()
            raise
        cell.duration = time.monotonic() - t0
        if result.status == "ok":
            cell.state = CellState.COMPLETED
        elif result.status == "died" and "timed out" in (result.evalue or ""):
            cell.state = CellState.TIMEOUT
        else:
            cell.state = CellState.ERROR
        self.replay = engine.replay.to_json()
        if before is not None and engine.ratchet is not None:
            after = engine.ratchet.state
            if after.sensitivity > before.sensitivity or {d.name for d in after.datasets} - {
                d.name for d in before.datasets
            }:
                old = {d.name for d in before.datasets}
                cell.privacy_raised = {
                    "from": before.sensitivity.name,
                    "to": after.sensitivity.name,
                    "datasets": sorted(d.name for d in after.datasets if d.name not in old),
                }
                self.privacy_events.append(
                    {
                        "cell_id": cell.id,
                        "execution_count": cell.execution_count,
                        "at": time.time(),
                        **cell.privacy_raised,
                    }
                )
        self._fit_budget(cell)
        await self.save_off_loop()
        return cell

    # ---- export ----------------------------------------------------------------------
    def to_nbformat(self, privacy: dict[str, Any] | None = None) -> Any:
        import nbformat
        from nbformat import v4

        nb = v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python 3 (sandboxed)", "language": "python"}
        nb.metadata["language_info"] = language_info()
        meta: dict[str, Any] = {
            "version": __version__,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "privacy": {**(privacy or {}), "raised_by": list(self.privacy_events)},
        }
        nb.metadata["sandbox_kernel"] = meta
        # Outputs were cleaned as the session was when they came: once private,
        # the file is cleaned as private outputs are (a remote image a public
        # cell showed would be fetched wherever the export is opened, telling
        # that the private file was; an attack review).
        private = bool((privacy or {}).get("private"))
        text = defang_text if private else _same
        for cell in self.cells:
            out_cells = []
            for o in cell.outputs:
                if o.output_type == OutputType.STREAM:
                    out_cells.append(v4.new_output("stream", name=o.name or "stdout", text=text(o.text or "")))
                elif o.output_type in (OutputType.EXECUTE_RESULT, OutputType.DISPLAY_DATA):
                    data, metadata = _bundle(thaw_dict(o.data)), thaw_dict(o.metadata)
                    if private:
                        clean = sanitize_bundle(data, metadata, private=True)
                        data, metadata = _bundle(clean.data), clean.metadata
                    if o.output_type == OutputType.EXECUTE_RESULT:
                        out_cells.append(
                            v4.new_output(
                                "execute_result", data=data, metadata=metadata, execution_count=cell.execution_count
                            )
                        )
                    else:
                        out_cells.append(v4.new_output("display_data", data=data, metadata=metadata))
                elif o.output_type == OutputType.ERROR:
                    out_cells.append(
                        v4.new_output(
                            "error",
                            ename=text(o.ename or "Error"),
                            evalue=text(o.evalue or ""),
                            traceback=[text(line) for line in o.traceback or []],
                        )
                    )
            nb_cell = v4.new_code_cell(source=cell.code, outputs=out_cells, execution_count=cell.execution_count)
            nb_cell.id = cell.id
            nb_cell.metadata["sandbox_kernel"] = {"state": cell.state.value, "duration": cell.duration}
            if cell.privacy_raised:
                nb_cell.metadata["sandbox_kernel"]["privacy_raised"] = cell.privacy_raised
            nb.cells.append(nb_cell)
        nbformat.validate(nb)
        return nb

    def save_as_ipynb(self, path: Path, privacy: dict[str, Any] | None = None) -> Path:
        import nbformat

        nb = self.to_nbformat(privacy)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, nbformat.writes(nb))
        return path


def _same(text: str) -> str:
    return text


def _bundle(data: dict[str, Any] | None) -> dict[str, Any]:
    """nbformat wants text MIME values as strings and JSON ones as objects."""
    out: dict[str, Any] = {}
    for mime, value in (data or {}).items():
        if mime == "application/json" or mime.endswith("+json") or isinstance(value, str):
            out[mime] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[mime] = "".join(value)
        else:
            out[mime] = json.dumps(value)
    return out
