"""Exporting a notebook a sandbox wrote makes the server import nothing it names.

nbconvert's script exporter reads ``metadata.language_info.nbconvert_exporter``
and imports a dotted value as a Python path in the Jupyter server. A cell
writes a notebook naming ``this.x``: the control (a server without
``sandbox_kernel.lab_exports``: an explicit ``--config`` is read instead of the
config dir's file) imports ``this``, whose import prints the Zen of Python into
the server's log, when the notebook is exported as Lab does it ("Save and
Export Notebook As → Executable Script"). With the extension the export is
refused with a 400 naming the field, and a notebook ipykernel wrote exports as
before. No browser is needed: the requests are the ones Lab sends.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_helpers import LabServer, notebook_json, serving

pytestmark = pytest.mark.timeout(300)

ZEN = b"Beautiful is better than ugly"


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    with serving(tmp_path_factory.mktemp("exports-guarded"), artifacts / "jupyter-lab-exports.log") as server:
        yield server


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    with serving(
        tmp_path_factory.mktemp("exports-plain"), artifacts / "jupyter-lab-exports-plain.log", protected=False
    ) as server:
        yield server


def _write(server: LabServer, name: str, exporter: str) -> dict[str, Any]:
    notebook = notebook_json(["print('hello')"])
    notebook["metadata"]["language_info"] = {"name": "python", "nbconvert_exporter": exporter}
    (server.notebooks / name).write_text(json.dumps(notebook))
    return notebook


def _export(server: LabServer, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{server.base_url}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_without_the_guard_an_export_imports_what_the_notebook_names(plain_server: LabServer) -> None:
    _write(plain_server, "report.ipynb", "this.x")
    status, _ = _export(plain_server, "GET", "/nbconvert/script/report.ipynb?download=true")
    assert status == 500  # `this` has no `x`: after the import
    assert ZEN in plain_server.log_bytes()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_export_of_a_notebook_naming_an_import_path_is_refused(guarded_server: LabServer, method: str) -> None:
    notebook = _write(guarded_server, "report.ipynb", "this.x")
    if method == "GET":
        status, body = _export(guarded_server, "GET", "/nbconvert/script/report.ipynb?download=true")
    else:
        model = {"name": "report.ipynb", "content": notebook}
        status, body = _export(guarded_server, "POST", "/nbconvert/script", model)
    assert status == 400
    # (an HTML error page, as for any failed export: the message escaped)
    assert "metadata.language_info.nbconvert_exporter is &#39;this.x&#39;" in body.decode(), body.decode()[-2000:]
    assert ZEN not in guarded_server.log_bytes()


def test_a_notebook_ipykernel_wrote_still_exports(guarded_server: LabServer) -> None:
    _write(guarded_server, "mine.ipynb", "python")
    status, body = _export(guarded_server, "GET", "/nbconvert/script/mine.ipynb?download=true")
    assert status == 200 and b"print('hello')" in body
    status, body = _export(guarded_server, "GET", "/nbconvert/html/mine.ipynb")
    assert status == 200 and b"hello" in body
