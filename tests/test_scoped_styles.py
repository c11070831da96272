"""A sandbox's style sheet styles its own output, nothing else on the page
(``sandbox_kernel/outputs/_scoped_css.py``).

An attack review: a public cell's ``<style>`` rewrote the sandbox status item
(the label shrunk to nothing, an ``::after`` reading "Network off") and hid
the "Mark session private…" button, in the guarded Lab and a plain one. Every
kept style sheet is now served inside ``@scope (.sk-output)``, and its output
wrapped in that element; the browser test is
``tests/browser/test_status_widget_styles.py``.
"""

from __future__ import annotations

import re

import pytest
import tinycss2
from wrapped_outputs import WRAPPER, scope, token_of

from sandbox_kernel.outputs import sanitize_bundle

SPOOF = (
    ".sk-status-label{font-size:0!important}"
    ".sk-status-item::after{content:'Network off';font-size:13px}"
    "button.sk-mark-private{display:none!important}"
)


def _style_of(out: str) -> str:
    found = re.search(r"<style[^>]*>(.*?)</style>", out, re.S)
    assert found, out
    return found.group(1)


def _top_level(css: str) -> list[tuple[str, str]]:
    """(kind, name or selector) of each top-level rule, as a browser parses it."""
    rules = tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True)
    return [
        (
            rule.type,
            rule.lower_at_keyword if rule.type == "at-rule" else tinycss2.serialize(getattr(rule, "prelude", [])),
        )
        for rule in rules
    ]


@pytest.mark.parametrize("mime", ["text/html", "text/markdown"])
@pytest.mark.parametrize("private", [False, True])
def test_a_style_sheet_is_limited_to_its_output(mime: str, private: bool) -> None:
    out = sanitize_bundle({mime: f"<style>{SPOOF}</style>\n\n<p>Loaded 3 rows.</p>"}, private=private).data[mime]
    assert WRAPPER.match(out.rstrip()), out
    assert _top_level(_style_of(out)) == [("at-rule", "scope")], out


@pytest.mark.parametrize(
    "escape",
    [
        "} .sk-status-label{font-size:0}",  # a brace closing the scope early
        "a{b:'}'} } .sk-status-label{font-size:0}",  # one in a string, then a real one
        "a{b:url(#x})} } .sk-status-label{font-size:0}",  # one in a url
        "a{b:c",  # one never closed
        "@media all{ } } .sk-status-label{font-size:0}",
        "a{}\\7d .sk-status-label{font-size:0}",  # an escaped brace
        # a "}" in a function: a parser counting any closing bracket as the
        # innermost block's end would close the scope with it
        "a{b:calc(})} .sk-status-label{font-size:0}",
        "a{b:)} .sk-status-label{font-size:0}",
    ],
)
def test_no_brace_of_the_sandbox_ends_the_scope(escape: str) -> None:
    out = sanitize_bundle({"text/html": f"<style>{escape}</style><p>x</p>"}).data["text/html"]
    css = _style_of(out) if "<style" in out else ""
    assert all(kind == "at-rule" and name == "scope" for kind, name in _top_level(css)), css
    assert "calc(}" not in css and "b:)" not in css, css  # (a rule with an unmatched bracket goes)


@pytest.mark.parametrize("depth", ["{}", "@media (min-width:1px){{{}}}", "@supports (color:red){{@layer l{{{}}}}}"])
def test_page_wide_at_rules_go_at_any_depth(depth: str) -> None:
    """Nested in ``@media`` Chromium still applies ``@property`` and the
    others to the whole page (a review of the first version): the label's
    font size went to 0 through an unscoped theme variable."""
    page_wide = (
        "@font-face{font-family:'Segoe UI';src:url(data:font/woff2;base64,AAAA)}"
        "@property --jp-ui-font-size1{syntax:'<length>';inherits:false;initial-value:0px}"
        "@keyframes fade-in{to{opacity:0}}"
        "@counter-style x{system:cyclic;symbols:a}"
    )
    css = depth.format(page_wide + ".x{color:red}")
    result = sanitize_bundle({"text/html": f"<style>{css}</style><p class='x'>x</p>"})
    style = _style_of(result.data["text/html"])
    assert _top_level(style) == [("at-rule", "scope")], style
    for name in ("font-face", "property", "keyframes", "counter-style"):
        assert f"@{name}" not in style, style
        assert f"CSS @{name} removed from text/html <style> (it would act on the whole page)" in result.removed
    assert ".x{color:red" in style


