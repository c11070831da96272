"""Clean every MIME bundle from the sandbox before it reaches the frontend.

JupyterLab trusts the outputs of cells it executed and runs their scripts, so
HTML from a sandboxed cell could call the Jupyter server's REST API from the
user's browser (guarantee 8). The bundle arrives as JSON from an untrusted
process, so types are checked first (guarantee 7: bad input is named, never
raised on); then only allow-listed MIME types are kept and each is cleaned for
its kind. Once the session holds private data, rendered output must not fetch
anything either, so external URLs go too, even from trusted outputs. Nor may a
public output leave a fetch waiting for later content (CSS is global to the
page: a rule for a class a private output uses later, a hidden element a
private style shows): styles fetch in no session and images load at once.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._html import clean_html
from ._markdown import clean_markdown
from ._policy import Notes, clean_tex
from ._scoped_css import contained, unwrapped
from ._svg import SvgRejected, clean_svg
from .links import defang_json, defang_text

#: MIME types shown when outputs are not trusted. Everything else (JavaScript,
#: widgets, Plotly/Vega which need JavaScript, unknown types) is dropped.
ALLOWED_MIME_TYPES: frozenset[str] = frozenset(
    {
        "text/plain",
        "text/html",
        "text/markdown",
        "text/latex",
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/svg+xml",
        "application/json",
        "application/pdf",
        "application/vnd.dataresource+json",
        "application/vnd.jupyter.stderr",
    }
)
_JS_MIME_TYPES = frozenset(
    {
        "application/javascript",
        "text/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "text/ecmascript",
    }
)
_JSON_MIME = re.compile(r"application/(?:json|[^/\s]+\+json)\Z")
_MAGIC: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda b: b.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda b: b.startswith((b"GIF87a", b"GIF89a")),
    "image/webp": lambda b: b.startswith(b"RIFF") and b[8:12] == b"WEBP",
    "application/pdf": lambda b: b"%PDF-" in b[:1024],
}
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_WHITESPACE = re.compile(r"\s+")
MAX_JSON_DEPTH = 200
#: Markdown is cleaned in Python (about 1 s per MB in the worst case); larger
#: markdown is dropped so one output cannot stall the kernel for minutes.
MAX_MARKDOWN_CHARS = 4 * 1024 * 1024


@dataclass
class SanitizedBundle:
    """A bundle that is safe to hand to the frontend."""

    #: MIME type -> content, cleaned.
    data: dict[str, Any] = field(default_factory=dict)
    #: Metadata restricted to the MIME types kept (plus plain JSON keys).
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Human-readable notes of what was removed, without duplicates.
    removed: list[str] = field(default_factory=list)


def is_json_mime(mime: str) -> bool:
    """``application/json`` and ``application/*+json`` carry JSON values, not text."""
    return bool(_JSON_MIME.match(mime))


def json_problem(value: Any) -> str | None:
    """What makes ``value`` not plain JSON (None when it is). Iterative, so a
    deeply nested value cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels"
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, str):
            if not _encodable(item):
                return "contains invalid Unicode (lone surrogates)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "contains NaN or Infinity"
        elif isinstance(item, list):
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return f"has a {type(k).__name__} object key"
                stack.append((v, depth + 1))
        else:
            return f"contains a {type(item).__name__}"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _type_problem(mime: str, value: Any) -> str | None:
    if is_json_mime(mime):
        return json_problem(value)
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    return None


def _binary_problem(mime: str, value: str) -> str | None:
    compact = _WHITESPACE.sub("", value)
    if len(compact) % 4 or not _BASE64.fullmatch(compact):
        return "not valid base64"
    head = base64.b64decode(compact[:1368])
    check = _MAGIC.get(mime)
    if check is not None and not check(head):
        return f"the data is not {mime.split('/')[1].upper()}"
    return None


def _drop_reason(mime: str) -> str:
    if mime in _JS_MIME_TYPES:
        return "JavaScript from the sandbox is not run"
    if mime.startswith("application/vnd.jupyter.widget"):
        return "widgets need JavaScript, which is not run for sandbox outputs"
    return "MIME type not on the allow-list"


def _clean_one(mime: str, value: Any, *, private: bool, notes: Notes) -> Any | None:
    """Cleaned content for one allow-listed MIME type, or None to drop it."""
    if mime == "text/markdown" and len(value) > MAX_MARKDOWN_CHARS:
        notes.add(f"text/markdown output dropped (over {MAX_MARKDOWN_CHARS // (1024 * 1024)} MB, too large to clean)")
        return None
    if mime in {"text/html", "text/markdown"}:
        cleaner = clean_html if mime == "text/html" else clean_markdown
        value = unwrapped(value, markdown=mime == "text/markdown")  # (a saved output cleaned again)
        cleaned = cleaner(value, private=private, notes=notes)
        if value.strip() and not cleaned.strip():
            notes.add(f"{mime} output dropped (nothing safe was left)")
            return None
        return contained(cleaned, markdown=mime == "text/markdown")
    if mime == "text/latex":
        tex = clean_tex(value, private=private, notes=notes, where=mime)
        return defang_text(tex) if private else tex  # \url{...} and URLs in text
    if mime == "image/svg+xml":
        return clean_svg(value, notes=notes)
    if mime == "application/pdf" and private:
        # A PDF viewer may follow links or run script: nothing may load once private.
        notes.add("application/pdf output dropped (a PDF viewer could fetch from the network)")
        return None
    if mime in _MAGIC:
        problem = _binary_problem(mime, value)
        if problem:
            notes.add(f"{mime} output dropped ({problem})")
            return None
        return value
    if private and mime == "text/plain":
        return defang_text(value)  # JupyterLab links URLs in plain text
    if private and is_json_mime(mime):
        return defang_json(value)  # rendered as text (JSON tree, data tables): linkified too
    return value


def _fix_unicode(mime: str, value: str, notes: Notes) -> str:
    """Lone surrogates cannot be sent as UTF-8 JSON; replace them."""
    if _encodable(value):
        return value
    notes.add(f"invalid Unicode replaced in {mime}")
    return value.encode("utf-8", "replace").decode("utf-8")


def _is_size(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):  # (10**400 is an int JSON allows, and no float)
        return 0 <= value <= 2**53
    return isinstance(value, float) and math.isfinite(value) and value >= 0


#: metadata keys frontends and nbconvert read as one type, wherever they are
#: (top level or a MIME type's): nbconvert's templates write an image's
#: ``width`` into its tag unquoted, so ``'1 onerror=alert(1)'`` was a script
#: in every HTML export (an attack review)
_TYPED_METADATA: dict[str, Callable[[Any], bool]] = {
    "width": _is_size,
    "height": _is_size,
    "unconfined": lambda v: isinstance(v, bool),
    "isolated": lambda v: isinstance(v, bool),
    "expanded": lambda v: isinstance(v, bool),
    "needs_background": lambda v: v in ("light", "dark"),
}
#: top-level metadata never kept: nbconvert's extracted files, whose names
#: its templates use as an image's address
_DROPPED_METADATA = frozenset({"filenames"})


def _clean_metadata(
    metadata: Any, kept: Mapping[str, Any], notes: Notes, *, clean: bool = True, private: bool = False
) -> dict[str, Any]:
    """The metadata of the MIME types kept, as JSON. ``clean`` (not trusted):
    the keys frontends read as one type must be of it, an image's metadata
    holds only those, and nbconvert's ``filenames`` goes; ``private``: every
    string left is defanged, URLs included."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        notes.add(f"metadata dropped (a {type(metadata).__name__}, not a mapping)")
        return {}
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            notes.add("metadata entry with a non-string key dropped")
            continue
        if "/" in key:
            if key not in kept:
                continue  # belongs to a MIME type that was dropped
            if not isinstance(value, dict):
                notes.add(f"metadata for {key} dropped (not a mapping)")
                continue
        problem = json_problem(value)
        if problem:
            notes.add(f"metadata {key!r} dropped ({problem})")
            continue
        if clean:
            if key in _DROPPED_METADATA:
                notes.add(f"metadata {key!r} dropped (nbconvert takes it for the files of the outputs)")
                continue
            if not _typed(key, value, notes, key):
                continue
            if "/" in key:
                value = {k: v for k, v in value.items() if _typed(k, v, notes, f"{key} {k}", image=key)}
            if private:
                value = defang_json(value, urls=True)
        out[key] = value
    return out


def _typed(key: str, value: Any, notes: Notes, where: str, image: str = "") -> bool:
    """Whether ``key`` may keep ``value``: a typed key of its type, and only
    typed keys in an image's metadata."""
    check = _TYPED_METADATA.get(key)
    if check is None:
        if image.startswith("image/"):
            notes.add(f"metadata {where!r} dropped (an image's metadata holds only its size and background)")
            return False
        return True
    if not check(value):
        notes.add(f"metadata {where!r} dropped (not a {'size' if key in ('width', 'height') else 'known value'})")
        return False
    return True


def _is_panic(exc: BaseException) -> bool:
    # nh3 (Rust) reports internal failures as pyo3's PanicException, a BaseException.
    return type(exc).__name__ == "PanicException"


def sanitize_bundle(
    data: Mapping[str, Any],
    metadata: Mapping[str, Any] | None = None,
    *,
    trusted: bool = False,
    private: bool = False,
) -> SanitizedBundle:
    """Return a copy of the bundle that is safe to display.

    ``trusted`` (the user opted in) keeps everything that is well-typed; it
    has no effect once ``private`` is set, since any script could send the
    private data to the network. Never raises on bad input: what was wrong is
    named in ``removed``.
    """
    notes = Notes()
    if not isinstance(data, Mapping):
        notes.add(f"output dropped (the bundle was a {type(data).__name__}, not a mapping of MIME types)")
        return SanitizedBundle({}, {}, notes.items)
    clean = not trusted or private
    kept: dict[str, Any] = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            notes.add(f"output with a non-string MIME type ({type(mime).__name__}) dropped")
            continue
        problem = _type_problem(mime, value)
        if problem:
            notes.add(f"{mime} output dropped ({problem})")
            continue
        if isinstance(value, str):
            value = _fix_unicode(mime, value, notes)
        if not clean:
            kept[mime] = value
            continue
        if mime not in ALLOWED_MIME_TYPES:
            notes.add(f"{mime} output dropped ({_drop_reason(mime)})")
            continue
        try:
            cleaned = _clean_one(mime, value, private=private, notes=notes)
        except SvgRejected as exc:
            notes.add(f"{mime} output dropped ({exc})")
            continue
        except Exception as exc:  # a cleaner bug must not take the kernel down
            notes.add(f"{mime} output dropped (it could not be cleaned: {type(exc).__name__})")
            continue
        except BaseException as exc:
            if not _is_panic(exc):
                raise
            notes.add(f"{mime} output dropped (it could not be cleaned: nh3 failed)")
            continue
        if cleaned is not None:
            kept[mime] = cleaned
    if trusted and private and notes.items:
        notes.add("trusted outputs are still cleaned while the session holds private data")
    if not kept and notes.items:
        kept["text/plain"] = "[sandbox_kernel: output removed for safety: " + "; ".join(notes.items) + "]"
    try:
        cleaned_metadata = _clean_metadata(metadata, kept, notes, clean=clean, private=private)
    except Exception as exc:  # a cleaner bug must not drop the output (nor take the kernel down)
        notes.add(f"metadata dropped (it could not be cleaned: {type(exc).__name__})")
        cleaned_metadata = {}
    return SanitizedBundle(kept, cleaned_metadata, notes.items)
