"""image/svg+xml cleaning: parse as XML, keep allow-listed SVG, write it back.

SVG is XML (JupyterLab shows it through ``<img src="data:image/svg+xml,...">``,
which needs well-formed XML; nbconvert and other frontends inline it, where
``<script>``, ``on*`` handlers, ``<foreignObject>`` and external ``href`` would
run or fetch). Re-serialising our own parse means what the browser reads is
exactly what was checked. The rules do not depend on the session: an SVG may
only reference itself (``#id``) or embed ``data:`` raster images, and its CSS
may not fetch, private or not.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html import escape

from ._policy import Notes, clean_css, normalise_url

WHERE = "image/svg+xml"
WHY = "an SVG may only reference itself"
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
XML_NS = "http://www.w3.org/XML/1998/namespace"

SVG_TAGS: frozenset[str] = frozenset(
    [
        "svg",
        "g",
        "path",
        "rect",
        "circle",
        "ellipse",
        "line",
        "polyline",
        "polygon",
        "text",
        "tspan",
        "defs",
        "clipPath",
        "use",
        "linearGradient",
        "radialGradient",
        "stop",
        "title",
        "desc",
        "style",
        "mask",
        "pattern",
        "marker",
        "symbol",
        "image",
    ]
)
#: Dropped with their content and without a note: harmless, just not shown.
SILENT_DROP: frozenset[str] = frozenset({"metadata"})

SVG_ATTRIBUTES: frozenset[str] = frozenset(
    [
        "id",
        "class",
        "style",
        "transform",
        "viewBox",
        "preserveAspectRatio",
        "width",
        "height",
        "x",
        "y",
        "x1",
        "y1",
        "x2",
        "y2",
        "cx",
        "cy",
        "r",
        "rx",
        "ry",
        "fx",
        "fy",
        "fr",
        "d",
        "points",
        "pathLength",
        "fill",
        "fill-opacity",
        "fill-rule",
        "stroke",
        "stroke-width",
        "stroke-linecap",
        "stroke-linejoin",
        "stroke-miterlimit",
        "stroke-dasharray",
        "stroke-dashoffset",
        "stroke-opacity",
        "opacity",
        "clip-path",
        "clip-rule",
        "clipPathUnits",
        "mask",
        "maskUnits",
        "maskContentUnits",
        "font-family",
        "font-size",
        "font-style",
        "font-weight",
        "font-variant",
        "font-stretch",
        "text-anchor",
        "dominant-baseline",
        "alignment-baseline",
        "baseline-shift",
        "letter-spacing",
        "word-spacing",
        "text-decoration",
        "writing-mode",
        "direction",
        "unicode-bidi",
        "dx",
        "dy",
        "rotate",
        "textLength",
        "lengthAdjust",
        "offset",
        "stop-color",
        "stop-opacity",
        "gradientUnits",
        "gradientTransform",
        "spreadMethod",
        "patternUnits",
        "patternContentUnits",
        "patternTransform",
        "markerWidth",
        "markerHeight",
        "markerUnits",
        "refX",
        "refY",
        "orient",
        "marker-start",
        "marker-mid",
        "marker-end",
        "visibility",
        "display",
        "color",
        "overflow",
        "version",
        "shape-rendering",
        "image-rendering",
        "text-rendering",
        "color-interpolation",
        "vector-effect",
        "paint-order",
        "href",
        "type",
        "media",
    ]
)
_LOCAL_REF = re.compile(r"#[A-Za-z_][\w.\-:]*\Z")
_DATA_RASTER = re.compile(r"data:image/(?:png|jpe?g|gif|webp)[;,]", re.I)
#: ``url(#id)``, the id quoted or not: the only url() an SVG attribute keeps.
#: Spelled out rather than ``url\((.*?)\)`` then checked: that lazy match
#: scanned to the end of the value from every unclosed ``url(``, and 128 KB of
#: them held the GIL 21.7 s (an attack review; the cut watchdog needs it)
_URL_LOCAL = re.compile(
    r"""url\s*\(\s*(?:"\s*#[A-Za-z_][\w.\-:]*\s*"|'\s*#[A-Za-z_][\w.\-:]*\s*'|#[A-Za-z_][\w.\-:]*)\s*\)""", re.I
)
_URL_OPEN = re.compile(r"url\s*\(", re.I)
_ENTITY_DECL = re.compile(r"<!ENTITY", re.I)


class SvgRejected(ValueError):
    """The SVG cannot be cleaned; the message says why."""


def _local(name: str) -> tuple[str | None, str]:
    if name.startswith("{"):
        ns, _, local = name[1:].partition("}")
        return ns, local
    return None, name


def _attr_ok(tag: str, name: str, value: str) -> bool:
    if name == "href":
        url = normalise_url(value)
        if tag == "image":
            return bool(_DATA_RASTER.match(url))
        return bool(_LOCAL_REF.match(url))
    if name in {"type", "media"} and tag != "style":
        return False
    if "\\" in value:  # CSS escapes could hide a url()
        return False
    low = value.lower()
    if "script" in low and ":" in low:
        return False
    if not _URL_OPEN.search(value):
        return True
    # every url( must be a complete url(#id)
    return len(_URL_OPEN.findall(value)) == len(_URL_LOCAL.findall(value))


class _Writer:
    def __init__(self, notes: Notes) -> None:
        self.notes = notes
        self.out: list[str] = []
        self.uses_xlink = False

    def element(self, el: ET.Element) -> None:
        ns, tag = _local(el.tag)
        if ns not in (None, SVG_NS) or tag not in SVG_TAGS:
            if ns in (None, SVG_NS) and tag in SILENT_DROP:
                return
            self.notes.add(f"<{tag}> removed from {WHERE}")
            return
        attrs: list[str] = []
        for key, value in el.attrib.items():
            ans, name = _local(key)
            if ans == XML_NS and name == "space" and value in {"default", "preserve"}:
                attrs.append(f'xml:space="{value}"')
                continue
            if ans == XLINK_NS and name == "href":
                qname = "xlink:href"
            elif ans is None and name in SVG_ATTRIBUTES:
                qname = name
            else:
                if name.lower().startswith("on"):
                    self.notes.add(f"event handler attributes (on...=) removed from {WHERE}")
                else:
                    self.notes.add(f"attribute {name!r} removed from {WHERE}")
                continue
            if name == "style":
                cleaned = clean_css(value, private=True, notes=self.notes, where=f"{WHERE} style attribute", why=WHY)
                if cleaned is None:
                    continue
                value = cleaned
            elif not _attr_ok(tag, name if qname != "xlink:href" else "href", value):
                self.notes.add(f"unsafe {qname} removed from {WHERE} <{tag}>")
                continue
            self.uses_xlink |= qname == "xlink:href"
            attrs.append(f'{qname}="{_attr(value)}"')
        self.out.append("<" + " ".join([tag, *attrs]) + ">")
        if tag == "style":
            css = clean_css(el.text or "", private=True, notes=self.notes, where=f"{WHERE} <style>", why=WHY)
            self.out.append(escape(css or "", quote=False))
        else:
            self.out.append(escape(el.text or "", quote=False))
            for child in el:
                self.element(child)
                self.out.append(escape(child.tail or "", quote=False))
        self.out.append(f"</{tag}>")


def _attr(value: str) -> str:
    return escape(value, quote=True).replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")


def clean_svg(text: str, *, notes: Notes) -> str:
    """Return a cleaned, self-contained SVG document or raise SvgRejected."""
    if _ENTITY_DECL.search(text):
        raise SvgRejected("it declares XML entities")
    try:
        root = ET.fromstring(text.strip().encode("utf-8"))
    except ET.ParseError as exc:
        raise SvgRejected(f"it is not well-formed XML ({exc})") from None
    ns, tag = _local(root.tag)
    if tag != "svg" or ns not in (None, SVG_NS):
        raise SvgRejected(f"its root element is <{tag}>, not <svg>")
    writer = _Writer(notes)
    writer.element(root)
    head = writer.out[0]
    decl = f' xmlns="{SVG_NS}"' + (f' xmlns:xlink="{XLINK_NS}"' if writer.uses_xlink else "")
    writer.out[0] = head[:4] + decl + head[4:]
    return "".join(writer.out)
