"""A sandbox's outputs in a Lab or Notebook 7 without our page policy: no script runs, and once private nothing is fetched.

People run the kernel in their own JupyterLab, Notebook 7 or JupyterHub,
where sandbox_kernel's page policy (``lab_content_policy``) is not applied:
there the kernel's output policy is all that stands between a private
session's outputs and the browser's network (guarantee 8). The other browser
tests run under the page policy, which refuses such fetches by itself and so
would hide what the output policy misses. The server here is that plain Lab
(jupyter_server's and Lab's own behaviour, ``protected=False``), with the
sandboxed kernel and the lab extension installed; a cell of a real sandboxed
kernel displays each payload, once public and once private.

Lab draws mermaid diagrams and typesets math itself, from the markdown, LaTeX
and widget text a cell sends, and both can name an address the browser then
loads; the output policy missed these until it was attacked here:

- mermaid draws a diagram inside the page before Lab turns it into an image,
  and its configuration (``fontFamily``, ``themeCSS``) and image shapes fetch;
- MathJax's ``\\mmlToken{mglyph}[src=...]`` is an image, which Lab's MathJax
  (its SafeHandler included) loads from any host, in markdown, in LaTeX and in
  the text ipywidgets typesets (a Label's value, a slider's description).

The battery holds the other ways we know an output names an address: CSS properties,
escapes and ``image-set``, style blocks and ``@import``, images and their
``srcset``, ``//host``, ``\\\\host`` and ``/\\host`` spellings, ``https:host``
without slashes (another host to a page on ``http:``), SVG, MathML, frames,
media, markdown images and references.

The control is the same session while public, when the browser may fetch:
the payloads reach the recorder, so each is live in this frontend. Once the
session is private none does: the diagram is shown as its source (the note
says why) and the math is still typeset. CSS is the exception: a style sheet
is global to the page and a rule can wait for content that comes later, so a
public output could arm a fetch that a private output, naming no URL, sets
off (a rule for a class the private output uses, a hidden element whose
inline background a private style unhides, a font a private output names).
Styles therefore fetch in no session; their control is the same Lab with the
output policy off (``trust_outputs``), where the CSS payloads fetch while
public and the armed ones fire when the private output comes. A lazy image
is armed the same way (a private style brings it into view): images load at
once, in a Lab whose table of contents is off, where nothing else loads it.

Scripts: Lab shows live outputs as trusted (their HTML inserted as it is,
their ``<script>`` elements run), so here the output policy alone keeps a
sandbox's script out of the page, where the server's API opens host
terminals. Each vector (elements, handlers, animations, frames, mutation
tricks, markdown, a JavaScript output, widgets, an Output widget, a display
update, the pager) calls the page's probe when it runs; what a click would
run is looked for in the page (handler attributes, ``javascript:``
addresses). The control is the same plain Lab with the output policy off
(``trust_outputs``), where 17 of them run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import LoopbackListener, RecordingHTTPServer
from lab_helpers import LabServer, code_cell, notebook_json, serving
from playwright.sync_api import Locator, Page, expect
from test_status_widget import RATCHET_CELL, open_notebook, status_item

pytestmark = pytest.mark.timeout(300)

CELL_TIMEOUT = 90_000

#: what each payload fetches (its path on the recorder after the session's tag)
PAYLOADS = ("font", "theme", "shape", "markdown-math", "latex", "label", "description")
#: of these, what a public session fetches: the diagram's (math's \mmlToken is
#: disarmed in every session since its style attribute could wait, helper 75)
PUBLIC_PAYLOADS = {"font", "theme", "shape"}

#: The other ways we know an output names an address (name, MIME type, content):
#: ``@AT@`` is ``//<recorder>/<tag>``, ``@HOST@`` the recorder's host and port,
#: ``@TLS@`` a listener that counts connections (``https:host/x`` without
#: slashes is another host to a page on ``http:``).
CSS_PROPERTIES = ("background", "list-style-image", "border-image", "cursor", "mask-image", "content", "filter")
BATTERY: list[tuple[str, str, str]] = [
    *[
        (
            f"css-{prop}",
            "text/html",
            f'<div style="{prop}: url(@AT@-css-{prop}){", auto" if prop == "cursor" else ""}">{prop}</div>',
        )
        for prop in CSS_PROPERTIES
    ],
    ("css-escaped", "text/html", "<div style=\"background: url('\\2f\\2f @HOST@/@TAG@-css-escaped')\">e</div>"),
    ("css-image-set", "text/html", "<div style=\"background-image: image-set('@AT@-css-image-set' 1x)\">s</div>"),
    ("css-backslash", "text/html", '<div style="background: url(\\\\@HOST@/@TAG@-css-backslash)">b</div>'),
    ("css-tls", "text/html", '<div style="background: url(https:@TLS@/x)">t</div>'),
    (
        "style-block",
        "text/html",
        '<style>.sk-@TAG@ {background: url(@AT@-style-block)}</style><p class="sk-@TAG@">b</p>',
    ),
    ("style-import", "text/html", "<style>@import url(@AT@-style-import);</style><p>i</p>"),
    ("img", "text/html", '<img src="@AT@-img">'),
    ("img-backslash", "text/html", '<img src="\\\\@HOST@/@TAG@-img-backslash">'),
    ("img-slash-backslash", "text/html", '<img src="/\\@HOST@/@TAG@-img-slash-backslash">'),
    ("img-tls", "text/html", '<img src="https:@TLS@/x">'),
    ("img-srcset", "text/html", '<img srcset="@AT@-img-srcset 1x">'),
    ("picture", "text/html", '<picture><source srcset="@AT@-picture"><img alt="p"></picture>'),
    ("poster", "text/html", '<video poster="@AT@-poster"></video>'),
    ("table-background", "text/html", '<table background="@AT@-table-background"><tr><td>t</td></tr></table>'),
    ("svg-image", "text/html", '<svg width="9" height="9"><image href="@AT@-svg-image" width="5" height="5"/></svg>'),
    ("svg-use", "text/html", '<svg width="9" height="9"><use href="@AT@-svg-use#a"/></svg>'),
    (
        "svg-fill",
        "text/html",
        '<svg width="9" height="9"><rect fill="url(@AT@-svg-fill#g)" width="5" height="5"/></svg>',
    ),
    ("input-image", "text/html", '<input type="image" src="@AT@-input-image">'),
    ("link", "text/html", '<link rel="stylesheet" href="@AT@-link">'),
    ("media", "text/html", '<audio src="@AT@-media" autoplay></audio><video src="@AT@-media" autoplay></video>'),
    ("frame", "text/html", '<iframe src="@AT@-frame"></iframe><object data="@AT@-frame"></object>'),
    ("mglyph", "text/html", '<math><mglyph src="@AT@-mglyph"/></math>'),
    # MathJax reads math without <wbr>: the command it splits reached it whole (helper 75)
    ("tex-wbr-mglyph", "text/html", '<p>$x\\mml<wbr>Token{mglyph}[src="@AT@-tex-wbr-mglyph"]{}$</p>'),
    ("tex-wbr-style", "text/html", "<p>$x+\\sty<wbr>le{cursor:url(@AT@-tex-wbr-style),auto}{y}$</p>"),
    ("md-image", "text/markdown", "![chart](@AT@-md-image)"),
    ("md-reference", "text/markdown", "![chart][r]\n\n[r]: @AT@-md-reference"),
    ("md-html", "text/markdown", '<img src="@AT@-md-html"> <span style="background: url(@AT@-md-html)">s</span>'),
    ("md-entity", "text/markdown", "![chart](&#x2f;/@HOST@/@TAG@-md-entity)"),
    ("md-backslash", "text/markdown", "![chart](\\\\@HOST@/@TAG@-md-backslash)"),
    # a "code span" across a blank line, around a custom element of Lab's page (helper 83)
    ("md-custom-element", "text/markdown", 's `\n\n<jp-avatar src="@AT@-md-custom-element"></jp-avatar>\n\n` e'),
    (
        "svg-output",
        "image/svg+xml",
        '<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><image href="@AT@-svg-output" width="5"'
        ' height="5"/><style>@import url(@AT@-svg-output);</style></svg>',
    ),
]

#: The battery's CSS payloads: each fetches while public in the control
#: (``trust_outputs``), and none does under the output policy, in any session.
CSS_PAYLOADS = {name for name, _, _ in BATTERY if name.startswith(("css-", "style-"))}
#: of these, what this Lab fetches (Chromium loads no ``filter: url()`` of another
#: document; ``css-backslash`` and ``css-tls`` name another host or port)
LIVE_CSS = CSS_PAYLOADS - {"css-filter", "css-backslash", "css-tls"}

#: Fetches a public output can arm and a later private output, naming no URL,
#: sets off (name, MIME type, the public output, the private output); the
#: addresses are ``@AT@-<name>``. Helper 44's two (a style rule waiting for a
#: class; a hidden element with an inline background, unhidden by a style),
#: a font waiting to be used, and a hidden lazy image a style shows.
ARMED: list[tuple[str, str, str, str]] = [
    (
        "armed-class",
        "text/html",
        "<style>"
        + "".join(f".sk-armed{i} {{background-image: url(@AT@-armed-class{i})}}" for i in range(8))
        + "</style><p>armed</p>",
        '<div class="sk-armed5" style="width:9px;height:9px">.</div>',
    ),
    (
        "armed-unhide",
        "text/html",
        '<div class="sk-unhide" style="display:none;width:9px;height:9px;background-image:url(@AT@-armed-unhide)">.</div>',
        "<style>.sk-unhide {display: block !important}</style><p>unhidden</p>",
    ),
    (
        "armed-font",
        "text/html",
        "<style>@font-face {font-family: skarmed; src: url(@AT@-armed-font)}</style><p>font</p>",
        '<span style="font-family: skarmed">x</span>',
    ),
    # math's \style: MathJax keeps a cursor image, which Chromium loads once
    # the element is drawn (helper 67), in HTML and in markdown
    (
        "armed-tex-cursor",
        "text/html",
        '<div class="sk-texhide" style="display:none">$x + \\style{cursor:url(@AT@-armed-tex-cursor),auto}{y}$</div>'
        "<p>texarm</p>",
        "<style>.sk-texhide {display: block !important}</style><p>tex revealed</p>",
    ),
    (
        "armed-md-cursor",
        "text/markdown",
        '<div class="sk-mdhide" style="display:none">\n\n$x + \\style{cursor:url(@AT@-armed-md-cursor),auto}{y}$'
        "\n\n</div>\n\nmdarm",
        "<style>.sk-mdhide {display: block !important}</style><p>md revealed</p>",
    ),
    # \mmlToken's style attribute: the same cursor image (helper 75)
    (
        "armed-mml-cursor",
        "text/html",
        '<div class="sk-mmlhide" style="display:none">$x + \\mmlToken{mi}[style="cursor:url(@AT@-armed-mml-cursor),'
        'auto"]{y}$</div><p>mmlarm</p>',
        "<style>.sk-mmlhide {display: block !important}</style><p>mml revealed</p>",
    ),
    # last: a lazy image loads only near the viewport, which shows the cells
    # below when the private output shows it (entries after it pushed it out
    # of reach, and the control missed its fetch)
    (
        "armed-lazy",
        "text/html",
        '<div class="sk-lazy" style="display:none"><img loading="lazy" width="5" height="5" src="@AT@-armed-lazy"></div>',
        "<style>.sk-lazy {display: block !important}</style><p>shown</p>",
    ),
]
#: what the private outputs set off when the public ones are not cleaned. The
#: others (armed-unhide, -lazy, -tex-cursor, -md-cursor, -mml-cursor) need the
#: private output's style sheet to reach a public output's element: they went
#: off in this control until every kept style sheet was limited to its own
#: output (``outputs/_scoped_css.py``), which cleans private outputs here too
ARMED_FIRED = {"armed-class5", "armed-font"}

#: Ways an output can carry a script (name, MIME type, content), each calling
#: the page's probe ``__skRan(name)`` when it runs: Lab shows live outputs as
#: trusted, inserting their HTML as it is and running its ``<script>`` elements,
#: so in a Lab without the page policy only the output policy stops these.
SCRIPT_BATTERY: list[tuple[str, str, str]] = [
    ("script", "text/html", "<script>__skRan('script')</script>"),
    ("script-src", "text/html", "<script src=\"data:text/javascript,__skRan('script-src')\"></script>"),
    ("img-onerror", "text/html", '<img src="x" onerror="__skRan(\'img-onerror\')">'),
    ("svg-onload", "text/html", "<svg onload=\"__skRan('svg-onload')\"></svg>"),
    ("svg-script", "text/html", "<svg><script>__skRan('svg-script')</script></svg>"),
    ("svg-animate", "text/html", '<svg><animate onbegin="__skRan(\'svg-animate\')" attributeName="x" dur="1s"/></svg>'),
    ("details", "text/html", "<details open ontoggle=\"__skRan('details')\"><summary>s</summary></details>"),
    ("autofocus", "text/html", "<input autofocus onfocus=\"__skRan('autofocus')\">"),
    (
        "animation",
        "text/html",
        '<style>@keyframes sk {}</style><p style="animation: sk 1s" onanimationstart="__skRan(\'animation\')">a</p>',
    ),
    ("srcdoc", "text/html", "<iframe srcdoc=\"<script>parent.__skRan('srcdoc')</script>\"></iframe>"),
    ("iframe-javascript", "text/html", "<iframe src=\"javascript:parent.__skRan('iframe-javascript')\"></iframe>"),
    (
        "mxss-noscript",
        "text/html",
        "<noscript><p title=\"</noscript><img src=x onerror=__skRan('mxss-noscript')>\"></noscript>",
    ),
    ("mxss-math", "text/html", "<math><mtext><table><mglyph><style><img src=x onerror=__skRan('mxss-math')>"),
    ("mxss-svg-style", "text/html", "<svg><style><img src=x onerror=__skRan('mxss-svg-style')></style></svg>"),
    ("mxss-textarea", "text/html", "<textarea><img src=x onerror=__skRan('mxss-textarea')></textarea>"),
    ("markdown-html", "text/markdown", '**report** <img src="x" onerror="__skRan(\'markdown-html\')">'),
    ("markdown-script", "text/markdown", "text\n\n<script>__skRan('markdown-script')</script>\n"),
    (  # a code fence's language, which Lab writes unescaped into the code element's class
        "markdown-fence",
        "text/markdown",
        "<style>@keyframes skfence{from{opacity:.99}to{opacity:1}}</style>\n\n"
        "~~~x\" style=\"animation:skfence 1s\" onanimationstart=\"__skRan('markdown-fence')\nprint('kept')\n~~~\n",
    ),
    ("javascript-output", "application/javascript", "__skRan('javascript-output')"),
    (
        "svg-output",
        "image/svg+xml",
        "<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"__skRan('svg-output')\"><script>__skRan('svg-output')</script></svg>",
    ),
]

#: what is only a click away: checked in the page (no ``javascript:`` address, no handler attribute)
CLICK_BATTERY: list[tuple[str, str, str]] = [
    ("link", "text/html", "<a href=\" jav&#x09;ascript:__skRan('link')\">link</a>"),
    (
        "form",
        "text/html",
        "<form action=\"javascript:__skRan('form')\"><button formaction=\"javascript:__skRan('form')\">b</button></form>",
    ),
    (
        "svg-link",
        "text/html",
        '<svg><a href="javascript:__skRan(\'svg-link\')"><text y="9">x</text></a><a><set attributeName="href" to="javascript:__skRan(\'svg-set\')"/><text y="9">y</text></a></svg>',
    ),
    ("base", "text/html", '<base href="javascript:__skRan(\'base\')//"><a href="x">relative</a>'),
    (
        "markdown-link",
        "text/markdown",
        "[click](javascript:__skRan('markdown-link')) and <javascript:__skRan('autolink')>",
    ),
    ("latex-link", "text/latex", "$\\href{javascript:__skRan('latex-link')}{x}$"),
    (
        "md-custom-anchor",
        "text/markdown",
        "s `\n\n<jp-anchor href=\"javascript:__skRan('md-custom-anchor')\">x</jp-anchor>\n\n` e",
    ),
    # a click on an element naming a command runs it, unasked, in a trusted
    # output (a host terminal opened): a span across a heading, an indented
    # line in a list item (review r67)
    (
        "md-command-heading",
        "text/markdown",
        '`x\n# <foo data-commandlinker-command="terminal:create-new">open</foo> `',
    ),
    (
        "md-command-list",
        "text/markdown",
        '- item\n\n    <foo data-commandlinker-command="terminal:create-new">open</foo>',
    ),
]


PAYLOAD_MODULE = """
\"\"\"What a cell displays: outputs that name the recorder, as a private session's cell could.\"\"\"
import json

