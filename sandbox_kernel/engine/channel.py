"""Host side of the worker channel: framed JSON over the sandbox's stdin/stdout.

Everything read here comes from untrusted code: frames are size-capped,
must be JSON objects with a known ``type``, and the host never unpickles.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

MAX_FRAME = 64 * 1024 * 1024

#: message types a worker may send
WORKER_TYPES = frozenset(
    {
        "ready",
        "stream",
        "display_data",
        "update_display_data",
        "execute_result",
        "error",
        "clear_output",
        "input_request",
        "ratchet",
        "done",
        "reply",
    }
)


class ProtocolError(Exception):
    """The worker sent something that is not a valid message; the sandbox is dropped."""


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Next message, or None at end of stream."""
    try:
        header = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("truncated frame header") from exc
        return None
    (length,) = struct.unpack(">I", header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("truncated frame") from exc
    try:
        msg = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if not isinstance(msg, dict) or msg.get("type") not in WORKER_TYPES:
        raise ProtocolError(f"unexpected message: {str(msg)[:200]}")
    return msg


def encode(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg).encode("utf-8")
    return struct.pack(">I", len(data)) + data
