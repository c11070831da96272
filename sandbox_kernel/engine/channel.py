"""Host side of the worker channel: framed JSON over the sandbox's stdin/stdout.

Everything read here comes from untrusted code: frames are size-capped,
must be JSON objects with a known ``type``, and the host never unpickles.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from ..outputs.sizing import text_of
from ..worker.protocol import HEADER, MAX_FRAME, WORKER_TYPES, Msg

#: the most JSON values (objects, arrays and the items between their commas)
#: the host parses in one frame. Parsed, a value costs it 30 to 70 bytes: a
#: 64 MiB frame of ``[{},{},...]`` took 1.6 GB, and one of 32 MB held 800 MB
#: while idle (an attack review). A display of a million numbers still opens.
MAX_FRAME_VALUES = 1_000_000
#: what a queued frame's values count against the queue (``engine/worker.py``)
VALUE_COST = 64
#: a JSON string, escapes included (unrolled: no backtracking, ~100 MB/s)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: the longest run of whole tokens (text outside strings, whole strings) from
#: a position: it stops before a string the window's end cuts (possessive:
#: nothing is tried twice)
_WHOLE = re.compile(rb'(?:[^"]++|"(?:[^"\\]++|\\.)*+")*+')
#: a string's content from inside it: up to its closing quote, a backslash
#: the window's end cuts from what it escapes, or the window's end
_INSIDE = re.compile(rb'(?:[^"\\]++|\\.)*+')
#: bytes looked at in one C call: the cut watchdog's thread needs the GIL, and
#: one ``sub`` over a 64 MB frame of short strings held it 5.4 s (an attack)
WINDOW = 256 * 1024


class ProtocolError(Exception):
    """The worker sent something that is not a valid message; the sandbox is dropped."""


def json_values(body: bytes, limit: int) -> int:
    """How many values ``body`` holds, at most: its objects, arrays and
    commas outside strings, counted without parsing it. The bytes are counted
    as they are (strings included, an upper bound) unless that is over
    ``limit``; only then are the strings cut out (a 20 MB output of CSV text
    costs 0.4 s then), ``WINDOW`` bytes at a time, stopping once over
    ``limit``; a string longer than a window is crossed window by window."""
    rough = body.count(b"{") + body.count(b"[") + body.count(b",")
    if rough <= limit:
        return rough
    count, pos, size = 0, 0, len(body)
    while pos < size:
        whole = _match_end(_WHOLE, body, pos, min(size, pos + WINDOW))
        if whole > pos:
            bare = _STRING.sub(b'""', body[pos:whole])
            count += bare.count(b"{") + bare.count(b"[") + bare.count(b",")
            if count > limit:
                return count
            pos = whole
            continue
        # at a string the window cuts: its content, window by window
        inside = pos + 1
        while True:
            end = min(size, inside + WINDOW)
            inside = _match_end(_INSIDE, body, inside, end)
            if inside >= size - 1 and (inside >= size or body[inside] != 0x22):
                return count  # never closed: not JSON (the parser says so)
            if body[inside] == 0x22:  # its closing quote
                pos = inside + 1
                break
            # a backslash at the window's end: the next window holds what it escapes
    return count


def _match_end(pattern: re.Pattern[bytes], body: bytes, pos: int, end: int) -> int:
    match = pattern.match(body, pos, end)
    return pos if match is None else match.end()


async def read_message(reader: asyncio.StreamReader) -> tuple[dict[str, Any], int] | None:
    """Next message and what holding it costs (its frame's size plus its
    values'), or None at end of stream. A frame of more than
    ``MAX_FRAME_VALUES`` values is not parsed: it becomes a notice to the user
    (the sandbox and its state stay)."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("truncated frame header") from exc
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("truncated frame") from exc
    values = json_values(body, MAX_FRAME_VALUES)
    if values > MAX_FRAME_VALUES:
        notice = (
            f"[sandbox_kernel] a message of {values:,} JSON values from the sandbox was dropped: the host "
            f"reads at most {MAX_FRAME_VALUES:,} in one (each costs it memory). Send large data as text, "
            "a file or binary buffers.\n"
        )
        return {"type": Msg.STREAM, "name": "stderr", "text": notice}, length
    surrogates = _surrogates(body, MAX_FRAME_SURROGATES)
    if surrogates > MAX_FRAME_SURROGATES:
        notice = (
            f"[sandbox_kernel] a message with more than {MAX_FRAME_SURROGATES:,} lone surrogates (characters "
            "that are not text) from the sandbox was dropped: each costs the host a slow decoding step.\n"
        )
        return {"type": Msg.STREAM, "name": "stderr", "text": notice}, length
    try:
        msg = json.loads(body, parse_int=_parse_int if length > LONG_FRAME else None)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if surrogates:
        try:
            msg = _without_lone_surrogates(msg)
        except RecursionError as exc:
            raise ProtocolError("frame nested too deeply") from exc
    if not isinstance(msg, dict) or msg.get("type") not in WORKER_TYPES:
        raise ProtocolError(f"unexpected message: {text_of(msg, 200)}")
    return msg, length + VALUE_COST * values


#: frames over this size parse their integers one Python call each: a long
#: integer costs quadratic time to read, and ``json.loads`` of a 64 MB frame of
#: 4,300-digit ones held the GIL 1.05 s in one call (the cut watchdog, a
#: thread, waits for it). A call lets other threads in. Smaller frames hold
#: it under 70 ms, and parse 2x faster without the calls.
LONG_FRAME = 4 * 1024 * 1024


def _parse_int(digits: str) -> int:
    return int(digits)


#: a surrogate in a frame, raw (the worker writes with ``surrogatepass``) or escaped
_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]|\\u[dD][89a-fA-F]")
#: the most a frame may hold. Each is decoded by an error handler, one at a
#: time, holding the GIL: 21 M of them in a 64 MB frame held it 2.9 s in
#: ``json.loads`` and 4.6 s more to replace them (an attack review; the cut
#: watchdog's thread needs the GIL). A file name with ``surrogateescape`` has a few.
MAX_FRAME_SURROGATES = 100_000


def _surrogates(body: bytes, limit: int) -> int:
    """How many surrogates ``body`` holds, counting stopped past ``limit``.
    A window at a time, so that no call holds the GIL long (one scan of a
    64 MB frame held it 0.2 s); a match at a window's end is read whole
    (no match can begin inside another, so none is counted twice)."""
    count = 0
    size = len(body)
    for start in range(0, size, WINDOW):
        end = min(size, start + WINDOW)
        for match in _SURROGATE.finditer(body, start, min(size, end + 3)):
            if match.start() >= end:
                break
            count += 1
            if count > limit:
                return count
    return count


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate made U+FFFD (a split pair joined).

    A str holding one is legal in Python (a file name decoded with
    ``surrogateescape``, a ``"\\ud800"`` in JSON) but not in UTF-8, so the
    host could not send it on: jupyter_client's packer raised as it
    published, the host stopped waiting for a cell still running, and the
    next cell was killed at the timeout with the session's variables."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


def encode(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg).encode("utf-8")
    return HEADER.pack(len(data)) + data
