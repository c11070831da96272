"""Host side of the worker channel: framed JSON over the sandbox's stdin/stdout.

Everything read here comes from untrusted code: frames are size-capped,
must be JSON objects with a known ``type``, and the host never unpickles.
"""

from __future__ import annotations

import asyncio
import json
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
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if not isinstance(msg, dict) or msg.get("type") not in WORKER_TYPES:
        raise ProtocolError(f"unexpected message: {str(msg)[:200]}")
    return msg, length


def encode(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg).encode("utf-8")
    return HEADER.pack(len(data)) + data
