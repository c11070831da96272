"""``sandbox_network``: what the session's sandbox may reach, and what it tried to.

The egress log is written by the host's proxy (PROXIED mode) beside the
session's notebook, where no sandbox can write; the tool reads its tail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..network.egress_log import MAX_HOST, MAX_RULE, printable
from .calls import session_for, tool_errors, with_notices
from .render import ToolResult
from .sessions import SessionRegistry, ToolSession

MAX_ENTRIES = 200
TAIL_BYTES = 1 << 20


def _tail(path: Path, n: int) -> list[dict[str, Any]]:
    """The last ``n`` entries of the session's egress log (never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - TAIL_BYTES))
        lines = fh.read().splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first line may be cut
    entries = []
    for line in lines[-n:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _times(e: dict[str, Any]) -> int:
    """How many requests an entry stands for: the log counts identical refusals
    within a window on one line (network/egress_log.py); bounded, as it is read
    from a file a sandbox's requests fill."""
    count = e.get("count")
    return min(count, 10**9) if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1


def _line(e: dict[str, Any]) -> str:
    """One log entry as one line. Every field is escaped and bounded here too: the
    file is the host's, but its text came from a sandbox, and an old log (or a
    proxy bug) must not put forged lines or terminal escapes before the reader."""

    def field(key: str, default: object, limit: int = 40) -> str:
        return printable(e.get(key, default), limit)

    verdict = "allowed" if e.get("allowed") is True else "refused"
    times = f" x{_times(e)}" if _times(e) > 1 else ""
    return (
        f"{field('time', '?')} {verdict}{times} {field('method', '?', 20)} {field('host', '?', MAX_HOST)}:"
        f"{field('port', '?')} ({field('rule', '', MAX_RULE)}; {field('bytes_down', 0)} B down, "
        f"{field('bytes_up', 0)} B up)"
    )


def _modes(session: ToolSession) -> list[str]:
    """What the session's sandboxes really get (``ToolSession.cell_network`` /
    ``shell_network``), not the configured mode: a Docker shell and a backend
    that isolates nothing differ from it. The shell gets its own line when it differs."""
    cells, shell = session.cell_network()[1], session.shell_network()[1]
    if shell == cells:
        return [f"Network: {cells}"]
    return [f"Network (cells): {cells}", f"Network (shell commands, Docker): {shell}"]


@tool_errors
async def sandbox_network(
    entries: int = 20,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """The session's network mode, the egress rules, and its last connections (allowed or refused, with the rule)."""
    if isinstance(entries, bool) or not isinstance(entries, int) or not 1 <= entries <= MAX_ENTRIES:
        raise ValueError(f"entries must be between 1 and {MAX_ENTRIES}, got {entries!r}")
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        rules = session.config.egress_policy.describe()
        log = _tail(session.dir / "egress.jsonl", entries)
        lines = [
            *_modes(session),
            f"Egress rules: allow {', '.join(rules['allow']) or 'nothing'}; deny {', '.join(rules['deny']) or 'nothing'}; "
            f"HTTPS tunnels to port {', '.join(rules['connect_ports']) or 'none'}",
        ]
        if not log:
            lines.append("Egress log: no connection yet.")
        else:
            allowed = sum(_times(e) for e in log if e.get("allowed") is True)
            refused = sum(_times(e) for e in log if e.get("allowed") is not True)
            lines.append(f"Egress log (last {len(log)}): {allowed} allowed, {refused} refused")
            lines.extend(_line(e) for e in log)
    return with_notices(ToolResult("\n".join(lines)), notices)


__all__ = ["sandbox_network"]
