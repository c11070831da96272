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

    def record(self, cell: str) -> None:
        source = python_source(cell)
        if source is None:
            return
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        for node in tree.body:
            segment = ast.get_source_segment(source, node)
            if segment is None:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if segment not in self.imports:
                    self.imports.append(segment)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                lines = source.splitlines()
                end = node.end_lineno or node.lineno
                text = "\n".join(lines[start - 1 : end])
                self.defs.pop(node.name, None)  # keep definition order: re-defined goes last
                self.defs[node.name] = _dedent(text)

    def __bool__(self) -> bool:
        return bool(self.imports or self.defs)

    def to_json(self) -> dict[str, object]:
        return {"imports": list(self.imports), "defs": dict(self.defs)}

    @classmethod
    def from_json(cls, data: object) -> "ReplayLog":
        log = cls()
        if isinstance(data, dict):
            imports = data.get("imports")
            defs = data.get("defs")
            if isinstance(imports, list):
                log.imports = [s for s in imports if isinstance(s, str)]
            if isinstance(defs, dict):
                log.defs = {k: v for k, v in defs.items() if isinstance(k, str) and isinstance(v, str)}
        return log


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)
