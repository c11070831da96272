"""The rewrite sandbox_kernel.lab_file_tabs applies to files opened in a tab of
their own, and to workspace files a page would load as scripts (the browser's
side: tests/browser/test_file_tabs.py, tests/browser/test_page_scripts.py)."""

from __future__ import annotations

import re

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from sandbox_kernel.lab_file_tabs import (
    KEPT_RELATIONS,
    SCRIPT_TYPES,
    FileTabTransform,
    is_markup,
    is_sandboxed,
    tightened_policy,
    without_hints,
)


def test_the_sandbox_directive_loses_every_allowance() -> None:
    policy = "default-src 'self'; img-src 'self' data:; sandbox allow-scripts allow-popups; report-uri /r"
    assert tightened_policy(policy) == "default-src 'self'; img-src 'self' data:; sandbox; report-uri /r"
    assert tightened_policy("SANDBOX allow-scripts") == " sandbox"
    assert tightened_policy("default-src 'self'") == "default-src 'self'"
    assert is_sandboxed("default-src 'self';  sandbox allow-scripts")
    assert not is_sandboxed("default-src 'self'; script-src 'self' sandbox.example")


@pytest.mark.parametrize(
    ("content_type", "markup"),
    [
        ("text/html", True),
        ("text/html; charset=UTF-8", True),
        ("image/svg+xml", True),
        ("application/xhtml+xml", True),
        ("text/xml", True),
        ("application/xml", True),
        ("application/atom+xml", True),
        ("text/plain; charset=UTF-8", False),
        ("application/json", False),
        ("application/x-ipynb+json", False),
        ("image/png", False),
        ("", False),
    ],
)
def test_markup_types(content_type: str, markup: bool) -> None:
    assert is_markup(content_type) is markup


@pytest.mark.parametrize(
    "tag",
    [
        b'<link rel="preconnect" href="http://x">',
        b"<LINK REL=preconnect HREF=http://x>",
        b'<link rel="dns-prefetch" href="//x">',
        b'<link rel="prefetch" href="/a">',
        b'<link rel="pre&#99;onnect" href="http://x">',  # a character reference in rel
        b'<link rel="stylesheet preconnect" href="http://x">',
        b'<link rel="stylesheet" rel="preconnect" href="http://x">',  # a second rel
        b'<link rel="stylesheet" href="a.css" as="style">',  # an attribute not kept
        b'<link rel="stylesheet" href="a.css" / >',  # a form outside the plain one
        b"<link/rel=preconnect href=http://x>",
        b'<link\nrel=stylesheet onload="x">',
        b'<h:link xmlns:h="http://www.w3.org/1999/xhtml" rel="stylesheet" href="a.css"/>',  # XML: every prefixed one
        '<ñ:link xmlns:ñ="http://www.w3.org/1999/xhtml" rel="preconnect" href="x"/>'.encode(),  # any prefix
        b'<link rel="search" type="application/opensearchdescription+xml" href="/o.xml">',
    ],
)
def test_every_link_not_plainly_kept_is_renamed(tag: bytes) -> None:
    body = b"<html><head>" + tag + b"</head><body>report</body></html>"
    rewritten = without_hints(body)
    assert b"x-link" in rewritten.lower()
    assert re.search(rb"<([^\s<>/:=\"']*:)?link", rewritten, re.IGNORECASE) is None, rewritten


@pytest.mark.parametrize(
    "tag",
    [
        b'<link rel="stylesheet" href="style.css">',
        b'<link rel="stylesheet" type="text/css" href="_static/pygments.css?v=4f649999" />',
        b"<link rel='icon' href='logo.png'>",
        b'<LINK REL="Shortcut  Icon" HREF="favicon.ico">',
        b'<link rel="next" title="Next" href="page2.html">',
        b'<link\trel="canonical"\nhref="https://example.org/page">',
    ],
)
def test_plain_stylesheets_icons_and_page_relations_are_kept(tag: bytes) -> None:
    body = b"<html><head>" + tag + b"</head><body>report</body></html>"
    assert without_hints(body) == body
    assert "stylesheet" in KEPT_RELATIONS and "preconnect" not in KEPT_RELATIONS


def test_end_tags_and_prefixes_are_renamed_with_their_start() -> None:
    body = b'<svg><h:link xmlns:h="x" rel="preconnect" href="y"></h:link><LINK rel=prefetch></LINK></svg>'
    assert without_hints(body) == (
        b'<svg><h:x-link xmlns:h="x" rel="preconnect" href="y"></h:x-link><x-LINK rel=prefetch></x-LINK></svg>'
    )


def test_text_that_only_looks_like_a_tag_is_left() -> None:
    body = b"<p>linked lists, <linkage>, a <blink> tag and the word link</p>"
    assert without_hints(body) == body


