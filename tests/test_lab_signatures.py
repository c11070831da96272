"""A save signs no notebook that carries saved widget state (sandbox_kernel.lab_signatures).

Jupyter's contents manager signs on save every notebook whose code cells show
no rich output: a sandbox's notebook with anywidget state and a stream output
was signed by a plain Ctrl+S, and opened again it ran its script in Lab
(tests/browser/test_saved_widget_state.py attacks that in a browser). The
control here is jupyter_server's own contents manager, unchanged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_server.services.contents.filemanager import FileContentsManager
from nbformat.sign import NotebookNotary

from sandbox_kernel.lab_signatures import holds_widget_state, sign_no_widget_state

STATE = {
    "application/vnd.jupyter.widget-state+json": {
        "version_major": 2,
        "version_minor": 0,
        "state": {"5a7e": {"model_name": "AnyModel", "model_module": "anywidget", "state": {"_esm": "x"}}},
    }
}


def _notebook(widgets: Any = None) -> dict[str, Any]:
    nb = nbformat.v4.new_notebook(  # type: ignore[no-untyped-call]
        cells=[
            nbformat.v4.new_code_cell(  # type: ignore[no-untyped-call]
                "print('report ready')",
                outputs=[nbformat.v4.new_output("stream", text="report ready\n")],  # type: ignore[no-untyped-call]
            )
        ]
    )
    if widgets is not None:
        nb.metadata["widgets"] = widgets
    return dict(nb)


def _manager(tmp_path: Path, guarded: bool) -> tuple[FileContentsManager, NotebookNotary]:
    notary_dir = tmp_path / "notary"
    notary_dir.mkdir(exist_ok=True)
    cm = FileContentsManager(root_dir=str(tmp_path))
    cm.notary = NotebookNotary(data_dir=str(notary_dir))
    if guarded:
        sign_no_widget_state(cm, logging.getLogger("test"))
    return cm, cm.notary


def _saved_and_signed(cm: FileContentsManager, notary: NotebookNotary, name: str, nb: dict[str, Any]) -> bool:
    cm.save({"type": "notebook", "format": "json", "content": nb}, name)
    return bool(notary.check_signature(nbformat.read(str(Path(cm.root_dir) / name), as_version=4)))  # type: ignore[no-untyped-call]


def test_a_save_signs_no_notebook_with_saved_widget_state(tmp_path: Path) -> None:
    cm, notary = _manager(tmp_path, guarded=False)
    assert _saved_and_signed(cm, notary, "control.ipynb", _notebook(STATE))  # the control: signed
    cm, notary = _manager(tmp_path, guarded=True)
    assert not _saved_and_signed(cm, notary, "report.ipynb", _notebook(STATE))
    kept = nbformat.read(str(tmp_path / "report.ipynb"), as_version=4)  # type: ignore[no-untyped-call]
    assert kept.metadata["widgets"] == STATE  # nothing stored is lost
    # a notebook without widget state is signed as before
    assert _saved_and_signed(cm, notary, "plain.ipynb", _notebook())
    assert _saved_and_signed(
        cm,
        notary,
        "empty.ipynb",
        _notebook({"application/vnd.jupyter.widget-state+json": {"version_major": 2, "version_minor": 0, "state": {}}}),
    )


@pytest.mark.parametrize(
    ("widgets", "held"),
    [
        (None, False),
        ({}, False),
        ({"application/vnd.jupyter.widget-state+json": {"state": {}}}, False),
        (STATE, True),
        ({"other/key": {"state": {"m": {}}}}, True),
        ({"application/vnd.jupyter.widget-state+json": "weird"}, True),
        (["a list"], True),
        ({"application/vnd.jupyter.widget-state+json": {"state": {}, "extra": 1}}, True),
    ],
)
def test_what_counts_as_saved_widget_state(widgets: Any, held: bool) -> None:
    assert holds_widget_state(_notebook(widgets)) is held
