"""Once private, diagrams and math in a sandbox's outputs fetch nothing, in any Lab or Notebook 7.

People run the kernel in their own JupyterLab, Notebook 7 or JupyterHub,
where sandbox_kernel's page policy (``lab_content_policy``) is not applied:
there the kernel's output policy is all that stands between a private
session's outputs and the browser's network (guarantee 8). Lab draws mermaid
diagrams and typesets math itself, from the markdown, LaTeX and widget text a
cell sends, and both can name an address the browser then loads:

- mermaid draws a diagram inside the page before Lab turns it into an image,
  and its configuration (``fontFamily``, ``themeCSS``) and image shapes fetch;
- MathJax's ``\\mmlToken{mglyph}[src=...]`` is an image, which Lab's MathJax
  (its SafeHandler included) loads from any host, in markdown, in LaTeX and in
  the text ipywidgets typesets (a Label's value, a slider's description).

The server here is that plain Lab (jupyter_server's and Lab's own behaviour,
``protected=False``), with the sandboxed kernel and the lab extension
installed. The control is the same session while public, when the browser may
fetch: every payload reaches the recorder, so each is live in this frontend.
Once the session is private, the same payloads reach nothing: the diagram is
shown as its source (the note says why) and the math is still typeset.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from kernel_helpers import LoopbackHTTPServer
from lab_helpers import LabServer, code_cell, notebook_json, serving
from playwright.sync_api import Locator, Page, expect
from test_status_widget import RATCHET_CELL, open_notebook, status_item

pytestmark = pytest.mark.timeout(300)

CELL_TIMEOUT = 90_000

#: what each payload fetches (its path on the recorder after the session's tag)
PAYLOADS = ("font", "theme", "shape", "markdown-math", "latex", "label", "description")

PAYLOAD_MODULE = '''
"""What a cell displays: a diagram and math that name the recorder, as a private session's cell could."""
from IPython.display import Latex, Markdown, display
import ipywidgets as widgets


def glyph(at):
    return '\\\\mmlToken{mglyph}[src="' + at + '" width="8px" height="8px"]{}'


def show(tag):
    at = "//RECORDER/" + tag
    display(Markdown(
        "```mermaid\\n"
        '%%{init: {"fontFamily": "x;background:url(' + at + '-font)", '
        '"themeCSS": ".node rect {background:url(' + at + '-theme)}"}}%%\\n'
        "flowchart TD\\n"
        '  A@{ img: "' + at + '-shape", label: "rows", pos: "t", w: 60, h: 60 } --> B[flowchart done]\\n'
        "```\\n"
    ))
    display(Markdown("Total: $x^2 + " + glyph(at + "-markdown-math") + "$"))
    display(Latex("$y + " + glyph(at + "-latex") + "$"))
    display(widgets.Label("$z + " + glyph(at + "-label") + "$"))
    display(widgets.IntSlider(description="$w" + glyph(at + "-description") + "$"))
    print(tag, "shown")
'''


class Recorder(LoopbackHTTPServer):
    """An HTTP server on 127.0.0.1 (another origin than the Lab's) that keeps every path asked for."""

    def __init__(self) -> None:
        heard: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                heard.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()
                self.wfile.write(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")

            def log_message(self, *args: object) -> None:
                pass

        self.heard = heard
        super().__init__(Handler)

    def payloads_heard(self, tag: str) -> set[str]:
        prefix = f"/{tag}-"
        return {path[len(prefix) :] for path in self.heard if path.startswith(prefix)}


@pytest.fixture(scope="module")
def lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A Lab as people run it themselves: no page policy of ours, the kernel and extension installed."""
    root = tmp_path_factory.mktemp("lab-plain-outputs")
    with serving(root, artifacts / "jupyter-lab-plain-outputs.log", protected=False) as server:
        yield server


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    try:
        yield server
    finally:
        server.close()


def _run(page: Page, cell: Locator) -> None:
    cell.locator(".jp-InputArea-prompt").click()
    page.keyboard.press("Shift+Enter")


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_a_private_sessions_diagrams_and_math_fetch_nothing_in_a_plain_lab(
    page: Page, lab: LabServer, recorder: Recorder, ui: str
) -> None:
    folder = lab.notebooks / ui  # a folder each: a private notebook raises its own folder
    folder.mkdir()
    (folder / "payloads.py").write_text(PAYLOAD_MODULE.replace("RECORDER", f"127.0.0.1:{recorder.port}"))
    notebook = notebook_json()
    notebook["cells"] = [
        code_cell("public", 'from payloads import show\nshow("public")'),
        code_cell("ratchet", RATCHET_CELL),
        code_cell("private", 'show("private")'),
    ]
    (folder / "report.ipynb").write_text(json.dumps(notebook))
    open_notebook(page, lab, f"{ui}/report.ipynb", ui=ui)
    cells = page.locator(".jp-Notebook .jp-Cell")

    # the control: while public, every payload reaches the recorder from this Lab
    _run(page, cells.nth(0))
    expect(cells.nth(0).locator(".jp-OutputArea-output", has_text="public shown")).to_have_count(
        1, timeout=CELL_TIMEOUT
    )
    deadline = time.monotonic() + 30
    while recorder.payloads_heard("public") != set(PAYLOADS) and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert recorder.payloads_heard("public") == set(PAYLOADS), f"the control fetched only {recorder.heard}"
    expect(cells.nth(0).locator("figure img")).to_have_count(1)  # the diagram was drawn

    _run(page, cells.nth(1))
    expect(status_item(page)).to_have_attribute("data-network", "none", timeout=CELL_TIMEOUT)

    private = cells.nth(2)
    _run(page, private)
    outputs = private.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="private shown")).to_have_count(1, timeout=CELL_TIMEOUT)
    # typeset: the markdown's and the LaTeX's math, the Label's value and the slider's description
    expect(outputs.locator("mjx-container")).to_have_count(4, timeout=30_000)
    expect(outputs.locator(".widget-label mjx-container")).to_have_count(2)
    expect(outputs.locator(".widget-slider")).to_have_count(1)
    page.wait_for_timeout(3000)  # what the public outputs fetched, they fetched within this
    assert recorder.payloads_heard("private") == set(), f"a private session's output fetched: {recorder.heard}"
    # the diagram is shown as its source, and the note says why
    expect(outputs.locator("pre code", has_text="flowchart done")).to_have_count(1)
    expect(outputs.filter(has_text="mermaid diagram shown as its source")).to_have_count(1)
    expect(private.locator("figure img")).to_have_count(0)