def test_bytes_that_spell_tags_another_way_are_removed() -> None:
    # UTF-16 needs NUL bytes for every ASCII character; without them the page
    # has no ASCII "<" at all. ISO-2022-JP drops ESC sequences: "<" ESC ( B "link".
    assert without_hints("<link rel=preconnect>".encode("utf-16-le")) == b"<x-link rel=preconnect>"
    assert without_hints(b"<\x1b(Blink rel=preconnect>") == b"<(Blink rel=preconnect>"
    assert without_hints(b"<li\x00nk rel=preconnect>") == b"<x-link rel=preconnect>"


def test_xml_entity_declarations_and_stylesheet_instructions_are_renamed() -> None:
    body = b"<?xml-stylesheet href='s.xsl'?><!DOCTYPE svg [<!ENTITY h \"&#60;h:link/&#62;\">]><svg>&h;</svg>"
    assert without_hints(body) == (
        b"<?x-xml-stylesheet href='s.xsl'?><!DOCTYPE svg [<!x-ENTITY h \"&#60;h:link/&#62;\">]><svg>&h;</svg>"
    )


def test_a_page_without_hints_is_sent_as_it_was() -> None:
    body = '<!doctype html><html><head><meta charset="utf-8"><title>Réport</title></head><body><p>ok</p></body></html>'
    assert without_hints(body.encode()) == body.encode()


def test_srcdoc_documents_are_renamed_wherever_they_stand() -> None:
    """A srcdoc frame's document spells its tags with character references;
    an attribute may follow a quoted value without a space."""
    body = (
        b'<iframe srcdoc="&lt;link rel=&quot;preconnect&quot; href=&quot;http://x&quot;&gt;"></iframe>'
        b"<IFRAME title='t'SRCDOC='&lt;p&gt;'></IFRAME><p>srcdoc, the word</p>"
    )
    rewritten = without_hints(body)
    assert re.search(rb"(?<!x-)srcdoc", rewritten, re.IGNORECASE) is None, rewritten
    assert rewritten.count(b"x-srcdoc") + rewritten.count(b"x-SRCDOC") == 3


def _sent(path: str, headers: dict[str, str], prefixes: tuple[str, ...] = ("/files/", "/nbconvert/")) -> HTTPHeaders:
    """The headers FileTabTransform sends for a response to GET ``path``."""
    request = HTTPServerRequest(
        start_line=RequestStartLine("GET", path, "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "127.0.0.1", "Sec-Fetch-Dest": "script"}),
    )
    transform = FileTabTransform(request, workspace_prefixes=prefixes)
    _, sent, body = transform.transform_first_chunk(200, HTTPHeaders(headers), b"alert(1)", True)
    assert body == b"alert(1)"  # the bytes are unchanged
    return sent


@pytest.mark.parametrize("content_type", [*sorted(SCRIPT_TYPES), "Text/JavaScript; charset=utf-8"])
def test_a_workspace_file_is_never_sent_as_a_script(content_type: str) -> None:
    sent = _sent("/files/attack/evil.js", {"Content-Type": content_type})
    assert sent["Content-Type"] == "text/plain; charset=UTF-8" and sent["X-Content-Type-Options"] == "nosniff"


def test_a_script_export_and_a_download_are_never_sent_as_scripts() -> None:
    # nbconvert's sandbox switched off (nbconvert_csp_sandbox=False): the route still counts
    export = _sent("/nbconvert/script/attack/js.ipynb", {"Content-Type": "text/javascript; charset=utf-8"})
    assert export["Content-Type"] == "text/plain; charset=UTF-8"
    download = _sent(
        "/files/evil.js?download=1",
        {"Content-Type": "text/javascript", "Content-Disposition": 'attachment; filename="evil.js"'},
    )
    assert download["Content-Type"] == "text/plain; charset=UTF-8"
    assert download["Content-Disposition"] == 'attachment; filename="evil.js"'


def test_any_sandboxed_response_is_never_a_script_and_the_servers_own_scripts_stay() -> None:
    sandboxed = _sent("/other/x.js", {"Content-Type": "application/javascript", "Content-Security-Policy": "sandbox"})
    assert sandboxed["Content-Type"] == "text/plain; charset=UTF-8"
    own = _sent("/static/lab/main.js", {"Content-Type": "application/javascript"})
    assert own["Content-Type"] == "application/javascript" and "X-Content-Type-Options" not in own
    # under a base URL, the routes are the base URL's
    based = _sent("/files/x.js", {"Content-Type": "text/javascript"}, prefixes=("/jupyter/files/",))
    assert based["Content-Type"] == "text/javascript"
    assert _sent("/jupyter/files/x.js", {"Content-Type": "text/javascript"}, ("/jupyter/files/",))[
        "Content-Type"
    ].startswith("text/plain")
