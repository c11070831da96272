"""text/markdown cleaning that keeps the markdown intact.

Frontends turn markdown into HTML and insert it unfiltered when the output is
trusted, so raw HTML inside markdown, link targets (``[x](javascript:...)``)
and MathJax commands are all ways to run script. Running the whole text through
an HTML sanitiser would mangle markdown (``> quote`` becomes ``&gt; quote``), so
instead every tag-like piece is found the way a browser tokenises it and is
either re-written in a canonical, cleaned form, removed, or escaped to text;
nothing a browser could read as a tag is left as it came. Code spans/blocks and
``$math$`` only change how gently this is done (a ``<module>`` in a code span
stays), never whether it is safe: a wrong guess about what is code still leaves
only harmless tags behind.
"""

from __future__ import annotations

import bisect
import html
import re

from ._policy import (
    DROP_WITH_CONTENT,
    HTML_ATTRIBUTES,
    HTML_TAGS,
    LINK_REL,
    MAX_CSS_CHARS,
    PRIVATE_REASON,
    Notes,
    clean_css,
    clean_tex,
    describe_url_removal,
    link_ok,
    make_attribute_filter,
    normalise_url,
)
from ._scoped_css import contained, new_token, scope_style_sheet, structure_holds
from .links import defang_markdown

WHERE = "text/markdown"

#: Standard HTML/SVG/MathML root names: not allowed ones are removed (with a
#: note); tag-like text with other names (``<module>``, ``<function f>``) is
#: shown as text instead.
KNOWN_ELEMENTS: frozenset[str] = (
    HTML_TAGS
    | DROP_WITH_CONTENT
    | frozenset(
        [
            "acronym",
            "address",
            "area",
            "article",
            "aside",
            "audio",
            "base",
            "basefont",
            "bgsound",
            "big",
            "blink",
            "body",
            "button",
            "canvas",
            "center",
            "content",
            "data",
            "datalist",
            "dialog",
            "dir",
            "element",
            "embed",
            "fieldset",
            "font",
            "footer",
            "form",
            "header",
            "hgroup",
            "html",
            "image",
            "input",
            "isindex",
            "keygen",
            "label",
            "legend",
            "link",
            "listing",
            "main",
            "map",
            "marquee",
            "menu",
            "menuitem",
            "meta",
            "meter",
            "multicol",
            "nav",
            "nextid",
            "nobr",
            "optgroup",
            "option",
            "output",
            "param",
            "picture",
            "portal",
            "progress",
            "rb",
            "rtc",
            "search",
            "section",
            "shadow",
            "slot",
            "source",
            "spacer",
            "strike",
            "tt",
            "track",
            "video",
        ]
    )
)
_PLAIN_NAME = re.compile(r"[a-z][a-z0-9\-]*\Z")
_AUTOLINK = re.compile(r"<(?:https?|mailto):[^\s<>\"'`]*>\Z", re.I)
_LINE_BREAK = re.compile(r"[\r\n]")
_MD_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


# ----------------------------------------------------------------------------- tags


class Tag:
    """A tag as the HTML tokenizer sees it: ``s[start:end]``."""

    __slots__ = ("attrs", "closing", "end", "name", "start")

    def __init__(self, start: int, end: int, name: str, closing: bool, attrs: list[tuple[str, str | None]]):
        self.start, self.end, self.name, self.closing, self.attrs = start, end, name, closing, attrs


