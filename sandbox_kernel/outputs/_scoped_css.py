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
``@scope (.sk-output) { ... }``, and the output is wrapped in
``<div class="sk-output">``: a rule can only style elements inside an output.
The serialisation is the parser's own, so no brace of the sandbox's text can
close the scope early. At-rules that act on the whole page are dropped: a
``@font-face`` can give a family the page uses other glyphs (a spoof of any
text), ``@property`` can stop a theme variable from being inherited (every
font size zero); ``@keyframes`` only names an animation and stays, outside
the scope (where it is allowed). A browser without ``@scope`` ignores the
scoped rules: an output loses its styling there, nothing else.
"""

from __future__ import annotations

import re
from typing import Any

import tinycss2

from ._policy import Notes

#: the class of the element every scoped style sheet's rules are limited to
SCOPE_CLASS = "sk-output"
#: page-wide at-rules kept (outside the scope: they select nothing)
_KEPT_GLOBAL = {"keyframes", "-webkit-keyframes"}
#: grouping at-rules allowed inside ``@scope`` (their rules stay scoped)
_KEPT_SCOPED = {"media", "supports", "container", "layer", "starting-style"}


def scope_style_sheet(css: str, *, notes: Notes, where: str) -> str:
    """``css`` (already cleaned) with its rules limited to ``.sk-output``;
    "" when that cannot be made sure of."""
    if _plainly_nested(css):
        return f"@scope (.{SCOPE_CLASS}) {{{css}}}"
    kept: list[Any] = []
    scoped: list[Any] = []
    for rule in tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True):
        if rule.type in ("qualified-rule", "at-rule") and _stray_brace(rule):
            notes.add(f"CSS rule with an unmatched bracket removed from {where}")
        elif rule.type == "qualified-rule":
            scoped.append(rule)
        elif rule.type == "at-rule" and rule.lower_at_keyword in _KEPT_GLOBAL:
            kept.append(rule)
        elif rule.type == "at-rule" and rule.lower_at_keyword in _KEPT_SCOPED and rule.content is not None:
            scoped.append(rule)
        elif rule.type == "at-rule":
            notes.add(f"CSS @{rule.lower_at_keyword[:40]} removed from {where} (it would act on the whole page)")
        else:  # a parse error: browsers drop it too
            notes.add(f"CSS that does not parse removed from {where}")
    out = str(tinycss2.serialize(kept))
    if scoped:
        out += f"@scope (.{SCOPE_CLASS}) {{{tinycss2.serialize(scoped)}}}"
    # as clean_css leaves it: no "<" can close the <style> element
    return out.replace("<", "\\3c ")


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


def wrapped(html: str) -> str:
    """``html`` inside the element its scoped style sheets are limited to."""
    return f'<div class="{SCOPE_CLASS}">{html}</div>'
