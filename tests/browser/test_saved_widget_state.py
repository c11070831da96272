"""A notebook a sandbox wrote runs none of its saved widget state's code when opened.

Notebooks keep their widgets' state in their metadata, and jupyterlab_widgets
builds every model in it as soon as a notebook is opened, trusted or not.
anywidget runs the ``_esm`` module's ``initialize`` when its model is built:
a cell that writes such a notebook into the workspace would have its script
run in the Lab's page (where the server's API opens terminals on the host)
when the user opens the file. The extension's ``savedWidgetState`` plugin
keeps the state of untrusted notebooks from the widget manager; a notebook
the server trusts (signed with the user's secret, out of every sandbox's
reach) loads it as before.

anywidget is installed in the test environment for this (the ``test`` extra):
the attack needs a package in the server that runs code its state carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from lab_helpers import LabServer, code_cell, notebook_json, serving
from nbformat.sign import NotebookNotary
from playwright.sync_api import Page
from signature_attack import innocent_notebook, recut
from test_status_widget import open_notebook

from sandbox_kernel.lab_signatures import CanonicalNotary

pytestmark = pytest.mark.timeout(300)

FLAG = "__skSavedStateRan"
ESM = (
    "export default {"
    f" initialize() {{ window.{FLAG} = (window.{FLAG} || 0) + 1; }},"
    " render({ el }) { el.textContent = 'rendered'; }"
    " }"
)


def _anywidget_version() -> str:
    from anywidget._version import _ANYWIDGET_SEMVER_VERSION

    return str(_ANYWIDGET_SEMVER_VERSION)


def _notebook_with_saved_state() -> dict[str, Any]:
    version = _anywidget_version()
    modules = {
        "_model_name": "AnyModel",
        "_model_module": "anywidget",
        "_model_module_version": version,
        "_view_name": "AnyView",
        "_view_module": "anywidget",
        "_view_module_version": version,
    }
    state = {
        "version_major": 2,
        "version_minor": 0,
        "state": {
            "5a7ed0000000000000000000000000aa": {
                "model_name": "AnyModel",
                "model_module": "anywidget",
                "model_module_version": version,
                "state": {**modules, "_esm": ESM, "_css": "", "_anywidget_id": "report.Chart", "layout": None},
            }
        },
    }
    view = {"version_major": 2, "version_minor": 0, "model_id": "5a7ed0000000000000000000000000aa"}
    notebook = notebook_json()
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    notebook["cells"] = [
        code_cell(
            "chart",
            "chart",
            [
                {
                    "output_type": "execute_result",
                    "execution_count": 1,
                    "metadata": {},
                    "data": {"text/plain": "Chart()", "application/vnd.jupyter.widget-view+json": view},
                }
            ],
            execution_count=1,
        )
    ]
    return notebook


@pytest.fixture(scope="module")
def lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A Lab whose notary (the user's secret and signatures) lives in the test's
    folder, so the test can sign a notebook as the user's own Lab would."""
    root = tmp_path_factory.mktemp("lab-saved-state")
    notary_dir = root / "notary"
    notary_dir.mkdir()
    with serving(
        root, artifacts / "jupyter-lab-saved-state.log", extra_args=[f"--NotebookNotary.data_dir={notary_dir}"]
    ) as server:
        server.notary_dir = notary_dir  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def plain_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """The control: a Lab without the server extensions (``protected=False``), its notary in the test's folder."""
    root = tmp_path_factory.mktemp("lab-saved-state-plain")
    notary_dir = root / "notary"
    notary_dir.mkdir()
    with serving(
        root,
        artifacts / "jupyter-lab-saved-state-plain.log",
        extra_args=[f"--NotebookNotary.data_dir={notary_dir}"],
        protected=False,
    ) as server:
        server.notary_dir = notary_dir  # type: ignore[attr-defined]
        yield server


def _ran(page: Page) -> Any:
    return page.evaluate(f"() => window.{FLAG}")


def test_an_untrusted_notebooks_saved_widget_state_runs_no_code(page: Page, lab: LabServer) -> None:
    folder = lab.notebooks / "saved"
    folder.mkdir()
    written = json.dumps(_notebook_with_saved_state())
    (folder / "report.ipynb").write_text(written)
    # the same notebook as the user's own Lab saves it: signed with the user's secret
    # (another source: signatures are by content, and the same content signed is trusted anywhere)
    mine = _notebook_with_saved_state()
    mine["cells"][0]["source"] = "chart  # mine"
    signed = nbformat.from_dict(mine)
    # (as `sandbox-kernel trust` signs it: the guarded server checks that digest)
    with CanonicalNotary(data_dir=str(lab.notary_dir)) as notary:  # type: ignore[attr-defined]
        notary.sign(signed)
    (folder / "mine.ipynb").write_text(nbformat.writes(signed))

    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    for ui in ("lab", "notebook"):
        seen = len(console)
        open_notebook(page, lab, "saved/report.ipynb", ui=ui)
        page.wait_for_timeout(3000)  # the control below runs its code before its kernel is idle
        assert _ran(page) is None, f"{ui}: a sandbox-written notebook ran script in the page when opened"
        said = [
            line for line in console[seen:] if "saved widget state of this untrusted notebook is not loaded" in line
        ]
        assert said, console[-20:]

    # The control: a trusted notebook's state is built, and its code runs.
    open_notebook(page, lab, "saved/mine.ipynb")
    page.wait_for_function(f"() => window.{FLAG} === 1", timeout=30_000)
    assert (folder / "report.ipynb").read_text() == written, "opening the notebook changed the file"