def _is_alpha(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


#: A tag's name, its attributes' names and unquoted values stop at a "<" here,
#: and the tag is then not one (its "<" is escaped): a browser reads on, but
#: every "<" of a run such as "<a<a<a..." began a parse to the run's end, and
#: 64 KB of it took 2.9 s, 4 MB hours (an attack review). No markup a notebook
#: means has a "<" there.
_TAG_NAME = re.compile(r"[^\t\n\f\r /><]*")
_ATTR = re.compile(
    r"[\t\n\f\r /]*(?:(>)|([^\t\n\f\r /><][^\t\n\f\r />=<]*)"
    r"(?:[\t\n\f\r ]*=[\t\n\f\r ]*(?:\"([^\"]*)\"|'([^']*)'|([^\t\n\f\r ><]*)))?)?"
)


def parse_tag(s: str, i: int, end: int) -> Tag | None:
    """Parse the tag starting at ``s[i] == "<"`` following the HTML tokenizer's
    states (quoted/unquoted values, ``/`` between attributes, a leading ``=``
    in a name). None when the tag does not end before ``end``."""
    closing = s.startswith("</", i)
    m = _TAG_NAME.match(s, i + 1 + closing, end)
    assert m is not None  # the pattern matches the empty string
    name, pos = m.group(0).lower(), m.end()
    attrs: list[tuple[str, str | None]] = []
    while True:
        a = _ATTR.match(s, pos, end)
        assert a is not None
        if a.group(1):
            return Tag(i, a.end(), name, closing, attrs)
        if a.group(2) is None:
            return None  # ran into the end
        unquoted = a.group(5)
        if unquoted is not None and unquoted[:1] in ('"', "'"):
            return None  # an opening quote that is never closed
        value = next((g for g in a.group(3, 4, 5) if g is not None), None)
        attrs.append((a.group(2).lower(), None if value is None else html.unescape(value)))
        pos = a.end()


class _Finder:
    """Forward searches in one string that stay linear when repeated: a search
    from ``i`` reuses the previous answer for the same pattern while that
    answer is still at or after ``i`` (or there was none)."""

    def __init__(self, s: str) -> None:
        self.s = s
        self.memo: dict[tuple[str, int, int], tuple[int, re.Match[str] | None]] = {}

    def search(self, pattern: re.Pattern[str], i: int, end: int) -> re.Match[str] | None:
        key = (pattern.pattern, pattern.flags, end)
        hit = self.memo.get(key)
        if hit is not None and hit[0] <= i and (hit[1] is None or hit[1].start() >= i):
            return hit[1]
        m = pattern.search(self.s, i, end)
        self.memo[key] = (i, m)
        return m


_GT = re.compile(">")
_COMMENT_ENDS = (re.compile("-->"), re.compile("--!>"))


def _comment_end(find: _Finder, i: int, end: int) -> int | None:
    """End of the comment at ``s[i:].startswith("<!--")`` where a browser ends it."""
    s = find.s
    if s.startswith("<!-->", i):
        return i + 5
    if s.startswith("<!--->", i):
        return i + 6
    ends = [m.end() for m in (find.search(p, i + 4, end) for p in _COMMENT_ENDS) if m is not None]
    return min(ends) if ends else None


_CLOSERS: dict[str, re.Pattern[str]] = {}


def _closing_end(find: _Finder, name: str, i: int, end: int) -> tuple[int, int] | None:
    """(start, end) of the first ``</name`` closing tag after ``i``."""
    closer = _CLOSERS.get(name)
    if closer is None:
        closer = _CLOSERS[name] = re.compile(rf"</{re.escape(name)}(?=[\t\n\f\r />])", re.I)
    m = find.search(closer, i, end)
    if m is None:
        return None
    tag = parse_tag(find.s, m.start(), end)
    return None if tag is None else (m.start(), tag.end)


def _attr_value(value: str) -> str:
    """Escape an attribute value so the tag stays on one line with nothing a
    markdown renderer splits on (blank lines end HTML blocks, ``|`` table
    cells, backticks code spans): a split tag could let a value become markup."""
    return html.escape(value, quote=True).translate(_ATTR_EXTRA)


_ATTR_EXTRA = str.maketrans({"\n": "&#10;", "\r": "&#13;", "\t": "&#9;", "\f": "&#12;", "|": "&#124;", "`": "&#96;"})


class _Cleaner:
    def __init__(self, *, private: bool, notes: Notes) -> None:
        self.private = private
        self.notes = notes
        self.filter = make_attribute_filter(private=private, notes=notes, where=WHERE)
        self.find: _Finder = _Finder("")
        #: a style sheet was kept: the output is wrapped in its scope (_scoped_css)
        self.styled = False
        #: the class suffix of this output's element and its sheets' scope
        self.token = new_token()

    def closing_end(self, s: str, name: str, i: int, end: int) -> tuple[int, int] | None:
        return _closing_end(self.find, name, i, end)

    def canonical(self, tag: Tag) -> str:
        """The tag rebuilt from its parsed parts, with only allowed, cleaned attributes."""
        if tag.closing:
            return f"</{tag.name}>"
        allowed = HTML_ATTRIBUTES["*"] | HTML_ATTRIBUTES.get(tag.name, set())
        parts, seen = [tag.name], set()
        for attr, value in tag.attrs:
            if attr in seen:  # browsers keep the first of duplicate attributes
                continue
            seen.add(attr)
            if attr not in allowed:
                if attr.startswith("on"):
                    self.notes.add(f"event handler attributes (on...=) removed from {WHERE}")
                continue
            kept = self.filter(tag.name, attr, value or "")
            if kept is not None:
                parts.append(f'{attr}="{_attr_value(kept)}"')
        if tag.name == "a":
            parts.append(f'rel="{LINK_REL}"')
        return "<" + " ".join(parts) + ">"

    def style_block(self, s: str, tag: Tag, end: int) -> tuple[str, int] | None:
        """A whole ``<style>...</style>``, cleaned; None when it is not closed."""
        close = self.closing_end(s, "style", tag.end, end)
        if close is None:
            return None
        where = f"{WHERE} <style>"
        if not _starts_a_block(s, tag.start):
            # Inside a line it is inline HTML: the renderer treats its text as
            # markdown (entities for quotes, escapes resolved, emphasis...),
            # together, and a "}" the cleaner read inside a name or a string
            # became a real one that ended the scope (reviews of the scoping).
            # At a line's start it begins an HTML block, passed on as it is.
            self.notes.add(f"CSS removed from {where} (a <style> inside a line: a markdown renderer rewrites its text)")
            return self.canonical(tag) + "</style>", close[1]
        css = clean_css(s[tag.end : close[0]], private=self.private, notes=self.notes, where=where) or ""
        if css:  # its rules style this output only
            css = scope_style_sheet(css, notes=self.notes, where=where, token=self.token)
        # Inline, a markdown renderer may still resolve backslash escapes in it
        # (url\( -> url() or escape quotes (url(=" -> url(=&quot;): the CSS
        # must stay clean either way.
        for variant in (_MD_ESCAPE.sub(r"\1", css), html.escape(css, quote=True)):
            if len(variant) > MAX_CSS_CHARS:  # (escaping can make it six times as long)
                mb = MAX_CSS_CHARS // (1024 * 1024)
                self.notes.add(f"CSS removed from {where} (over {mb} MB once escaped, too large to clean)")
                css = ""
                break
            if clean_css(variant, private=self.private, notes=Notes(), where=where) != variant.replace("<", "\\3c "):
                self.notes.add(f"CSS removed from {where} (a markdown renderer could turn it into something unsafe)")
                css = ""
                break
            if css and variant != css and not structure_holds(variant, self.token):
                # a "}" in a string, or escaped, became a real one: the
                # rules after it would apply to the whole page (a review)
                self.notes.add(f"CSS removed from {where} (a markdown renderer could move its rules out of the output)")
                css = ""
                break
        self.styled = self.styled or bool(css)
        return self.canonical(tag) + css + "</style>", close[1]

    def clean(self, s: str, start: int, end: int, *, code: bool) -> str:
        """Clean ``s[start:end]``; ``code`` when it is (probably) a code span/block."""
        if self.find.s is not s:
            self.find = _Finder(s)
        out: list[str] = []
        i = start
        while True:
            j = s.find("<", i, end)
            if j < 0:
                out.append(s[i:end])
                return "".join(out)
            out.append(s[i:j])
            nxt = s[j + 1] if j + 1 < end else ""
            nxt2 = s[j + 2] if j + 2 < end else ""
            if s.startswith("<!--", j) and not code:
                stop = _comment_end(self.find, j, end)
                out.append("&lt;" if stop is None else "")
                i = j + 1 if stop is None else stop
                continue
            if nxt in ("!", "?") or (nxt == "/" and not _is_alpha(nxt2)):
                out.append("&lt;")
                i = j + 1
                continue
            if not _is_alpha(nxt) and nxt != "/":
                # "a < b", "<1": text to a browser too. Before another "<" that
                # may be removed ("<<script>img ..."), escape it so the removal
                # cannot glue it to what follows.
                out.append("&lt;" if nxt == "<" and not code else "<")
                i = j + 1
                continue
            tag = None if self.find.search(_GT, j, end) is None else parse_tag(s, j, end)
            if tag is None:
                out.append("&lt;")
                i = j + 1
                continue
            text, i = self.handle(s, tag, end, code=code)
            out.append(text)

    def handle(self, s: str, tag: Tag, end: int, *, code: bool) -> tuple[str, int]:
        name, original = tag.name, s[tag.start : tag.end]
        plain = bool(_PLAIN_NAME.match(name))
        as_text = original.replace("<", "&lt;")
        if name.startswith(("http", "mailto")) or (code and plain and name not in KNOWN_ELEMENTS):
            # Harmless even if a renderer reads it as HTML: an unknown element
            # with no handler, style, line break or nested "<" to split on.
            risky = (
                "<" in original[1:]
                or _LINE_BREAK.search(original) is not None
                or any(a.startswith("on") or a in {"style", "is"} for a, _ in tag.attrs)
            )
            if not risky and not tag.closing and _AUTOLINK.match(original):
                return original, tag.end
            if code and plain and name not in KNOWN_ELEMENTS:
                # Kept as written only bare: our guess of what is code may be
                # wrong (a span across a heading, a quote or a list item's
                # line; an indented line in a list item; a fence in an HTML
                # block), and the page acts on what a tag carries. JupyterLab
                # defines custom elements (<jp-avatar src> loads its image,
                # <jp-anchor href> links from its shadow root) and runs the
                # command a click's element names (data-commandlinker-command,
                # without asking in a trusted output: a host terminal opened;
                # attack reviews). An unknown name without "-" and without
                # attributes is an element without behaviour.
                bare = not tag.attrs and "-" not in name
                return (original if bare and not risky else as_text), tag.end
        if name in HTML_TAGS:
            if code and not tag.attrs and name != "style" and not _LINE_BREAK.search(original):
                return original, tag.end
            if name == "style" and not tag.closing:
                block = self.style_block(s, tag, end)
                if block is not None:
                    return block
                self.notes.add(f"unclosed <style> removed from {WHERE}")
                return "", tag.end
            if name == "style":  # a stray </style>
                return as_text if code else "", tag.end
            return self.canonical(tag), tag.end
        if code or not plain or name not in KNOWN_ELEMENTS:
            return as_text, tag.end  # shown as text
        self.notes.add(f"<{name}> removed from {WHERE}")
        if name in DROP_WITH_CONTENT and not tag.closing:
            close = self.closing_end(s, name, tag.end, end)
            if close is not None:
                return "", close[1]
        return "", tag.end


# ----------------------------------------------------------------------------- segments

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)
_INDENTED = re.compile(r"(?:(?<=\n\n)|\A)(?:(?: {4}|\t)[^\n]*\S[^\n]*(?:\n|\Z))+")
_INLINE = re.compile(r"`+|\$\$|\$|\\begin\{([A-Za-z*]+)\}")


