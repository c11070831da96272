"""stdout/stderr of a running cell, streamed to the host while the cell runs.

Python-level writes go through ``OutStream`` (in-process, so they stay in
order with display messages); bytes written to fds 1 and 2 by subprocesses
(``!ls``) or C code are captured through pipes by reader threads.
"""

from __future__ import annotations

import codecs
import fcntl
import io
import os
import threading
import time

from .channel import Channel
from .protocol import Msg

FLUSH_INTERVAL = 0.05
#: characters per stream message (at most 1 MiB of UTF-8)
CHUNK_CHARS = 256 * 1024


class OutStream(io.TextIOBase):
    """A text stream that batches writes into ``stream`` messages."""

    def __init__(self, name: str, channel: Channel, fileno: int) -> None:
        super().__init__()
        self.name = name
        self.channel = channel
        self._fileno = fileno
        self._buffer: list[str] = []
        self._lock = threading.RLock()
        self._last_flush = 0.0
        self._timer: threading.Timer | None = None

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "replace"

    def fileno(self) -> int:
        return self._fileno

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        with self._lock:
            self._buffer.append(text)
            now = time.monotonic()
            if "\n" in text and now - self._last_flush >= FLUSH_INTERVAL:
                self.flush()
            elif self._timer is None:
                self._timer = threading.Timer(FLUSH_INTERVAL, self.flush)
                self._timer.daemon = True
                self._timer.start()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._last_flush = time.monotonic()
            if not self._buffer:
                return
            text = "".join(self._buffer)
            self._buffer.clear()
        if not self.channel.enabled:
            return
        # One huge write becomes bounded frames (a 400 MB write used to exceed
        # the frame limit and take the sandbox, and the namespace, down).
        for start in range(0, len(text), CHUNK_CHARS):
            if self.channel.output_exhausted:
                self.channel.dropped_output += len(text) - start
                return
            self.channel.send({"type": Msg.STREAM, "name": self.name, "text": text[start : start + CHUNK_CHARS]})


class FdCapture:
    """Point fd 1 or 2 at a pipe and forward what arrives as stream messages."""

    def __init__(self, fd: int, stream: OutStream) -> None:
        self.fd = fd
        self.stream = stream
        self.saved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            try:
                chunk = os.read(self.read_end, 65536)
            except OSError:
                break
            if not chunk:
                break
            text = utf8.decode(chunk)
            if text:
                self.stream.write(text)
        self.stream.flush()

    def stop(self, timeout: float = 0.5) -> None:
        """Give the fd back to what it was and drain what is left, without
        hanging on background processes that still hold the pipe."""
        os.dup2(self.saved, self.fd)
        os.close(self.saved)
        self.thread.join(timeout)