from IPython.display import Latex, Markdown, display
import ipywidgets as widgets

BATTERY = json.loads(BATTERY_JSON)


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


SCRIPTS = json.loads(SCRIPTS_JSON)


def scripts(start, stop):
    for name, mime, content in SCRIPTS[start:stop]:
        display({mime: content, "text/plain": name}, raw=True)
    print("scripts from", start, "shown")


def widget_scripts():
    from IPython.core import page

    widgets_html = "<img src=x onerror=__skRan('widget-html')>"
    display(widgets.HTML(widgets_html), widgets.HTMLMath(widgets_html.replace("widget-html", "widget-htmlmath")))
    display(widgets.Checkbox(description=widgets_html.replace("widget-html", "widget-description"), description_allow_html=True))
    out = widgets.Output()
    with out:
        display({"text/html": widgets_html.replace("widget-html", "output-widget")}, raw=True)
    display(out)
    handle = display({"text/html": "<b>before</b>"}, raw=True, display_id=True)
    handle.update({"text/html": widgets_html.replace("widget-html", "update-display")}, raw=True)
    page.page({"text/html": widgets_html.replace("widget-html", "pager"), "text/plain": "pager"})
    print("widget scripts shown")


def battery(tag, start, stop):
    for name, mime, content in BATTERY[start:stop]:
        text = content.replace("@AT@", "//RECORDER/" + tag).replace("@HOST@", "RECORDER")
        listener = "TLS" if tag == "public" else "SECONDLISTENER"  # a private battery's own
        display({mime: text.replace("@TAG@", tag).replace("@TLS@", listener), "text/plain": name}, raw=True)
    print(tag, "battery from", start, "shown")