def _save_and_reopen(page: Page, server: LabServer, name: str, guarded: bool) -> tuple[bool, Any]:
    """Open ``name``, save it as the user would (Ctrl+S, nothing else), open it
    again: whether the saved file is signed, and what its state's script did."""
    open_notebook(page, server, name)
    page.wait_for_timeout(3000)
    assert _ran(page) is None, "a sandbox-written notebook ran script in the page when first opened"
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    page.wait_for_timeout(3000)
    saved = nbformat.read(str(server.notebooks / name), as_version=4)  # type: ignore[no-untyped-call]
    assert "widgets" in saved.metadata, "the save dropped the notebook's widget state"
    notary_class = CanonicalNotary if guarded else NotebookNotary  # the digest each server checks
    with notary_class(data_dir=str(server.notary_dir)) as notary:  # type: ignore[attr-defined]
        signed = bool(notary.check_signature(saved))
    page.goto("about:blank")
    open_notebook(page, server, name)
    page.wait_for_timeout(5000)
    return signed, _ran(page)


@pytest.mark.parametrize("guarded", [False, True], ids=["control", "guarded"])
def test_a_plain_save_does_not_make_a_sandboxs_widget_state_trusted(
    page: Page, request: pytest.FixtureRequest, guarded: bool
) -> None:
    """The server signs every notebook whose cells show no rich output, and
    never looks at its metadata: a sandbox's notebook with a stream output and
    anywidget state was signed by a plain save, and opened again it ran the
    state's script in the page (an attack review: the script then opened a
    terminal on the host through the server's API). With the server extension
    the save keeps the state, unsigned."""
    server: LabServer = request.getfixturevalue("lab" if guarded else "plain_lab")
    notebook = _notebook_with_saved_state()
    notebook["cells"] = [
        code_cell(
            "report",
            "print('report ready')",
            [{"output_type": "stream", "name": "stdout", "text": "report ready\n"}],
            execution_count=1,
        )
    ]
    (server.notebooks / "streamed.ipynb").write_text(json.dumps(notebook))
    signed, ran = _save_and_reopen(page, server, "streamed.ipynb", guarded)
    if guarded:
        assert not signed and ran is None, f"signed: {signed}, the state's script ran {ran} time(s)"
        assert b"is not signed: it carries saved widget state" in server.log_bytes()
    else:
        assert signed and ran == 1, f"the control: signed {signed}, ran {ran}"


def test_a_notebook_cut_from_a_signed_ones_bytes_runs_nothing(page: Page, lab: LabServer) -> None:
    """nbformat's signature runs over keys and values with nothing between
    them: a sandbox's innocent notebook (a stream output spelling the bytes of
    widget state), signed by a plain save, cut again into one whose metadata
    is that state, opened trusted in the guarded Lab and ran the state's
    script (a review of the no-signing save). The guarded server signs a
    canonical form (tests/test_lab_signatures.py has the control)."""
    wanted = {"kernelspec": _notebook_with_saved_state()["metadata"]["kernelspec"]}
    wanted["widgets"] = _notebook_with_saved_state()["metadata"]["widgets"]
    innocent = innocent_notebook(wanted, {"kernelspec": wanted["kernelspec"]})
    nbformat.write(innocent, str(lab.notebooks / "innocent.ipynb"))  # type: ignore[no-untyped-call]
    open_notebook(page, lab, "innocent.ipynb")
    page.wait_for_timeout(2000)
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    page.wait_for_timeout(3000)
    saved = nbformat.read(str(lab.notebooks / "innocent.ipynb"), as_version=4)  # type: ignore[no-untyped-call]
    signed = []
    for notary_class in (CanonicalNotary, NotebookNotary):  # (whichever digest this server signs)
        with notary_class(data_dir=str(lab.notary_dir)) as notary:  # type: ignore[attr-defined]
            signed.append(notary.check_signature(saved))
    assert any(signed), "the user's save did not sign the innocent notebook"
    (lab.notebooks / "report2.ipynb").write_text(json.dumps(recut(saved, wanted)))
    page.goto("about:blank")
    open_notebook(page, lab, "report2.ipynb")
    page.wait_for_timeout(5000)
    assert _ran(page) is None, f"the re-cut notebook's widget state ran {_ran(page)} time(s)"


def test_a_notebook_without_cells_loads_no_saved_widget_state(page: Page, lab: LabServer) -> None:
    """Lab inserts a trusted empty code cell into a notebook opened with no
    cells, before the widget manager reads the saved state: the extension's
    guard, which judges the live cells, took a sandbox's ``cells: []``
    notebook for trusted and its anywidget script ran on open (an attack
    review). The server now serves an untrusted notebook's state where no
    widget manager looks (``lab_signatures.withhold_untrusted_widget_state``)."""
    folder = lab.notebooks / "empty"
    folder.mkdir()
    notebook = _notebook_with_saved_state()
    notebook["cells"] = []
    written = json.dumps(notebook)
    (folder / "empty.ipynb").write_text(written)
    for ui in ("lab", "notebook"):
        open_notebook(page, lab, "empty/empty.ipynb", ui=ui)
        page.wait_for_timeout(3000)
        assert _ran(page) is None, f"{ui}: a notebook without cells ran its saved widget state's script when opened"
    assert (folder / "empty.ipynb").read_text() == written, "opening the notebook changed the file"
