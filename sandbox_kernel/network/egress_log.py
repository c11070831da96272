"""Every connection a sandbox asked the proxy for: who, where, how much, and the rule.

Kept in memory (the last ``keep`` entries, for the widget and the agent
tools) and appended as JSON lines to a file beside the session's provenance
(created 0600, never through a symlink).

The text of an entry comes from a sandbox (the host it asked for, a refused
request's target), so :meth:`EgressLog.record` escapes every non-printable
character and bounds every field: whoever reads the log (a terminal, the
widget, an agent's model) sees data, never forged lines or escape sequences.
The proxy refuses such requests before logging them; this is the second wall.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


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


def printable(text: object, limit: int) -> str:
    """``text`` with each non-printable character (control, escape, line or
    format characters) written as its Python escape, cut to ``limit`` characters."""
    raw = str(text)
    shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in raw[:limit])
    return shown + "..." if len(raw) > limit else shown


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EgressLog:
    """The egress log of one session (thread-safe; the proxy writes, readers read)."""

    def __init__(self, path: Path | None = None, keep: int = 1000) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.path = path
        self._entries: deque[EgressEntry] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._counts = {"allowed": 0, "refused": 0, "bytes_up": 0, "bytes_down": 0}
        self._domains: dict[str, int] = {}
        self._fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
            try:
                self._fd = os.open(path, flags, 0o600)
            except OSError as exc:
                raise ValueError(f"cannot open the egress log {path}: {exc.strerror}") from None

    def record(self, entry: EgressEntry) -> None:
        entry.bounded()
        with self._lock:
            self._entries.append(entry)
            self._counts["allowed" if entry.allowed else "refused"] += 1
            self._counts["bytes_up"] += entry.bytes_up
            self._counts["bytes_down"] += entry.bytes_down
            if entry.allowed:
                self._domains[entry.host] = self._domains.get(entry.host, 0) + 1
            if self._fd is not None:
                try:
                    os.write(self._fd, (json.dumps(entry.to_json()) + "\n").encode())
                except OSError:
                    pass  # the in-memory log still has it; a full disk must not stop traffic accounting

    def tail(self, n: int = 20) -> list[dict[str, Any]]:
        """The last ``n`` entries, oldest first."""
        with self._lock:
            return [e.to_json() for e in list(self._entries)[-max(0, n) :]]

    def summary(self) -> dict[str, Any]:
        """Counts, bytes and the domains reached (most used first)."""
        with self._lock:
            domains = sorted(self._domains, key=lambda d: (-self._domains[d], d))
            return {**self._counts, "domains": domains}

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


__all__ = ["EgressEntry", "EgressLog", "now_iso", "printable"]