def battery_of(tag, names):
    for index, (name, _, _) in enumerate(BATTERY):
        if name in names:
            battery(tag, index, index + 1)
    print(tag, "battery of", len(names), "shown")


ARMED = json.loads(ARMED_JSON)


def armed(tag, private):
    for name, mime, public_output, private_output in ARMED:
        content = private_output if private else public_output.replace("@AT@", "//RECORDER/" + tag)
        display({mime: content, "text/plain": name}, raw=True)
    print(tag, "armed", "private" if private else "public", "shown")
"""


@pytest.fixture(scope="module")
def lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A Lab as people run it themselves: no page policy of ours, the kernel and extension installed."""
    root = tmp_path_factory.mktemp("lab-plain-outputs")
    with serving(root, artifacts / "jupyter-lab-plain-outputs.log", protected=False) as server:
        yield server


def _heard(recorder: RecordingHTTPServer, tag: str) -> set[str]:
    """The payloads (paths after ``/<tag>-``) the recorder was asked for."""
    prefix = f"/{tag}-"
    return {path[len(prefix) :] for path in recorder.heard if path.startswith(prefix)}


@pytest.fixture
def tls() -> Iterator[LoopbackListener]:
    listener = LoopbackListener()
    try:
        yield listener
    finally:
        listener.close()


