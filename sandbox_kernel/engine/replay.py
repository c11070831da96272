"""What must be replayed when state moves to a new sandbox: imports and
module-level function/class definitions, extracted on the host from cell
source (parsing text is safe; nothing is executed here)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from IPython.core.inputtransformer2 import TransformerManager

_transformer = TransformerManager()


def python_source(cell: str) -> str | None:
    """The cell as IPython would run it (magics and ``!`` lines made Python)."""
    try:
        return _transformer.transform_cell(cell)
    except Exception:
        return None


@dataclass
class ReplayLog:
    """Accumulated replayable statements, in order; a later definition of a
    name replaces the earlier one."""

    imports: list[str] = field(default_factory=list)
    defs: dict[str, str] = field(default_factory=dict)

    def record(self, cell: str) -> bool:
        """Add the cell's imports and definitions; whether any were. Linear in the cell's size:
        its lines are split once and only replayable statements are cut out
        (``ast.get_source_segment`` re-splits the whole source per call, which
        made a 4,000-line cell cost 50 s of host CPU)."""
        source = python_source(cell)
        if source is None:
            return False
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return False
        lines: list[str] | None = None
        changed = False
        known = set(self.imports)
        for node in tree.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if lines is None:
                lines = source.splitlines(keepends=True)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                segment = _segment(lines, node)
                if segment is not None and segment not in known:
                    known.add(segment)
                    self.imports.append(segment)
                    changed = True
            else:
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                end = node.end_lineno or node.lineno
                text = "".join(lines[start - 1 : end]).rstrip("\n")
                self.defs.pop(node.name, None)  # keep definition order: re-defined goes last
                self.defs[node.name] = _dedent(text)
                changed = True
        return changed

    def __bool__(self) -> bool:
        return bool(self.imports or self.defs)

    def to_json(self) -> dict[str, object]:
        return {"imports": list(self.imports), "defs": dict(self.defs)}

    @classmethod
    def from_json(cls, data: object) -> ReplayLog:
        log = cls()
        if isinstance(data, dict):
            imports = data.get("imports")
            defs = data.get("defs")
            if isinstance(imports, list):
                log.imports = [s for s in imports if isinstance(s, str)]
            if isinstance(defs, dict):
                log.defs = {k: v for k, v in defs.items() if isinstance(k, str) and isinstance(v, str)}
        return log


def _segment(lines: list[str], node: ast.stmt) -> str | None:
    """``ast.get_source_segment`` on lines split once (columns are UTF-8 byte offsets)."""
    end_lineno, end_col = node.end_lineno, node.end_col_offset
    if end_lineno is None or end_col is None:
        return None
    first, last = node.lineno - 1, end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : end_col].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    tail = lines[last].encode()[:end_col].decode()
    return head + "".join(lines[first + 1 : last]) + tail


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)
