"""The scripts an HTML page runs, as a browser finds them, and the
Content-Security-Policy sources that allow exactly those.

Why one module: two policies allow a page's own inline scripts by hash and
nothing else inline: an HTML export's (its template's scripts,
:mod:`sandbox_kernel.lab_html_exports`) and the Jupyter server's pages
(Lab's and Notebook 7's token-removal script,
:mod:`sandbox_kernel.lab_content_policy`). Both must read a page the way the
browser will, or a hash would allow nothing (the page breaks) or the wrong
text.
"""

from __future__ import annotations

import base64
import hashlib
from html.parser import HTMLParser

#: script types a browser runs (anything else is a data block, e.g. JSON)
JS_TYPES = frozenset({"", "text/javascript", "application/javascript", "module", "text/ecmascript"})
#: MathJax 2 reads blocks of this type and evaluates them (``eval``)
MATHJAX_CONFIG_TYPE = "text/x-mathjax-config"


class PageResources(HTMLParser):
    """The scripts and stylesheets of a page: ``inline_scripts`` (the text of
    each ``<script>`` without ``src`` that the browser runs), ``script_urls``,
    ``style_urls``, and whether a MathJax 2 configuration block is present."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.inline_scripts: list[str] = []
        self.script_urls: list[str] = []
        self.style_urls: list[str] = []
        self.mathjax_config = False
        self._script_type: str | None = None
        self._has_src = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "script":
            self._has_src = bool(values.get("src"))
            if self._has_src:
                self.script_urls.append(values["src"])
            self._script_type = values.get("type", "").strip().lower()
            self._text = []
        elif tag == "link" and "stylesheet" in values.get("rel", "").lower().split() and values.get("href"):
            self.style_urls.append(values["href"])

    def handle_data(self, data: str) -> None:
        if self._script_type is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != "script" or self._script_type is None:
            return
        text, kind = "".join(self._text), self._script_type
        self._script_type = None
        if kind == MATHJAX_CONFIG_TYPE:
            self.mathjax_config = True
        elif kind in JS_TYPES and text and not self._has_src:
            # a script with src runs the address, never its own text
            self.inline_scripts.append(text)


def read_page(page: str) -> PageResources:
    """The resources of ``page`` (its whole text)."""
    found = PageResources()
    found.feed(page)
    found.close()
    return found


def script_hash(script: str) -> str:
    """The CSP source (``'sha256-…'``) that allows an inline script of exactly this text."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


__all__ = ["JS_TYPES", "MATHJAX_CONFIG_TYPE", "PageResources", "read_page", "script_hash"]
