"""The pixel size an image declares in its header, read with the standard library.

Why: the output sanitizer checks an image's first bytes only (its magic), so a
1 MB PNG declaring 30000x30000 px (900 Mpx, a decompression bomb: PIL refuses
it) or a PNG signature followed by junk reached the agent as an image, and the
agent's client (or the model provider) decodes it. Before an image goes into
a tool result its header is parsed here (PNG IHDR, JPEG SOFn, GIF logical
screen, WebP VP8/VP8L/VP8X) and :func:`image_problem` refuses images whose
header does not parse or that are larger than :data:`MAX_SIDE` px a side or
:data:`MAX_PIXELS` in all. No image library is needed: only the header is read.
"""

from __future__ import annotations

import base64
import binascii
import struct

#: pixels a side, and in all, of an image an agent is given
MAX_SIDE = 8000
MAX_PIXELS = 40_000_000

# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic), not DHT/JPG/DAC
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _png(raw: bytes) -> tuple[int, int] | None:
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR" or len(raw) < 24:
        return None
    return struct.unpack(">II", raw[16:24])


def _gif(raw: bytes) -> tuple[int, int] | None:
    if raw[:6] not in (b"GIF87a", b"GIF89a") or len(raw) < 10:
        return None
    return struct.unpack("<HH", raw[6:10])


def _jpeg(raw: bytes) -> tuple[int, int] | None:
    if raw[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(raw):
        if raw[i] != 0xFF:
            return None
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan before any frame
            return None
        (length,) = struct.unpack(">H", raw[i + 2 : i + 4])
        if length < 2:
            return None
        if marker in _SOF:
            if i + 9 > len(raw):
                return None
            height, width = struct.unpack(">HH", raw[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def _webp(raw: bytes) -> tuple[int, int] | None:
    if raw[:4] != b"RIFF" or raw[8:12] != b"WEBP" or len(raw) < 30:
        return None
    kind = raw[12:16]
    if kind == b"VP8X":
        return 1 + int.from_bytes(raw[24:27], "little"), 1 + int.from_bytes(raw[27:30], "little")
    if kind == b"VP8L" and raw[20] == 0x2F:
        bits = int.from_bytes(raw[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8 " and raw[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


_PARSERS = {"image/png": _png, "image/gif": _gif, "image/jpeg": _jpeg, "image/webp": _webp}


def image_size(mime: str, raw: bytes) -> tuple[int, int] | None:
    """(width, height) declared by the header of an image of type ``mime``,
    or None when the header does not parse (or the type is not known here)."""
    parser = _PARSERS.get(mime)
    return parser(raw) if parser else None


def image_problem(mime: str, data: str) -> str | None:
    """Why the base64 image ``data`` must not be given to an agent, or None."""
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return "not valid base64"
    size = image_size(mime, raw)
    if size is None:
        return f"its header does not parse as {mime}"
    width, height = size
    if width <= 0 or height <= 0:
        return f"it declares {width}x{height} px"
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        return f"it declares {width}x{height} px, over {MAX_SIDE} px a side or {MAX_PIXELS // 10**6} Mpx"
    return None


__all__ = ["MAX_PIXELS", "MAX_SIDE", "image_problem", "image_size"]
