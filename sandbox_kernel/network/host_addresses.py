"""This host's own addresses: the Jupyter server and every local service listen
on some of them, so a PROXIED sandbox never reaches them (unless allowed by
address), whatever interface they are on.

Read from /proc (``fib_trie``'s LOCAL routes for IPv4, ``if_inet6``), which
Python's standard library does not expose otherwise; read when a proxy starts.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path


def local_addresses(proc: Path = Path("/proc/net")) -> list[str]:
    """Every IPv4 and IPv6 address assigned to this host's interfaces (loopback included)."""
    found: list[str] = []
    try:
        previous = ""
        for line in (proc / "fib_trie").read_text().splitlines():
            text = line.strip()
            if text.startswith("/32 host LOCAL") and previous:
                found.append(previous)
            previous = text[4:].strip() if text.startswith("|-- ") else ""
    except OSError:
        pass
    try:
        for line in (proc / "if_inet6").read_text().splitlines():
            raw = line.split()[0] if line.split() else ""
            if len(raw) == 32:
                found.append(str(ipaddress.IPv6Address(int(raw, 16))))
    except (OSError, ValueError):
        pass
    unique: list[str] = []
    for address in found:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            continue
        if address not in unique:
            unique.append(address)
    return unique


__all__ = ["local_addresses"]