def _notebook(
    lab: LabServer,
    folder_name: str,
    recorder: RecordingHTTPServer,
    tls: LoopbackListener,
    cells: list[str],
    second: LoopbackListener | None = None,
) -> str:
    """A folder of its own (a private notebook raises its own folder) with the
    payloads and a notebook of ``cells``; its path."""
    folder = lab.notebooks / folder_name
    folder.mkdir()
    module = PAYLOAD_MODULE.replace("BATTERY_JSON", repr(json.dumps(BATTERY)))
    module = module.replace("SCRIPTS_JSON", repr(json.dumps(SCRIPT_BATTERY + CLICK_BATTERY)))
    module = module.replace("ARMED_JSON", repr(json.dumps(ARMED)))
    module = module.replace("RECORDER", f"127.0.0.1:{recorder.port}").replace("TLS", f"127.0.0.1:{tls.port}")
    module = module.replace("SECONDLISTENER", f"127.0.0.1:{(second or tls).port}")
    (folder / "payloads.py").write_text(module)
    notebook = notebook_json()
    notebook["cells"] = [code_cell(f"c{i}", source) for i, source in enumerate(cells)]
    (folder / "report.ipynb").write_text(json.dumps(notebook))
    return f"{folder_name}/report.ipynb"


def _run(page: Page, cell: Locator) -> None:
    cell.locator(".jp-InputArea-prompt").click()
    page.keyboard.press("Shift+Enter")


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_a_private_sessions_diagrams_and_math_fetch_nothing_in_a_plain_lab(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener, ui: str
) -> None:
    sources = ['from payloads import show\nshow("public")', RATCHET_CELL, 'show("private")']
    open_notebook(page, lab, _notebook(lab, ui, recorder, tls, sources), ui=ui)
    cells = page.locator(".jp-Notebook .jp-Cell")

    # the control: while public, the diagram's payloads reach the recorder from this Lab
    _run(page, cells.nth(0))
    expect(cells.nth(0).locator(".jp-OutputArea-output", has_text="public shown")).to_have_count(
        1, timeout=CELL_TIMEOUT
    )
    deadline = time.monotonic() + 30
    while _heard(recorder, "public") != PUBLIC_PAYLOADS and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    page.wait_for_timeout(2000)  # (and no more than those)
    assert _heard(recorder, "public") == PUBLIC_PAYLOADS, f"the control fetched {recorder.heard}"
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
    assert _heard(recorder, "private") == set(), f"a private session's output fetched: {recorder.heard}"
    # the diagram is shown as its source, and the note says why
    expect(outputs.locator("pre code", has_text="flowchart done")).to_have_count(1)
    expect(outputs.filter(has_text="mermaid diagram shown as its source")).to_have_count(1)
    expect(private.locator("figure img")).to_have_count(0)

    # files the session wrote are the page policy's to keep inert, and this
    # server has none: the status popup says so, and how to add it
    status_item(page).click()
    warning = page.locator(".sk-status-dialog .sk-status-no-page-policy")
    expect(warning).to_contain_text("does not apply sandbox_kernel's page policy")
    expect(warning).to_contain_text("lab_content_policy.apply(c)")
    page.keyboard.press("Escape")


