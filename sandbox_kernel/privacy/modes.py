"""Network modes a sandbox can be given, decided by the session's private-data level."""

from __future__ import annotations

from enum import Enum


class NetworkMode(str, Enum):
    """How much network a sandbox gets.

    The values are the seeds' (Docker network names), so a ``ContainerConfig``
    can pass them straight through. PROXIED is reserved for a future
    allow-list proxy and is treated like NONE until it exists.
    """

    FULL = "bridge"
    PROXIED = "proxied"
    NONE = "none"
