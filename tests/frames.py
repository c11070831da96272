"""What the host makes of frames a sandbox writes on its channel."""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox_kernel.engine.channel import HEADER, read_message


def read_frame(body: bytes) -> dict[str, Any]:
    """The message the host reads from one frame of ``body`` (up to the
    largest frame), through ``engine.channel.read_message``."""

    async def read() -> dict[str, Any]:
        reader = asyncio.StreamReader(limit=1 << 27)
        reader.feed_data(HEADER.pack(len(body)) + body)
        reader.feed_eof()
        got = await read_message(reader)
        assert got is not None
        return got[0]

    return asyncio.run(read())