#: the battery's entries that fetch while the session is public (the control:
#: each is live in this Lab). The public policy removes the others' addresses
#: (frames, objects, links, media, SVG images and fills, MathML, posters,
#: ``background`` attributes) and every CSS fetch (:data:`CSS_PAYLOADS`, whose
#: control is :func:`test_control_without_the_output_policy_styles_fetch_and_can_be_armed`).
LIVE_WHILE_PUBLIC = {
    "img",
    "img-backslash",
    "img-slash-backslash",
    "img-srcset",
    "md-image",
    "md-reference",
    "md-html",
    "md-entity",
}


def test_a_private_sessions_outputs_fetch_nothing_in_a_plain_lab(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> None:
    # The private battery's https:host addresses name a listener of their own:
    # the public outputs' failed image was asked for again while the private
    # cells ran, under load (a CI run), and counted against them.
    second = LoopbackListener()
    try:
        _private_battery(page, lab, recorder, tls, second)
    finally:
        second.close()


def _private_battery(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener, second: LoopbackListener
) -> None:
    """Each way an output names an address, through the kernel's policy into a
    Lab that has no page policy: what the policy lets a public session fetch
    is fetched, and once private nothing is, nor is any connection made."""
    # Lab shows 50 outputs of a cell, and each removal adds a note: a cell per half
    half = len(BATTERY) // 2
    parts = [f"battery(TAG, 0, {half})", f"battery(TAG, {half}, {len(BATTERY)})"]
    cells = [
        "from payloads import battery",
        *[part.replace("TAG", '"public"') for part in parts],
        RATCHET_CELL,
        *[part.replace("TAG", '"private"') for part in parts],
    ]
    open_notebook(page, lab, _notebook(lab, "battery", recorder, tls, cells, second))
    notebook = page.locator(".jp-Notebook .jp-Cell")

    def run_part(index: int, shown: str) -> Locator:
        _run(page, notebook.nth(index))
        outputs = notebook.nth(index).locator(".jp-OutputArea-output")
        expect(outputs.filter(has_text=shown)).to_have_count(1, timeout=CELL_TIMEOUT)
        return outputs

    _run(page, notebook.nth(0))
    run_part(1, "public battery from 0 shown")
    run_part(2, f"public battery from {half} shown")
    deadline = time.monotonic() + 30
    while not _heard(recorder, "public") >= LIVE_WHILE_PUBLIC and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert _heard(recorder, "public") >= LIVE_WHILE_PUBLIC, f"the control fetched only {recorder.heard}"
    # styles fetch in no session: a public one could be set off by a later private output
    assert not _heard(recorder, "public") & CSS_PAYLOADS, f"a public style fetched: {recorder.heard}"
    # math styles and tokens fetch in no session either, a <wbr> in their name or not
    assert not _heard(recorder, "public") & {"tex-wbr-mglyph", "tex-wbr-style"}, recorder.heard
    assert tls.accepted > 0, "the control made no connection for https:host without slashes"

    _run(page, notebook.nth(3))
    expect(status_item(page)).to_have_attribute("data-network", "none", timeout=CELL_TIMEOUT)
    first = run_part(4, "private battery from 0 shown")
    run_part(5, f"private battery from {half} shown")
    expect(first.locator("p.sk-private")).to_have_count(1)  # the HTML was shown, only its addresses went
    page.wait_for_timeout(3000)
    assert _heard(recorder, "private") == set(), f"a private session's output fetched: {recorder.heard}"
    assert second.accepted == 0, "a private session's output made a connection"


PROBE = "() => { window.__skVectors = []; window.__skRan = (v) => window.__skVectors.push(v); }"

#: what a click would run, found in the outputs' DOM: handler attributes,
#: ``javascript:`` addresses, script-bearing elements and animations of links or handlers
DOM_CHECK = """() => {
    const found = [];
    const urlAttributes = ['href', 'xlink:href', 'src', 'action', 'formaction', 'data', 'to', 'values'];
    for (const el of document.querySelectorAll('.jp-OutputArea-output *, .jp-OutputArea-output')) {
        const tag = el.localName;
        if (['script', 'iframe', 'object', 'embed', 'base', 'meta', 'frame'].includes(tag)) found.push(tag);
        for (const attribute of el.attributes) {
            const name = attribute.name.toLowerCase();
            const value = attribute.value.replace(/[\\s\\x00-\\x20]/g, '').toLowerCase();
            if (name.startsWith('on')) found.push(`${tag} ${name}`);
            if (name === 'data-commandlinker-command') found.push(`${tag} ${name}=${attribute.value.slice(0, 40)}`);
            if (urlAttributes.includes(name) && /^(javascript|vbscript|data:text\\/html)/.test(value)) {
                found.push(`${tag} ${name}=${value.slice(0, 40)}`);
            }
        }
        if (['set', 'animate'].includes(tag) && /^(on|href|xlink:href)/i.test(el.getAttribute('attributeName') || '')) {
            found.push(`${tag} of ${el.getAttribute('attributeName')}`);
        }
    }
    return found;
}"""


@pytest.fixture(scope="module")
def trusting_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """The control: the same plain Lab, the kernel's output policy switched off (``trust_outputs``)."""
    root = tmp_path_factory.mktemp("lab-plain-trusting")
    config = "c.SandboxKernel.trust_outputs = True\n"
    with serving(root, artifacts / "jupyter-lab-plain-trusting.log", kernel_config=config, protected=False) as server:
        yield server


def _scripts(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> tuple[set[str], list[str]]:
    """Display every script vector from a sandboxed kernel; what ran, and what a click would run."""
    # Lab shows 50 outputs of a cell, and each removal adds a note: a few cells
    third = len(SCRIPT_BATTERY + CLICK_BATTERY) // 2
    sources = [
        f"from payloads import scripts, widget_scripts\nscripts(0, {third})",
        f"scripts({third}, 999)",
        "widget_scripts()",
    ]
    open_notebook(page, lab, _notebook(lab, "scripts", recorder, tls, sources))
    page.evaluate(PROBE)
    cells = page.locator(".jp-Notebook .jp-Cell")
    for index, shown in enumerate(["scripts from 0 shown", f"scripts from {third} shown", "widget scripts shown"]):
        _run(page, cells.nth(index))
        outputs = cells.nth(index).locator(".jp-OutputArea-output")
        expect(outputs.filter(has_text=shown)).to_have_count(1, timeout=CELL_TIMEOUT)
    expect(outputs.locator(".widget-checkbox")).to_have_count(1)  # the widgets were drawn
    page.wait_for_timeout(2000)  # an animation's begin, a frame's script, a focus
    return set(page.evaluate("() => window.__skVectors")), page.evaluate(DOM_CHECK)


#: the vectors that run in the control (the others are there for browsers and
#: Lab versions where they may: an inline ``<svg onload>`` and an autofocus in
#: inserted HTML do not fire in this one, and Chromium's parser keeps the two
#: other mutation tricks inert; widget values and the pager are cleaned even
#: with ``trust_outputs``)
LIVE_SCRIPTS = {
    "script",
    "script-src",
    "img-onerror",
    "svg-script",
    "svg-animate",
    "details",
    "animation",
    "srcdoc",
    "iframe-javascript",
    "mxss-noscript",
    "mxss-svg-style",
    "markdown-html",
    "markdown-script",
    "markdown-fence",
    "javascript-output",
    "output-widget",
    "update-display",
}


def test_control_without_the_output_policy_the_vectors_run_in_a_plain_lab(
    page: Page, trusting_lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> None:
    ran, clickable = _scripts(page, trusting_lab, recorder, tls)
    assert ran >= LIVE_SCRIPTS, f"the control ran only {sorted(ran)}"
    links = [found for found in clickable if "javascript:" in found]
    assert len(links) >= 5, f"the control's page holds only these javascript: addresses: {clickable}"
    assert any("data-commandlinker-command" in found for found in clickable), clickable


def test_a_sandboxs_outputs_run_no_script_in_a_plain_lab(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> None:
    """Guarantee 8's first half, where only the output policy holds it."""
    ran, clickable = _scripts(page, lab, recorder, tls)
    assert ran == set(), f"scripts from a sandbox's outputs ran in the page: {sorted(ran)}"
    assert clickable == [], f"a click would run a sandbox's script: {clickable}"


def _without_table_of_contents(root: Path) -> None:
    """Lab's table of contents parses every HTML output in a detached element,
    where a lazy image loads at once: switched off (as people may), a lazy
    image waits for its place on screen, as in other frontends."""
    page_config = root / "jupyter" / "config" / "labconfig" / "page_config.json"
    page_config.parent.mkdir(parents=True, exist_ok=True)
    page_config.write_text(json.dumps({"disabledExtensions": {"@jupyterlab/toc-extension": True}}))


@pytest.fixture(scope="module")
def lab_without_toc(
    chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path
) -> Iterator[LabServer]:
    """The plain Lab, its table of contents off."""
    root = tmp_path_factory.mktemp("lab-plain-armed")
    _without_table_of_contents(root)
    with serving(root, artifacts / "jupyter-lab-plain-armed.log", protected=False) as server:
        yield server


@pytest.fixture(scope="module")
def trusting_lab_without_toc(
    chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path
) -> Iterator[LabServer]:
    """The control: the plain Lab, its table of contents off, the kernel's output policy off (``trust_outputs``)."""
    root = tmp_path_factory.mktemp("lab-plain-armed-trusting")
    _without_table_of_contents(root)
    config = "c.SandboxKernel.trust_outputs = True\n"
    with serving(
        root, artifacts / "jupyter-lab-plain-armed-trusting.log", kernel_config=config, protected=False
    ) as server:
        yield server


def _armed(
    page: Page, lab: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener, first: list[str]
) -> tuple[set[str], set[str], str]:
    """Run ``first``, the armed public outputs, the ratchet and the private
    outputs: what was heard before the private outputs, what after, and the
    public outputs' text (their notes)."""
    cells = [*first, 'armed("armed", False)', RATCHET_CELL, 'armed("armed", True)']
    open_notebook(page, lab, _notebook(lab, "armed", recorder, tls, cells))
    notebook = page.locator(".jp-Notebook .jp-Cell")
    for index, shown in enumerate([*[None] * (len(first) - 1), f"battery of {len(CSS_PAYLOADS)} shown"]):
        _run(page, notebook.nth(index))
        if shown:
            expect(notebook.nth(index).locator(".jp-OutputArea-output", has_text=shown)).to_have_count(
                1, timeout=CELL_TIMEOUT
            )
    public = notebook.nth(len(first))
    _run(page, public)
    expect(public.locator(".jp-OutputArea-output", has_text="armed public shown")).to_have_count(
        1, timeout=CELL_TIMEOUT
    )
    page.wait_for_timeout(3000)
    before = _heard(recorder, "armed")
    _run(page, notebook.nth(len(first) + 1))
    expect(status_item(page)).to_have_attribute("data-network", "none", timeout=CELL_TIMEOUT)
    private = notebook.nth(len(first) + 2)
    _run(page, private)
    expect(private.locator(".jp-OutputArea-output", has_text="armed private shown")).to_have_count(
        1, timeout=CELL_TIMEOUT
    )
    expect(private.locator(".jp-OutputArea-output", has_text="unhidden")).to_have_count(1)
    page.wait_for_timeout(3000)
    text = "\n".join(public.locator(".jp-OutputArea-output").all_text_contents())
    return before, _heard(recorder, "armed") - before, text


def test_control_without_the_output_policy_styles_fetch_and_can_be_armed(
    page: Page, trusting_lab_without_toc: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> None:
    """The control of the CSS payloads and of the armed fetches: with the
    output policy off for public outputs (private ones are cleaned even so),
    the battery's styles fetch while public, and the armed outputs fetch
    nothing until a private output that names no address sets them off."""
    first = ["from payloads import armed, battery_of", f"battery_of('public', {sorted(CSS_PAYLOADS)!r})"]
    before, after, _ = _armed(page, trusting_lab_without_toc, recorder, tls, first)
    assert _heard(recorder, "public") >= LIVE_CSS, f"the control's styles fetched only {recorder.heard}"
    assert before == set(), f"an armed output fetched before it was set off: {before}"
    assert after == ARMED_FIRED, f"the private outputs set off only {after}"


def test_a_public_output_arms_no_fetch_a_private_output_sets_off_in_a_plain_lab(
    page: Page, lab_without_toc: LabServer, recorder: RecordingHTTPServer, tls: LoopbackListener
) -> None:
    """Helper 44's attack: a public output's style waits, a private output with
    no address in it sets it off. Styles fetch in no session and images load
    at once, so nothing is left to set off; the note says why."""
    first = ["from payloads import armed, battery_of", f"battery_of('public', {sorted(CSS_PAYLOADS)!r})"]
    before, after, text = _armed(page, lab_without_toc, recorder, tls, first)
    assert after == set(), f"a private output set off a fetch a public one armed: {after}"
    assert before == {"armed-lazy"}, f"before the private outputs: {before}"  # the image loads at once
    assert not _heard(recorder, "public") & CSS_PAYLOADS, f"a public style fetched: {recorder.heard}"
    assert "a public one could be set off later by a private output" in text, text
