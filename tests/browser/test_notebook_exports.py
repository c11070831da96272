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

An HTML export downloaded as Lab does ("Save and Export Notebook As → HTML",
or slides) and opened from disk in Chromium: the control runs the notebook's
scripts, loads its images, follows its refresh and loads the widget manager
from a CDN; the guarded export reaches none of the attacks' loopback
listeners, while the template's own scripts (stand-ins answered inside the
browser for its CDN addresses) run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from export_attack import ATTACKS, PLANTED_TEXT, attack_notebook, plant_templates
from kernel_helpers import LoopbackListener
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


#: a sandbox's loop, left running after its cell: the notebook named the
#: exporter ipykernel writes on one read and an import path on the next
_FLIPPER = """
import json, os, sys, time
folder, good, bad = sys.argv[1], sys.argv[2], sys.argv[3]
end = time.monotonic() + 120
i = 0
while time.monotonic() < end and os.path.exists(os.path.join(folder, ".flipping")):
    i += 1
    with open(os.path.join(folder, ".t"), "w") as out:
        out.write(bad if i % 2 else good)
    os.replace(os.path.join(folder, ".t"), os.path.join(folder, "flipped.ipynb"))
"""


def test_a_notebook_swapped_between_the_check_and_the_conversion_is_refused(guarded_server: LabServer) -> None:
    # the handler's check reads the file and jupyter_server's conversion reads
    # it again: without the check on the converted notebook itself the server
    # imported `this` within the first few requests (measured: the second)
    good = _write(guarded_server, "flipped.ipynb", "python")
    bad = json.loads(json.dumps(good))
    bad["metadata"]["language_info"]["nbconvert_exporter"] = "this.x"
    running = guarded_server.notebooks / ".flipping"
    running.touch()
    flipper = subprocess.Popen(
        [sys.executable, "-c", _FLIPPER, str(guarded_server.notebooks), json.dumps(good), json.dumps(bad)]
    )
    statuses: dict[int, int] = {}
    try:
        for _ in range(60):
            status, body = _export(guarded_server, "GET", "/nbconvert/script/flipped.ipynb?download=true")
            statuses[status] = statuses.get(status, 0) + 1
            assert status in {200, 400, 500}, body[-2000:]
            if status == 200:
                assert b"print('hello')" in body
            else:  # refused, before or in the conversion, naming the field
                assert "nbconvert_exporter is &#39;this.x&#39;" in body.decode(), body.decode()[-2000:]
            assert ZEN not in guarded_server.log_bytes(), statuses
    finally:
        running.unlink()
        flipper.wait(timeout=30)
    assert flipper.returncode == 0
    # both reads were raced: some conversions refused a notebook the check had passed
    assert statuses.get(500, 0) > 0, statuses


def test_a_script_export_makes_only_a_script(plain_server: LabServer, guarded_server: LabServer) -> None:
    # the script export delegates to the exporter the notebook names: "html"
    # turns "Export as Executable Script" into an HTML page, past the HTML
    # export's confinement (the control shows it: the page keeps the cell's script)
    for server in (plain_server, guarded_server):
        notebook = notebook_json([])
        notebook["metadata"]["language_info"] = {"name": "python", "nbconvert_exporter": "html"}
        notebook["cells"] = [
            {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "<script>window.ran = 1</script>"}
        ]
        (server.notebooks / "page.ipynb").write_text(json.dumps(notebook))
    status, body = _export(plain_server, "GET", "/nbconvert/script/page.ipynb?download=true")
    assert status == 200 and b"<script>window.ran = 1</script>" in body and b"<!DOCTYPE html>" in body
    status, body = _export(guarded_server, "GET", "/nbconvert/script/page.ipynb?download=true")
    assert status == 400
    assert "nbconvert_exporter is &#39;html&#39;, the exporter of HTMLExporter, which makes no script" in body.decode()


def test_a_notebook_ipykernel_wrote_still_exports(guarded_server: LabServer) -> None:
    _write(guarded_server, "mine.ipynb", "python")
    status, body = _export(guarded_server, "GET", "/nbconvert/script/mine.ipynb?download=true")
    assert status == 200 and b"print('hello')" in body
    status, body = _export(guarded_server, "GET", "/nbconvert/html/mine.ipynb")
    assert status == 200 and b"hello" in body