@pytest.mark.parametrize(
    "sheet",
    [
        '.x{content:"}"} .sk-status-item{--m1:1}',
        ".x{content:'}'} .sk-status-item{--m1:1}",
        ".a\\} .sk-status-item{--m1:1}",
        # both of the renderer's changes at once: \" to &quot; and \} to }
        '.a\\"\\}\\" .b{} .sk-status-item{--m1:1}',
    ],
)
@pytest.mark.parametrize("before", ["Loaded 3 rows. ", "- ", "> ", "    x\n    "])
def test_a_style_sheet_inside_a_markdown_line_is_not_kept(sheet: str, before: str) -> None:
    """A ``<style>`` inside a line is inline HTML to markdown: Lab's parser
    treats its text as markdown (quotes written as entities, which a style
    element never decodes; backslash escapes resolved; both at once), so a
    ``}`` the cleaner read in a string or an escaped name became a real one
    and ended the scope (two reviews, in Lab: the status item rewritten)."""
    result = sanitize_bundle({"text/markdown": f"{before}<style>{sheet}</style> rows"})
    out = result.data["text/markdown"]
    assert "sk-status-item" not in out, out


@pytest.mark.parametrize("before", ["", "para\n", "  ", "- item\n  "])
def test_a_style_sheet_beginning_a_markdown_line_is_kept_scoped(before: str) -> None:
    """At a line's start ``<style>`` begins an HTML block, passed on as it is."""
    result = sanitize_bundle({"text/markdown": f"{before}<style>.x{{color:red}}</style>\n\ntext"})
    out = result.data["text/markdown"]
    assert WRAPPER.match(out) and scope(out) + ".x{color:red}}" in out, out


def test_every_output_that_could_move_what_it_draws_is_contained() -> None:
    """Its element contains its paint (see _scoped_css.ELEMENT): an output's
    ``position:fixed`` banner drew over other cells (a review). HTML always;
    markdown with HTML or a math command (``\\style``); plain markdown draws
    nothing it could move, and is left as it is."""
    for mime, text in [
        ("text/html", "<b>x</b>"),
        ("text/html", '<p style="position:fixed;top:0">Network: off</p>'),
        ("text/markdown", '<p style="color:red">x</p>'),
        ("text/markdown", "$\\style{margin-top:-500px}{x}$"),
        ("text/markdown", "```mermaid\nflowchart TD\n  A --> B\n  style A margin-top:-500px\n```"),
    ]:
        out = sanitize_bundle({mime: text}).data[mime]
        assert WRAPPER.match(out) and out.count("<sk-output ") == 1, out
    assert sanitize_bundle({"text/markdown": "# A *title*"}).data["text/markdown"] == "# A *title*"


def test_an_outputs_sheet_cannot_unwrap_it_or_reach_another_output() -> None:
    """Reviews of the containment: a sheet's ``:scope { display: contents }``
    left the wrapper no box to contain; one class for every output let that
    rule reach every other output; and markdown's stray ``</div>`` closed a
    ``div`` wrapper early, the banner after it outside."""
    sheet = "<style>:scope{display:contents}</style><p>x</p>"
    first, second = (sanitize_bundle({"text/html": sheet}).data["text/html"] for _ in range(2))
    assert token_of(first) != token_of(second) and scope(first) in first and scope(second) not in first
    assert "display:block!important;contain:paint!important" in first.split(">", 1)[0]
    for mime in ("text/markdown", "text/html"):
        escape = '</div></sk-output><div style="position:fixed;top:0">Network: off</div>'
        out = sanitize_bundle({mime: escape}).data[mime]
        assert WRAPPER.match(out) and out.count("</sk-output>") == 1, out  # (the sandbox's own is not a tag)


def test_an_output_cleaned_again_keeps_its_look() -> None:
    """A saved notebook's outputs are cleaned again for an export
    (``lab_html_exports.shown_as_in_lab``): the markdown cleaner showed the
    wrapper as text, and an HTML output's scoped sheet was dropped as an
    at-rule of the whole page (a review). The wrapper and its scope are taken
    off first, and put back."""
    html = "<style>.x{color:red}</style><p class='x'>Loaded 3 rows.</p>"
    once = sanitize_bundle({"text/html": html}).data["text/html"]
    twice = sanitize_bundle({"text/html": once})
    assert twice.removed == [] and scope(twice.data["text/html"]) + ".x{color:red}}" in twice.data["text/html"], twice
    markdown = "# Results\n\n<b>42</b> rows"
    once = sanitize_bundle({"text/markdown": markdown}).data["text/markdown"]
    twice = sanitize_bundle({"text/markdown": once}).data["text/markdown"]
    assert WRAPPER.match(twice) and "&lt;sk-output" not in twice and twice.count("<sk-output ") == 1, twice


def test_a_sheet_cannot_move_the_element_that_contains_it() -> None:
    """A review: the scope root was the contained element, and a sheet's
    ``:scope { position: fixed }`` moved it over the page. The root is an
    element inside it now; the outer one has no class a sheet could name."""
    out = sanitize_bundle({"text/html": "<style>:scope{position:fixed}</style><p>x</p>"}).data["text/html"]
    outer = out.split(">", 1)[0]
    assert "class=" not in outer and "contain:paint!important" in outer, out
    assert f'<sk-output-body style="display:block" class="sk-output sk-output-{token_of(out)}">' in out, out
