"""Plain settings of an engine session (the kernel fills them from traitlets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox import ResourceLimits


@dataclass
class EngineConfig:
    backend: str = "auto"
    workspace: Path = field(default_factory=Path.cwd)
    #: where checkpoints live on the host; a fresh temp dir when None
    state_dir: Path | None = None
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    tmp_size: int = 1 << 30
    trust_outputs: bool = False
    max_output_bytes: int = 10 * 1024 * 1024
    #: seconds to wait after an interrupt before the cell is killed
    interrupt_grace: float = 5.0
    #: seconds of idleness before a background checkpoint is taken
    checkpoint_delay: float = 0.5
    extra_env: dict[str, str] = field(default_factory=dict)
    #: how a sandbox with network gets it: "user" (user-mode, no host loopback)
    #: or "host" (shares the host's network: its loopback services and abstract
    #: unix sockets become reachable from cells)
    network: str = "user"
    #: host uid of the sandboxes when the kernel runs as root (None: the
    #: unprivileged default; 0: root, unsafe)
    sandbox_uid: int | None = None
    #: folders a workspace may lie under although the workspace policy
    #: protects them (the agent tools' own workspaces in the data dir)
    allowed_roots: tuple[Path, ...] = ()
