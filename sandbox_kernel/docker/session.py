"""``SandboxSession``: the container behind one ``(user_id, session_id)``.

Renamed from the seeds' ``Session``: the word alone is taken by notebook,
HTTP and conversation sessions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox_kernel.privacy.modes import NetworkMode

from .config import ContainerConfig


@dataclass
class SandboxSession:
    """Tracks one container's lifecycle.

    ``created_at`` and ``last_active_at`` are ``time.time()`` epoch seconds;
    ``touch()`` moves ``last_active_at`` to now and is called on every command.
    ``network_mode`` is the sandbox mode the container was created with (its Docker
    network is "bridge" for FULL, "none" otherwise).
    """

    user_id: str
    session_id: str
    container_id: str
    container_name: str
    network_mode: NetworkMode
    config: ContainerConfig
    workspace: Path
    user: str = ""
    ephemeral: bool = False
    created_at: float = field(default_factory=time.time)
    last_active_at: float = field(default_factory=time.time)
    in_flight: int = 0  # commands running now; the reaper skips busy sessions
    #: the container's cgroup as the host sees it (``SandboxCgroup``, not owned),
    #: to stop it without the daemon; None when it could not be found
    cgroup: Any = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.user_id, self.session_id)

    def touch(self) -> None:
        self.last_active_at = time.time()

    def idle_seconds(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.last_active_at

    def __str__(self) -> str:
        kind = "ephemeral" if self.ephemeral else "persistent"
        return (
            f"SandboxSession({self.user_id}/{self.session_id}, {kind}, "
            f"container={self.container_name} [{self.container_id[:12]}], "
            f"network={self.network_mode.name}, workspace={self.workspace})"
        )
