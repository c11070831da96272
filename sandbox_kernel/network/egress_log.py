"""Every connection a sandbox asked the proxy for: who, where, how much, and the rule.

Kept in memory (the last ``keep`` entries, for the widget and the agent
tools) and appended as JSON lines to a file beside the session's provenance
(created 0600, never through a symlink).

The text of an entry comes from a sandbox (the host it asked for, a refused
request's target), so :meth:`EgressLog.record` escapes every non-printable
character and bounds every field: whoever reads the log (a terminal, the
widget, an agent's model) sees data, never forged lines or escape sequences.
The proxy refuses such requests before logging them; this is the second wall.

What a sandbox controls must not grow the host without bound, and a cell can
ask for refused connections in a loop (an audit saw 2.1 MB in 20 s). So:

* repeated identical refusals (same method, host, port, rule, status) are
  counted, not written one line each: the first is written at once (the fact
  that something was refused is on disk the moment it happens), the repeats of
  the next ``repeat_window`` seconds become one more line whose ``count`` says
  how many it stands for (written when the window has passed, at the next
  entry or read, or at :meth:`EgressLog.close`). In memory the first entry's
  ``count`` is the running total, so the recent entries stay meaningful and
  the summary's counts stay exact;
* the file is capped: past ``max_bytes`` it is renamed to ``<name>.1``
  (replacing the older one) and a fresh file begun, so the disk holds at most
  about twice the cap and always the latest entries.

Every line keeps the JSON-lines format readers expect; ``count`` (1 for an
ordinary entry) is the only field added.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..terminal_text import escape_controls


@dataclass
class EgressEntry:
    """One connection (or refusal)."""

    time: str
    method: str
    host: str
    port: int
    allowed: bool
    rule: str
    address: str = ""
    bytes_up: int = 0
    bytes_down: int = 0
    duration: float = 0.0
    status: str = ""
    #: how many connections this entry stands for (repeated refusals, see the module docstring)
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def bounded(self) -> None:
        """Escape and cut every text field (see the module docstring)."""
        self.time = printable(self.time, 40)
        self.method = printable(self.method, 20)
        self.host = printable(self.host, MAX_HOST)
        self.rule = printable(self.rule, MAX_RULE)
        self.address = printable(self.address, 60)
        self.status = printable(self.status, 10)


#: the longest host the log keeps (a DNS name is at most 253 characters)
MAX_HOST = 260
#: the longest rule the log keeps (a long allow list is named in full up to this)
MAX_RULE = 2000


#: the egress log file's default cap: past it the file is rotated to ``<name>.1``
DEFAULT_MAX_BYTES = 8 << 20
#: the default window in which identical refusals are counted instead of written
DEFAULT_REPEAT_WINDOW = 10.0
#: at most this many kinds of refusal are counted at once (varying the target
#: defeats the counting, not the file's cap; this bounds the memory)
MAX_OPEN_REPEATS = 256


def printable(text: object, limit: int) -> str:
    """``text`` with each non-printable character (control, escape, line or
    format characters) written as its Python escape, cut to ``limit`` characters."""
    raw = str(text)
    shown = escape_controls(raw[:limit], keep="")
    return shown + "..." if len(raw) > limit else shown


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Repeats:
    """Identical refusals being counted: the entry written first, when its
    window opened, and the repeats not yet on disk."""

    entry: EgressEntry
    opened: float
    pending: int = 0
    last_time: str = ""


class EgressLog:
    """The egress log of one session (thread-safe; the proxy writes, readers read).

    ``max_bytes`` caps the file (rotated to ``<name>.1`` past it), ``repeat_window``
    is how long identical refusals are counted instead of written (0: every one
    is written); see the module docstring for why."""

    def __init__(
        self,
        path: Path | None = None,
        keep: int = 1000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        repeat_window: float = DEFAULT_REPEAT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if max_bytes < 4096:
            raise ValueError(f"max_bytes must be at least 4096, got {max_bytes}")
        if repeat_window < 0:
            raise ValueError(f"repeat_window must be >= 0, got {repeat_window}")
        self.path = path
        self.max_bytes = max_bytes
        self.repeat_window = repeat_window
        self._clock = clock
        self._entries: deque[EgressEntry] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._counts = {"allowed": 0, "refused": 0, "bytes_up": 0, "bytes_down": 0}
        self._domains: dict[str, int] = {}
        self._repeats: dict[tuple[object, ...], _Repeats] = {}
        self._fd: int | None = None
        self._size = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                self._fd = self._open(path)
                self._size = os.fstat(self._fd).st_size  # a resumed session appends to its file
            except OSError as exc:
                raise ValueError(f"cannot open the egress log {path}: {exc.strerror}") from None

    @staticmethod
    def _open(path: Path) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        return os.open(path, flags, 0o600)

    def record(self, entry: EgressEntry) -> None:
        entry.bounded()
        entry.count = 1
        with self._lock:
            self._counts["allowed" if entry.allowed else "refused"] += 1
            self._counts["bytes_up"] += entry.bytes_up
            self._counts["bytes_down"] += entry.bytes_down
            if entry.allowed:
                self._domains[entry.host] = self._domains.get(entry.host, 0) + 1
            now = self._clock()
            self._flush_repeats(now)
            if not entry.allowed and self.repeat_window > 0:
                key = (entry.method, entry.host, entry.port, entry.rule, entry.status, entry.address)
                repeats = self._repeats.get(key)
                if repeats is not None:
                    repeats.entry.count += 1  # the in-memory entry shows the running total
                    repeats.pending += 1
                    repeats.last_time = entry.time
                    return
                if len(self._repeats) >= MAX_OPEN_REPEATS:
                    self._flush_repeats(now, every=True)
                self._repeats[key] = _Repeats(entry, opened=now)
            self._entries.append(entry)
            self._write(entry.to_json())

    def _flush_repeats(self, now: float, every: bool = False) -> None:
        """Write one line for the counted repeats of each window that has
        passed (of all, with ``every``), and close those windows. Holds the lock."""
        for key, repeats in list(self._repeats.items()):
            if every or now - repeats.opened >= self.repeat_window:
                del self._repeats[key]
                if repeats.pending:
                    line = {**repeats.entry.to_json(), "time": repeats.last_time, "count": repeats.pending}
                    self._write(line)

    def _write(self, entry: dict[str, Any]) -> None:
        """Append one line, rotating the file first when it would pass the cap. Holds the lock."""
        if self._fd is None or self.path is None:
            return
        data = (json.dumps(entry) + "\n").encode()
        try:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate(self.path)
            os.write(self._fd, data)
            self._size += len(data)
        except OSError:
            pass  # the in-memory log still has it; a full disk must not stop traffic accounting

    def _rotate(self, path: Path) -> None:
        """``path`` becomes ``<name>.1`` (the older one goes) and writing goes on
        in a fresh file; when the rename fails, the file is emptied instead: the
        cap holds either way. Holds the lock."""
        assert self._fd is not None
        try:
            os.replace(path, path.with_name(path.name + ".1"))  # rename never follows a symlink
            fd = self._open(path)
        except OSError:
            os.ftruncate(self._fd, 0)
        else:
            os.close(self._fd)
            self._fd = fd
        self._size = os.fstat(self._fd).st_size

    def tail(self, n: int = 20) -> list[dict[str, Any]]:
        """The last ``n`` entries, oldest first (a counted refusal's ``count`` is its total so far)."""
        with self._lock:
            self._flush_repeats(self._clock())
            return [e.to_json() for e in list(self._entries)[-max(0, n) :]]

    def summary(self) -> dict[str, Any]:
        """Counts (every refusal, counted ones too), bytes and the domains reached (most used first)."""
        with self._lock:
            self._flush_repeats(self._clock())
            domains = sorted(self._domains, key=lambda d: (-self._domains[d], d))
            return {**self._counts, "domains": domains}

    def close(self) -> None:
        """Write the repeats still being counted, then close the file."""
        with self._lock:
            self._flush_repeats(self._clock(), every=True)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_REPEAT_WINDOW", "EgressEntry", "EgressLog", "now_iso", "printable"]