def test_templates_a_sandbox_wrote_into_the_servers_folder_are_not_used(
    plain_server: LabServer, guarded_server: LabServer, tmp_path: Path
) -> None:
    # Lab works in the notebooks' folder, the sandboxes' workspace: nbconvert
    # looked for its templates (Jinja run unsandboxed) there first, and
    # imported the preprocessors their conf.json names
    marker = tmp_path / "ran-in-the-server.txt"
    planted: list[Path] = []
    try:
        _write(plain_server, "mine.ipynb", "python")
        planted += plant_templates(plain_server.notebooks, marker, conf=False)
        status, _ = _export(plain_server, "GET", "/nbconvert/html/mine.ipynb")
        assert status == 200 and marker.exists()  # the control: the template ran in the server
        plant_templates(plain_server.notebooks, marker)
        _export(plain_server, "GET", "/api/nbconvert")  # the export menu's listing makes every exporter
        assert ZEN in plain_server.log_bytes()

        marker.unlink()
        _write(guarded_server, "mine.ipynb", "python")
        planted += plant_templates(guarded_server.notebooks, marker)
        status, listing = _export(guarded_server, "GET", "/api/nbconvert")
        assert status == 200 and b'"html"' in listing
        notebook = json.loads((guarded_server.notebooks / "mine.ipynb").read_text())
        for method, path, expected in (
            ("GET", "/nbconvert/html/mine.ipynb", b"hello"),
            ("GET", "/nbconvert/slides/mine.ipynb", b"reveal"),
            ("GET", "/nbconvert/script/mine.ipynb?download=true", b"print('hello')"),
            ("GET", "/nbconvert/markdown/mine.ipynb", b"print('hello')"),
            ("POST", "/nbconvert/html", b"hello"),
        ):
            body_sent = {"name": "mine.ipynb", "content": notebook} if method == "POST" else None
            status, body = _export(guarded_server, method, path, body_sent)
            assert status == 200 and expected in body and PLANTED_TEXT.encode() not in body, (path, body[-500:])
        assert not marker.exists(), "a template of the server's folder ran in the server"
        assert ZEN not in guarded_server.log_bytes()
    finally:
        for folder in planted:
            shutil.rmtree(folder, ignore_errors=True)


# --- the HTML export, downloaded and opened from disk --------------------------------------

#: What the template's CDN addresses answer in these tests: stand-ins that do
#: what the real files do with the page (MathJax 2 evaluates the page's
#: configuration block; require.js loads the scripts it is asked for as
#: <script> elements; reveal.js and its plugin define modules). The requests
#: are answered inside the browser (Playwright routing): nothing leaves loopback.
MATHJAX_STAND_IN = """
window.MathJax = {Hub: {
  Config: function (options) { window.mathjaxConfigured = true; },
  Queue: function () {}, getAllJax: function () { return []; }, Rerender: function () {}
}};
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll('script[type="text/x-mathjax-config"]').forEach(function (block) {
    window.eval(block.textContent);
  });
});
"""
REQUIRE_STAND_IN = """
window.requireLoaded = true;
window.define = function (factory) { window.lastDefined = typeof factory === "function" ? factory() : factory; };
window.require = function (config, names, callback) {
  var modules = [];
  (function next(i) {
    if (i === names.length) { callback.apply(null, modules); return; }
    var script = document.createElement("script");
    script.src = names[i];
    script.onload = function () { modules.push(window.lastDefined); next(i + 1); };
    document.head.appendChild(script);
  })(0);
};
"""
REVEAL_STAND_IN = """
define(function () { return {
  initialize: function () { window.revealInitialized = true; },
  addEventListener: function () {}, getCurrentSlide: function () {}
}; });
"""


class _Opened:
    """An export opened from disk in Chromium: which listeners it reached,
    which CDN addresses it asked for, where the page ended, and its globals."""

    def __init__(self, reached: dict[str, int], cdn: list[str], url: str, flags: dict[str, Any], text: str) -> None:
        self.reached, self.cdn, self.url, self.flags, self.text = reached, cdn, url, flags, text


