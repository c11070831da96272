"""Host side of the worker channel: framed JSON over the sandbox's stdin/stdout.

Everything read here comes from untrusted code: frames are size-capped,
must be JSON objects with a known ``type``, and the host never unpickles.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from ..worker.protocol import HEADER, MAX_FRAME, WORKER_TYPES


class ProtocolError(Exception):
    """The worker sent something that is not a valid message; the sandbox is dropped."""


async def read_message(reader: asyncio.StreamReader) -> tuple[dict[str, Any], int] | None:
    """Next message and the size of its frame, or None at end of stream."""
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
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if _SURROGATE.search(body):
        try:
            msg = _without_lone_surrogates(msg)
        except RecursionError as exc:
            raise ProtocolError("frame nested too deeply") from exc
    if not isinstance(msg, dict) or msg.get("type") not in WORKER_TYPES:
        raise ProtocolError(f"unexpected message: {str(msg)[:200]}")
    return msg, length


#: a surrogate in a frame, raw (the worker writes with ``surrogatepass``) or escaped
_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]|\\u[dD][89a-fA-F]")


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
