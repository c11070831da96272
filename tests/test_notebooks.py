"""nbclient and papermill run notebooks on the sandboxed kernel."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
from kernel_helpers import require_bwrap
from nbclient import NotebookClient


def build_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "sandbox-python", "display_name": "Python 3 (sandboxed)", "language": "python"}
    params = nbformat.v4.new_code_cell("n = 3\nlabel = 'default'")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("import pandas as pd\nimport matplotlib.pyplot as plt"),
        nbformat.v4.new_code_cell("def squares(k):\n    return [i * i for i in range(k)]"),
        nbformat.v4.new_code_cell(
            "class Report:\n    def __init__(self, label):\n        self.label = label\n    def title(self):\n        return f'report: {self.label}'"
        ),
        nbformat.v4.new_code_cell("df = pd.DataFrame({'i': range(n), 'sq': squares(n)})\ndf"),
        nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nax.plot(df['i'], df['sq'])\nplt.show()"),
        nbformat.v4.new_code_cell("print(Report(label).title(), int(df['sq'].sum()))"),
    ]
    return nb


def check_outputs(nb: nbformat.NotebookNode, label: str, total: int) -> None:
    table = nb.cells[4].outputs[0]
    assert table["output_type"] == "execute_result"
    assert "<table" in table["data"]["text/html"]
    assert any("image/png" in o.get("data", {}) for o in nb.cells[5].outputs)
    assert nb.cells[6].outputs[0]["text"] == f"report: {label} {total}\n"


def test_nbclient_runs_a_notebook(tmp_path: Path) -> None:
    require_bwrap()
    nb = build_notebook()
    NotebookClient(
        nb, kernel_name="sandbox-python", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    check_outputs(nb, "default", 0 + 1 + 4)
    nbformat.validate(nb)


def test_papermill_injects_parameters(tmp_path: Path) -> None:
    require_bwrap()
    source = tmp_path / "in.ipynb"
    target = tmp_path / "out.ipynb"
    nbformat.write(build_notebook(), source)
    papermill.execute_notebook(
        str(source),
        str(target),
        parameters={"n": 5, "label": "weekly"},
        kernel_name="sandbox-python",
        cwd=str(tmp_path),
        progress_bar=False,
    )
    nb = nbformat.read(target, as_version=4)
    # papermill inserts an "injected-parameters" cell after the parameters cell
    assert "injected-parameters" in nb.cells[1].metadata.get("tags", [])
    nb.cells.pop(1)
    check_outputs(nb, "weekly", sum(i * i for i in range(5)))