def _open_export(server: LabServer, browser: Any, tmp: Path, fmt: str, name: str) -> _Opened:
    listeners = {attack: LoopbackListener() for attack in ATTACKS}  # each attack's address: what the page reaches
    urls = {attack: f"http://127.0.0.1:{listener.port}/{attack}" for attack, listener in listeners.items()}
    cdn: list[str] = []

    def answer(route: Any) -> None:
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "file:")):
            route.continue_()
            return
        cdn.append(url)
        if "/mathjax/" in url:
            body = MATHJAX_STAND_IN
        elif "/require.js/" in url:
            body = REQUIRE_STAND_IN
        elif url.endswith("/dist/reveal.js"):
            body = REVEAL_STAND_IN
        elif url.endswith("/notes/notes.js"):
            body = "define({id: 'notes'});"
        elif "/mermaid" in url:
            body = "export default {initialize() {}, run() {}};"
        else:  # the widget manager, jQuery, stylesheets: present, doing nothing
            body = "window.otherCdnScript = true;" if url.endswith(".js") else ""
        route.fulfill(status=200, body=body, content_type="text/css" if url.endswith(".css") else "text/javascript")

    try:
        (server.notebooks / f"{name}.ipynb").write_text(nbformat.writes(attack_notebook(urls.__getitem__)))
        status, body = _export(server, "GET", f"/nbconvert/{fmt}/{name}.ipynb?download=true")
        assert status == 200, body[-2000:]
        saved = tmp / f"{name}-{fmt}.html"  # as a browser saves a download
        saved.write_bytes(body)
        context = browser.new_context()
        try:
            context.route("**/*", answer)
            page = context.new_page()
            page.goto(saved.as_uri(), wait_until="load")
            page.wait_for_timeout(4000)  # past the refresh's 2 s, the listeners' accepts and loads
            flags = page.evaluate(
                "() => ({pageScriptRan: !!window.pageScriptRan, mathjaxConfigured: !!window.mathjaxConfigured,"
                " requireLoaded: !!window.requireLoaded, revealInitialized: !!window.revealInitialized})"
            )
            text = page.inner_text("body") if page.url == saved.as_uri() else ""
            url = page.url
        finally:
            context.close()
        reached = {attack: listener.accepted for attack, listener in listeners.items() if listener.accepted}
        return _Opened(reached, cdn, url, flags, text)
    finally:
        for listener in listeners.values():
            listener.close()


def test_without_the_guard_a_downloaded_export_runs_and_fetches_what_the_notebook_holds(
    plain_server: LabServer, own_browser: Any, tmp_path: Path
) -> None:
    opened = _open_export(plain_server, own_browser, tmp_path, "html", "plain")
    # the control: the page loads, runs and navigates as the notebook says
    assert {"markdown_image", "html_script", "html_image", "javascript_output", "html_refresh"} <= set(opened.reached)
    assert any("html-manager" in url for url in opened.cdn), opened.cdn


@pytest.mark.parametrize("fmt", ["html", "slides"])
def test_a_downloaded_export_runs_and_fetches_nothing_of_the_notebooks(
    guarded_server: LabServer, own_browser: Any, tmp_path: Path, fmt: str
) -> None:
    opened = _open_export(guarded_server, own_browser, tmp_path, fmt, f"guarded-{fmt}")
    assert opened.reached == {}, f"the export reached {opened.reached}"
    assert opened.url.startswith("file:") and not opened.flags["pageScriptRan"]
    assert not any("html-manager" in url for url in opened.cdn), opened.cdn
    # the template's own scripts still run: MathJax reads its configuration block, require.js loads
    assert opened.flags["mathjaxConfigured"] and opened.flags["requireLoaded"], (opened.flags, opened.cdn)
    if fmt == "slides":  # reveal.js and its notes plugin, through require.js, from their folder
        assert opened.flags["revealInitialized"], opened.cdn
        assert any(url.endswith("/plugin/notes/notes.js") for url in opened.cdn), opened.cdn
    # and the notebook reads as in Lab: its heading and both tables
    assert "Quarterly results" in opened.text and "region" in opened.text and "total" in opened.text


def test_a_script_export_is_never_downloaded_as_a_page(plain_server: LabServer, guarded_server: LabServer) -> None:
    """The script export takes its download's extension and type from the
    notebook's ``language_info`` (an attack review): a sandbox's notebook
    saying ``.html`` and ``text/html`` made "Executable Script" download
    ``report.html``, the cell's source as a page (its script and remote
    image included), which runs and fetches when opened from disk. The
    control shows it; the guarded server refuses, naming the field."""
    source = "<script>window.ran = 1</script><img src='https://tracker.example/x.png'>"
    for server in (plain_server, guarded_server):
        notebook = notebook_json([source])
        notebook["metadata"]["language_info"] = {"name": "python", "file_extension": ".html", "mimetype": "text/html"}
        (server.notebooks / "report.ipynb").write_text(json.dumps(notebook))
    request = urllib.request.Request(
        f"{plain_server.base_url}/nbconvert/script/report.ipynb?download=true",
        headers={"Authorization": f"token {plain_server.token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/html")
        assert response.headers["Content-Disposition"].endswith("report.html")
        assert source.encode() in response.read()
    status, body = _export(guarded_server, "GET", "/nbconvert/script/report.ipynb?download=true")
    assert status == 400, body[:300]
    assert "metadata.language_info.file_extension is &#39;.html&#39;, not a script&#39;s" in body.decode()
