"""Framed JSON messages between the worker and the host.

A frame is a 4-byte big-endian length followed by UTF-8 JSON. Reads are
unbuffered and exact, so a process that stops reading mid-stream never
swallows bytes meant for the process that reads next (the state holder
hands the channel over to its child after every cell).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from typing import Any

MAX_FRAME = 64 * 1024 * 1024


class ChannelClosed(EOFError):
    pass


class Channel:
    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._lock = threading.Lock()
        #: set to False to drop messages (background threads of a finished cell)
        self.enabled = True

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, default=repr, ensure_ascii=False).encode("utf-8", "surrogatepass")
        frame = struct.pack(">I", len(data)) + data
        with self._lock:
            view = memoryview(frame)
            while view:
                written = os.write(self.write_fd, view)
                view = view[written:]

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self.read_fd, min(n, 1 << 20))
            if not chunk:
                raise ChannelClosed("host closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict[str, Any]:
        (length,) = struct.unpack(">I", self._read_exact(4))
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit")
        msg = json.loads(self._read_exact(length))
        if not isinstance(msg, dict):
            raise ValueError("message is not a JSON object")
        return msg
