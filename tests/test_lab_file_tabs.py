"""The rewrite sandbox_kernel.lab_file_tabs applies to files opened in a tab of
their own (the browser's side: tests/browser/test_file_tabs.py)."""

from __future__ import annotations

import re

import pytest

from sandbox_kernel.lab_file_tabs import KEPT_RELATIONS, is_markup, is_sandboxed, tightened_policy, without_hints


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
