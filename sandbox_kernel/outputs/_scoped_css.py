"""A sandbox's style sheet styles its own output, nothing else on the page.

Why: JupyterLab inserts a trusted output's HTML into its page, and a
``<style>`` element there applies to the whole page. A public cell's style
sheet rewrote the sandbox status item, the user's authority on a session's
network: ``.sk-status-label { font-size: 0 }`` with an ``::after`` reading
"Network off · CONFIDENTIAL" while the session was public with network, and
the popup's "Mark session private…" button hidden (an attack review, in the
guarded and the plain Lab). The cleaners only removed what fetches or runs.

So every style sheet kept in an HTML or markdown output is parsed (tinycss2,
the CSS Syntax parser bleach and nbconvert use) and served again inside
``@scope (.sk-output-<token>) { ... }``, and the output is wrapped in an
element of that class: a rule can only style elements inside its own output.
The token is random for each output: with one class for all, one output's
``:scope`` rule restyled every other (a review).
The serialisation is the parser's own, so no brace of the sandbox's text can
close the scope early. At-rules that act on the whole page are dropped: a
``@font-face`` can give a family the page uses other glyphs (a spoof of any
text), ``@property`` can stop a theme variable from being inherited (every
font size zero), ``@keyframes`` can take over an animation of the page (a
toast's entrance held at opacity 0), at any depth. A browser without
``@scope`` ignores the scoped rules: an output loses its styling there,
nothing else.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import tinycss2

from ._policy import Notes

#: the class of the element every scoped style sheet's rules are limited to
SCOPE_CLASS = "sk-output"
#: grouping at-rules kept, at any depth (their rules stay scoped); every other
#: at-rule goes wherever it is: nested in ``@media`` Chromium still applies
#: ``@property``, ``@font-face``, ``@keyframes`` and ``@counter-style`` to the
#: whole page (a review of the first version)
_KEPT = {"media", "supports", "container", "layer", "starting-style"}


def new_token() -> str:
    """The class suffix of one output's element (and of its sheets' scope)."""
    return secrets.token_hex(6)


def _opening(token: str) -> str:
    return f"@scope (.{SCOPE_CLASS}-{token}) {{"


def scope_style_sheet(css: str, *, notes: Notes, where: str, token: str) -> str:
    """``css`` (already cleaned) with its rules limited to the output whose
    element has the class ``sk-output-<token>``; "" when that cannot be made
    sure of."""
    if _plainly_nested(css):
        return f"{_opening(token)}{css}}}"
    dropped: set[str] = set()
    body = _rules(tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True), dropped)
    for what in sorted(dropped):
        notes.add(f"CSS {what} removed from {where} (it would act on the whole page)")
    # as clean_css leaves it: no "<" can close the <style> element
    out = f"{_opening(token)}{body}}}".replace("<", "\\3c ") if body else ""
    if out and not structure_holds(out, token):
        notes.add(f"CSS removed from {where} (its rules could not be kept to the output)")
        return ""
    return out


def _rules(items: list[Any], dropped: set[str]) -> str:
    """``items`` (rules, or a block's declarations and nested rules) served
    again by the parser: grouping at-rules and style rules with their
    contents cleaned the same way, declarations as they are."""
    out: list[str] = []
    for item in items:
        kind = item.type
        if kind in ("qualified-rule", "at-rule") and _stray_brace(item):
            # a bracket the parser did not match: browsers do not all match
            # them alike (one counts any closing bracket as the end of the
            # innermost block), and inside the scope one could end it
            dropped.add("rule with an unmatched bracket")
        elif kind == "declaration":
            out.append(tinycss2.serialize([item]))  # (with its ";")
        elif kind == "qualified-rule":
            out.append(f"{tinycss2.serialize(item.prelude)}{{{_block(item.content, dropped)}}}")
        elif kind == "at-rule" and item.lower_at_keyword in _KEPT and item.content is not None:
            prelude = tinycss2.serialize(item.prelude)
            out.append(f"@{item.lower_at_keyword}{prelude}{{{_block(item.content, dropped)}}}")
        elif kind == "at-rule":
            dropped.add(f"@{item.lower_at_keyword[:40]}")
        elif kind == "error":
            dropped.add("that does not parse")
    return "".join(out)


def _block(content: list[Any], dropped: set[str]) -> str:
    return _rules(tinycss2.parse_blocks_contents(content, skip_comments=True, skip_whitespace=True), dropped)


def structure_holds(css: str, token: str) -> bool:
    """Whether ``css``, parsed again, is one ``@scope (.sk-output-<token>)`` block
    holding no bracket the parser did not match: what a browser will find.
    For a text a renderer may change before the browser sees it (markdown's
    escapes and entities turned a ``}`` in a string into a real one)."""
    rules = tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True)
    return (
        len(rules) == 1
        and rules[0].type == "at-rule"
        and rules[0].lower_at_keyword == "scope"
        and tinycss2.serialize(rules[0].prelude).strip() == f"(.{SCOPE_CLASS}-{token})"
        and not _stray_brace(rules[0])
    )


_BRACKETS = re.compile(r"[(){}\[\]]")
_PAIRS = {")": "(", "]": "[", "}": "{"}


def _plainly_nested(css: str) -> bool:
    """Whether ``css`` can be scoped as it is: no at-rule, nothing that hides
    a bracket from a plain count (a string, an escape, a comment) and every
    bracket matched in order, so every parser sees the same blocks. A style
    sheet of pandas' Styler (megabytes of ``#T_..._row0_col0 {...}``) is, and
    parsing one costs half a second a megabyte."""
    if "@" in css or '"' in css or "'" in css or "\\" in css or "/*" in css:
        return False
    open_: list[str] = []
    for bracket in _BRACKETS.findall(css):
        if bracket in "({[":
            open_.append(bracket)
        elif not open_ or open_.pop() != _PAIRS[bracket]:
            return False
    return not open_


def _stray_brace(node: Any) -> bool:
    """Whether ``node`` holds, anywhere, a bracket the parser did not match
    (a ``}`` in a function's arguments, a stray ``)``): browsers do not all
    match them alike (one counts any closing bracket as the end of the
    innermost block), and inside the scope one could end it."""
    stack = [node]
    while stack:
        item = stack.pop()
        kind = getattr(item, "type", None)
        if kind == "error" or (kind == "literal" and item.value in ("}", ")", "]")):
            return True
        for part in ("prelude", "content", "arguments"):
            children = getattr(item, part, None)
            if isinstance(children, list):
                stack.extend(children)
    return False


#: the output's element: its style sheets are limited to it (``@scope``), and
#: nothing of it is drawn outside it. JupyterLab shows a kernel's output as
#: trusted, without its own sanitiser (which allows no ``position: fixed``),
#: and a cell's ``position:fixed`` banner, a negative margin, a transform or a
#: Lab class such as ``lm-Menu`` drew over other cells: "Network: off ·
#: session private" over the notebook, clicks meant for other cells caught (an
#: attack review, in Lab and Notebook 7). Paint containment makes it the
#: containing block of every positioned element inside and clips what is
#: drawn to it; it scrolls what is wider. Inline and ``!important``, with its
#: ``display``: a sheet's ``:scope { display: contents }`` left it no box to
#: contain (a review). A custom element, not a ``div``: the markdown cleaner
#: shows an unknown hyphenated tag as text and nh3 drops it, so no
#: ``</div>`` of the sandbox's closes it early (a review).
ELEMENT = "sk-output"
#: the element inside it that a sheet's ``@scope`` root is: a sheet styles
#: the root too (``:scope``), and ``:scope { position: fixed }`` moved the
#: containing element itself over the page (a review); the outer element has
#: no class, nothing a sheet can name
BODY = "sk-output-body"
_STYLE = "display:block!important;contain:paint!important;overflow:auto!important"
OUTER = f'<{ELEMENT} style="{_STYLE}">'
#: how the body element begins (its class then goes on: the token)
BODY_PREFIX = f'<{BODY} style="display:block" class="{SCOPE_CLASS} {SCOPE_CLASS}-'


def _opening_tag(token: str, between: str = "") -> str:
    """Both opening tags; in markdown each on a line of its own (an HTML
    block begins with one tag alone on its line)."""
    return f'{OUTER}{between}{BODY_PREFIX}{token}">'


def _closing_tag(between: str = "") -> str:
    return f"</{BODY}>{between}</{ELEMENT}>"


def wrapped(html: str, token: str) -> str:
    """``html`` inside the element its scoped style sheets are limited to."""
    return f"{_opening_tag(token)}{html}{_closing_tag()}"


def contained(out: str, *, markdown: bool = False, token: str | None = None) -> str:
    """A cleaned HTML or markdown output in that element (once). Markdown
    with no HTML, no math command and no diagram (Lab draws a ``mermaid``
    fence, with its own styles) draws nothing it could move, and stays as it
    is; else its opening and closing tags are an HTML block of their own
    lines, so the markdown between stays markdown."""
    if out.startswith(OUTER) or (markdown and "<" not in out and "\\" not in out and "mermaid" not in out.lower()):
        return out
    token = token or new_token()
    if markdown:
        return f"{_opening_tag(token, chr(10))}\n\n{out}\n\n{_closing_tag(chr(10))}"
    return wrapped(out, token)


#: a wrapped output, HTML or markdown
WRAPPED = re.compile(
    re.escape(OUTER)
    + "\n?"
    + re.escape(BODY_PREFIX)
    + r'(?P<token>[0-9a-f]{12})">(?P<inner>.*)'
    + re.escape(f"</{BODY}>")
    + "\n?"
    + re.escape(f"</{ELEMENT}>")
    + r"\Z",
    re.DOTALL,
)
_STYLE_ELEMENT = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.DOTALL | re.IGNORECASE)


def unwrapped(out: str, *, markdown: bool = False) -> str:
    """An output this kernel wrapped (a saved notebook's, cleaned again for an
    export), as it was before: the element and its sheets' scope taken off,
    for the cleaners to do again. Anything else is returned as it is (a
    sandbox's look-alike is cleaned as any text then: nothing is trusted
    here). Without it an export showed a markdown output's element as text,
    and dropped every HTML output's scoped sheet (a review)."""
    if not out.startswith(OUTER):
        return out
    found = WRAPPED.match(out)
    if found is None:
        return out
    inner, opening = found["inner"], _opening(found["token"])
    if markdown and inner.startswith("\n\n") and inner.endswith("\n\n"):
        inner = inner[2:-2]

    def unscoped(m: re.Match[str]) -> str:
        css = m.group(2)
        if css.startswith(opening) and css.endswith("}"):
            css = css[len(opening) : -1]
        return m.group(1) + css + m.group(3)

    return _STYLE_ELEMENT.sub(unscoped, inner) if "<style" in inner.lower() else inner