def _blocks(s: str) -> list[tuple[int, int]]:
    """Fenced and indented code blocks as (start, end) spans."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        m = _FENCE.search(s, pos)
        if m is None:
            break
        fence = m.group(1)
        line_end = s.find("\n", m.end())
        if fence[0] == "`" and "`" in s[m.end() : line_end if line_end >= 0 else len(s)]:
            pos = m.end()
            continue
        if line_end < 0:
            spans.append((m.start(), len(s)))
            break
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M).search(s, line_end + 1)
        stop = len(s) if close is None else close.end()
        spans.append((m.start(), stop))
        pos = stop
    free = _complement(spans, len(s))
    for a, b in free:
        for m in _INDENTED.finditer(s, a, b):
            spans.append((m.start(), m.end()))
    return sorted(spans)


def _complement(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out, pos = [], 0
    for a, b in sorted(spans):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < n:
        out.append((pos, n))
    return out


def _escaped(s: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and s[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


_BACKTICKS = re.compile(r"`+")
_BLANK_LINE = re.compile(r"\n[ \t]*(?:\r?\n|\r)|\r[ \t]*\r")


def _between(starts: list[int], low: int, high: int) -> bool:
    """Whether one of the sorted ``starts`` lies in ``[low, high)``."""
    k = bisect.bisect_left(starts, low)
    return k < len(starts) and starts[k] < high


def _starts_a_block(s: str, i: int) -> bool:
    """Whether the tag at ``s[i]`` begins a line (up to three spaces before
    it): ``<style`` there begins an HTML block (CommonMark's first kind,
    which even ends a paragraph), whose text the renderer leaves alone."""
    line = s.rfind("\n", 0, i) + 1
    return len(s[line:i]) <= 3 and not s[line:i].strip(" ")


def segments(s: str) -> list[tuple[str, int, int]]:
    """Split markdown into ("code"|"math"|"text", start, end) pieces."""
    out: list[tuple[str, int, int]] = []
    blocks = _blocks(s)
    pieces = [("code", a, b) for a, b in blocks] + [("free", a, b) for a, b in _complement(blocks, len(s))]
    find = _Finder(s)
    for kind, a, b in sorted(pieces, key=lambda p: p[1]):
        if kind == "code":
            out.append((kind, a, b))
            continue
        runs: dict[int, list[int]] = {}  # backtick run length -> starts, for closers
        for r in _BACKTICKS.finditer(s, a, b):
            runs.setdefault(r.end() - r.start(), []).append(r.start())
        blanks = [blank.start() for blank in _BLANK_LINE.finditer(s, a, b)]
        pos = text_start = a
        while pos < b:
            m = _INLINE.search(s, pos, b)
            if m is None:
                break
            tok = m.group(0)
            if _escaped(s, m.start()):
                pos = m.end()
                continue
            close_end: int | None = None
            if tok.startswith("`"):
                starts = runs.get(len(tok), [])
                k = bisect.bisect_right(starts, m.start())
                # a blank line ends the paragraph, and a code span with it
                if k < len(starts) and not _between(blanks, m.end(), starts[k]):
                    close_end = starts[k] + len(tok)
            elif tok.startswith("\\begin"):
                c = find.search(re.compile(rf"\\end\{{{re.escape(m.group(1))}\}}"), m.end(), b)
                close_end = None if c is None else c.end()
            else:
                c = find.search(re.compile(rf"(?<!\\){re.escape(tok)}"), m.end(), b)
                if c is not None and (c.start() == m.end() or "\n\n" in s[m.end() : c.start()]):
                    pos = m.end()
                    continue
                close_end = None if c is None else c.end()
            if close_end is None:
                pos = m.end()
                continue
            if m.start() > text_start:
                out.append(("text", text_start, m.start()))
            out.append(("code" if tok.startswith("`") else "math", m.start(), close_end))
            pos = text_start = close_end
        if text_start < b:
            out.append(("text", text_start, b))
    return out


_MATH_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


# ----------------------------------------------------------------------------- links and images


_DEST = re.compile(r"[\t\n\f\r ]*(<[^<>\n]{0,256}>|(?:[^\t\n\f\r ()\\]|\\.|\([^\t\n\f\r ()]{0,256}\)){0,256})")
_SCHEME_CHARS = re.compile(r"[A-Za-z0-9+.\-]*\Z")


_PLAIN_DEST = re.compile(r"(?:https?://|mailto:|#|/(?![/\\]))[^\\&\x00-\x20]*\Z|[^:\\&\x00-\x20<]*\Z", re.I)


def _dest_ok(raw: str, cut: bool, private: bool = False) -> bool:
    """Whether a markdown link destination is harmless. Only its first 256
    characters are read (a scheme must come first); when those do not settle
    it, say no."""
    if not cut and not private and _PLAIN_DEST.match(raw):
        return True  # no escapes or references to decode: what you see is the URL
    url = html.unescape(_MD_ESCAPE.sub(r"\1", raw)).strip()
    url = url[1:-1] if url.startswith("<") and url.endswith(">") else url.lstrip("<")
    norm = normalise_url(url)
    if cut and _SCHEME_CHARS.match(norm):
        return False
    return link_ok(url, private=private) or bool(re.match(r"data:image/(?:png|jpe?g|gif|webp)[;,]", norm, re.I))


def _fix_links(s: str, notes: Notes, private: bool = False) -> str:
    """Point markdown links/definitions whose target could run code at ``#``.

    Every ``](`` and ``]:`` is checked, in code too: a wrong guess about what
    is code must not let a link through."""
    out: list[str] = []
    pos = 0
    for m in re.finditer(r"\](?:\(|:)", s):
        if m.start() < pos:
            continue
        d = _DEST.match(s, m.end())
        assert d is not None
        raw = d.group(1)
        if not raw or _dest_ok(raw, cut=len(raw) >= 256, private=private):
            continue
        url = html.unescape(_MD_ESCAPE.sub(r"\1", raw)).strip("<> ")
        notes.add(f"link with {describe_url_removal(url, private=private)} removed from {WHERE}")
        out.append(s[pos : d.start(1)])
        out.append("#")
        pos = d.end(1)
    out.append(s[pos:])
    return "".join(out)


_SAFE_IMAGE = re.compile(r"!\[([^\[\]\\`<>]*)\]\(\s*data:image/(?:png|jpe?g|gif|webp)[;,][A-Za-z0-9+/=;,%._\-]*\s*\)")
_SIMPLE_IMAGE = re.compile(r"!\[([^\[\]\\`<>]*)\]\(([^()\s]*)(?:\s+\"[^\"]*\")?\s*\)")


def _private_images(s: str, notes: Notes) -> str:
    """In private sessions only inline ``data:`` images stay; every other ``![``
    (external, reference-style, or anything we cannot parse for sure) stops
    being an image."""
    out: list[str] = []
    pos = 0
    while True:
        i = s.find("![", pos)
        if i < 0:
            out.append(s[pos:])
            return "".join(out)
        out.append(s[pos:i])
        safe = _SAFE_IMAGE.match(s, i)
        if safe:
            out.append(safe.group(0))
            pos = safe.end()
            continue
        notes.add(f"markdown image removed from {WHERE} ({PRIVATE_REASON})")
        simple = _SIMPLE_IMAGE.match(s, i)
        if simple:
            alt = simple.group(1).strip()
            out.append(f"\\[image removed: {alt}\\]" if alt else "\\[image removed\\]")
            pos = simple.end()
        else:
            out.append("!\\[")
            pos = i + 2


#: A fence opener after any blockquote or list markers, and its info string.
#: Matched on every line, not only where :func:`segments` sees a block: a fence
#: inside a quote or a list item is drawn too.
_FENCE_INFO = re.compile(r"(?m)^([ \t>*+\-.)0-9]*(?:`{3,}|~{3,}))([^\n]*)$")
_ESCAPED_PUNCTUATION = re.compile(r"\\([!-/:-@\[-`{-~])")


def _fence_info(m: re.Match[str]) -> str:
    """A ``_FENCE_INFO`` match's info string as a markdown parser may read it:
    backslash escapes and character references decoded."""
    return html.unescape(_ESCAPED_PUNCTUATION.sub(r"\1", m.group(2)))


def _private_diagrams(s: str, notes: Notes) -> str:
    """In private sessions a mermaid diagram is shown as its source.

    Mermaid draws a diagram inside the page before JupyterLab turns it into an
    image, and its configuration, styles and shapes can name addresses the
    browser then loads (``%%{init: {"fontFamily": "x;background:url(//host/?d=...)"}}%%``,
    an image shape, an icon): in a Lab without sandbox_kernel's page policy each
    of those reached a server of the cell's choosing. Its language keeps
    growing, so no list of the constructs that fetch would stay complete: the
    fence keeps its text under another info string (any that reads as
    ``mermaid…``), so nothing is drawn."""

    def neutral(m: re.Match[str]) -> str:
        info = _fence_info(m).strip().lower()
        if not info.startswith("mermaid"):
            return m.group(0)
        notes.add(f"mermaid diagram shown as its source in {WHERE} ({PRIVATE_REASON})")
        return m.group(1) + "mermaid-source"

    return _FENCE_INFO.sub(neutral, s) if "mermaid" in s.lower() or "&" in s else s


#: what a code fence's language may be: JupyterLab writes it unescaped into
#: ``<pre><code class="language-…">``
_LANGUAGE = re.compile(r"[A-Za-z0-9_+.#-]*")
#: the language as marked takes it: up to JavaScript's whitespace (``\s``), not
#: Python's (which also splits at \x1c-\x1f, where JavaScript reads on)
_JS_SPACE = "\t\n\x0b\x0c\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_WORD = re.compile(f"[{_JS_SPACE}]*([^{_JS_SPACE}]*)")


def _safe_fence_info(s: str) -> str:
    """Each fence's info string cut to a plain language name.

    JupyterLab's markdown renderer builds ``<code class="language-{info}">``
    from the fence's first word without escaping it, and shows a live output
    as trusted: a tilde fence's ``x" style="animation:a 1s" onanimationstart="…``
    became an event handler that ran with no click in a Lab without our page
    policy (an attack review). The word is read as the parser reads it
    (escapes and character references decoded); one that is not a plain name
    is cut at its first character that is not a name's (the rest of the
    info string, which the renderer ignores, goes with it)."""

    def safe(m: re.Match[str]) -> str:
        first = _JS_WORD.match(_fence_info(m))
        word = first.group(1) if first else ""
        if not word:
            return m.group(0)
        name = _LANGUAGE.match(word)
        plain = name.group(0) if name else ""
        return m.group(0) if plain == word else m.group(1) + plain  # a plain name is left as written

    return _FENCE_INFO.sub(safe, s) if "```" in s or "~~~" in s else s


# ----------------------------------------------------------------------------- entry point

_ASCII_REF = re.compile(r"&(?:#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")


def _decode_ascii_refs(s: str) -> str:
    """Replace character references that merely spell ASCII (``&#92;``) with the
    character, so MathJax commands cannot hide from ``clean_tex`` behind them."""

    def repl(m: re.Match[str]) -> str:
        ch = html.unescape(m.group(0))
        return ch if len(ch) == 1 and "!" <= ch <= "~" and ch not in "<>&\"'" else m.group(0)

    return _ASCII_REF.sub(repl, s)


def clean_markdown(text: str, *, private: bool, notes: Notes) -> str:
    """Return ``text`` with its HTML, link targets and math commands made safe."""
    if "&" in text and clean_tex(html.unescape(text), private=private, notes=Notes(), where=WHERE) != html.unescape(
        text
    ):
        text = _decode_ascii_refs(text)
    cleaner = _Cleaner(private=private, notes=notes)
    parts: list[str] = []
    for kind, a, b in segments(text):
        if kind == "math":
            parts.append(_MATH_TAG_OPEN.sub(r"\\lt ", text[a:b]))
        else:
            parts.append(cleaner.clean(text, a, b, code=kind == "code"))
    out = _safe_fence_info(_fix_links("".join(parts), notes, private=private))
    if private:
        out = _private_images(out, notes)
        out = _private_diagrams(out, notes)
        out = defang_markdown(out)  # bare URLs and autolinks GFM would link
    out = clean_tex(out, private=private, notes=notes, where=WHERE)
    # the element its style sheets are limited to (_scoped_css), each line an
    # HTML block of its own: the markdown between stays markdown
    return contained(out, markdown=True, token=cleaner.token) if cleaner.styled else out
