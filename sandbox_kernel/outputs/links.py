"""Once a session is private, no output may carry a followable external URL.

A click on a link sends whatever the URL carries (the private rows in a query
string) to whoever owns the host in it. JupyterLab makes links from plain text
too: stream output, ``text/plain``, error messages and tracebacks go through
its ``autolink``, whose pattern (``@jupyterlab/rendermime``, ``webLinkRegex``)
takes any ``scheme://``, ``data:`` or ``www.`` run as a link; GitHub-flavoured
markdown also links bare ``https://`` and ``www.`` text. :func:`defang_text`
breaks exactly those markers the way threat-intel reports do, so the text stays
readable and no frontend links it: ``https://evil.example/x?d=1`` becomes
``https[:]//evil.example/x?d=1`` and ``www.evil.example`` becomes
``www[.]evil.example``. It works on the separators, not on whole URLs, so a URL
split by ANSI colour codes or zero-width characters is defanged as well, and
the cost is linear in the text (three plain regex passes, no backtracking).

Link targets in HTML, markdown and LaTeX are handled by the cleaners
(``_policy.link_ok(private=True)``): only relative and ``#fragment`` targets
remain; this module covers text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_SCHEME_SEP = re.compile(r"://")
_WWW = re.compile(r"(?i)\b(www)\.")
_PSEUDO = re.compile(r"(?i)\b(data|mailto|javascript|vbscript|file|tel|sms|ftp|ws|wss):")
#: a value a browser takes as a URL on another host without a scheme: ``//host``,
#: ``\\host`` or ``/\host`` (the URL parser reads ``\`` as ``/`` and drops
#: leading spaces and control characters)
_PROTOCOL_RELATIVE = re.compile(r"\A([\x00-\x20]*)[/\\][/\\]")


def defang_text(text: str) -> str:
    """``text`` with every marker a frontend turns into a link broken."""
    if not text:
        return text
    text = _SCHEME_SEP.sub("[:]//", text)
    text = _WWW.sub(r"\1[.]", text)
    return _PSEUDO.sub(r"\1[:]", text)


def defang_markdown(text: str) -> str:
    """Markdown's own autolinks (GFM: bare ``scheme://`` and ``www.``), leaving
    ``data:`` image sources (which link nothing) intact."""
    if not text:
        return text
    return _WWW.sub(r"\1[.]", _SCHEME_SEP.sub("[:]//", text))


def _defang_url(text: str) -> str:
    """``text`` defanged, and a leading ``//host`` (a URL on another host
    without a scheme) made a path on this one."""
    return _PROTOCOL_RELATIVE.sub(r"\1[/]/", defang_text(text))


def map_json_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A copy of a JSON value with ``fn`` applied to every string (keys too);
    iterative, so deep values cannot exhaust the stack."""
    if isinstance(value, str):
        return fn(value)
    if not isinstance(value, (list, dict)):
        return value
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            copy: Any = {}
            for k, v in item.items():
                stack.append((v, copy, fn(k) if isinstance(k, str) else k))
        elif isinstance(item, list):
            copy = [None] * len(item)
            for i, v in enumerate(item):
                stack.append((v, copy, i))
        else:
            copy = fn(item) if isinstance(item, str) else item
        parent[key] = copy
    return root[0]


def defang_json(value: Any, *, urls: bool = False) -> Any:
    """Every string of a JSON value (keys too) defanged. ``urls``: the strings
    may be used as URLs by code in the page (widget state: a map's tile URL, a
    third-party widget's image), so a scheme-less ``//host`` is broken too."""
    return map_json_strings(value, _defang_url if urls else defang_text)
