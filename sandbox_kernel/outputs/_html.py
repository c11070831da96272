"""text/html cleaning with nh3 (ammonia): a real HTML parser, then an allow-list.

The allow-list is wide enough for pandas DataFrames (incl. ``<style scoped>``
and Styler ids), IPython.display HTML and simple reports, and nothing that can
run code: no scripts, event handlers, frames, forms, ``<base>``/``<meta>``/
``<link>``, inline SVG/MathML, or ``javascript:``/``data:text/html`` URLs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import nh3

from ._policy import (
    DROP_WITH_CONTENT,
    HTML_ATTRIBUTES,
    HTML_TAGS,
    LINK_REL,
    Notes,
    clean_css,
    clean_tex,
    make_attribute_filter,
)
from ._scoped_css import new_token, scope_style_sheet, wrapped

_START_TAG = re.compile(r"<([a-zA-Z][a-zA-Z0-9:\-]*)")
_EVENT_ATTR = re.compile(r"[\s\"'/]on[a-zA-Z]{3,}\s*=")
_SCRIPT_URL = re.compile(r"(?:java|vb)script\s*:", re.I)
# nh3 serialises <style> in lower case and its content verbatim; attribute
# values that could fake a "<style" are dropped by the filter below.
_STYLE_BLOCK = re.compile(r"(<style\b[^>]*>)(.*?)(</style>)", re.S)
_FAKE_STYLE = re.compile(r"<\s*/?\s*style", re.I)
MAX_TAG_NOTES = 12


def _guard_style_regex(
    inner: Callable[[str, str, str], str | None],
) -> Callable[[str, str, str], str | None]:
    """Drop attribute values containing ``<style`` so the post-pass that
    cleans ``<style>`` contents cannot be fooled by markup-looking values."""

    def attribute_filter(tag: str, attr: str, value: str) -> str | None:
        if _FAKE_STYLE.search(value):
            return None
        return inner(tag, attr, value)

    return attribute_filter


def note_removed_tags(text: str, notes: Notes, where: str) -> None:
    """Name the tags that the allow-list is about to remove."""
    seen: set[str] = set()
    for m in _START_TAG.finditer(text):
        name = m.group(1).lower()
        if name in HTML_TAGS or name in seen:
            continue
        seen.add(name)
        if len(seen) > MAX_TAG_NOTES:
            notes.add(f"more tags removed from {where}")
            break
        notes.add(f"<{name}> removed from {where}")


def clean_html(text: str, *, private: bool, notes: Notes, where: str = "text/html") -> str:
    """Return ``text`` cleaned for display; notes say what went."""
    note_removed_tags(text, notes, where)
    attribute_filter = _guard_style_regex(make_attribute_filter(private=private, notes=notes, where=where))
    out = nh3.clean(
        text,
        tags=set(HTML_TAGS),
        clean_content_tags=set(DROP_WITH_CONTENT),
        attributes={tag: set(attrs) for tag, attrs in HTML_ATTRIBUTES.items()},
        attribute_filter=attribute_filter,
        url_schemes={"http", "https", "mailto", "data"},
        link_rel=LINK_REL,
        strip_comments=True,
    )
    if len(_EVENT_ATTR.findall(out)) < len(_EVENT_ATTR.findall(text)):
        notes.add(f"event handler attributes (on...=) removed from {where}")
    if len(_SCRIPT_URL.findall(out)) < len(_SCRIPT_URL.findall(text)):
        notes.add(f"javascript:/vbscript: URL removed from {where}")

    styled = False
    token = new_token()

    def fix_style(m: re.Match[str]) -> str:
        nonlocal styled
        css = clean_css(m.group(2), private=private, notes=notes, where=f"{where} <style>")
        if css:  # its rules style this output only
            css = scope_style_sheet(css, notes=notes, where=f"{where} <style>", token=token)
            styled = styled or bool(css)
        return m.group(1) + (css or "") + m.group(3)

    if "<style" in out:
        out = _STYLE_BLOCK.sub(fix_style, out)
    out = clean_tex(out, private=private, notes=notes, where=where)
    return wrapped(out, token) if styled else out
