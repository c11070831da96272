"""Plain settings of an engine session (the kernel fills them from traitlets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..network import EgressPolicy
from ..sandbox import ResourceLimits


@dataclass
class EngineConfig:
    backend: str = "auto"
    workspace: Path = field(default_factory=Path.cwd)
    #: where checkpoints live on the host; a fresh temp dir when None
    state_dir: Path | None = None
    #: where the replay log (imports, definitions) is kept on the host, outside
    #: every mount, so a new engine can resume after a crash; None: memory only
    replay_file: Path | None = None
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    tmp_size: int = 1 << 30
    trust_outputs: bool = False
    max_output_bytes: int = 10 * 1024 * 1024
    #: seconds to wait after an interrupt before the cell is killed
    interrupt_grace: float = 5.0
    #: seconds of idleness before a background checkpoint is taken
    checkpoint_delay: float = 0.5
    extra_env: dict[str, str] = field(default_factory=dict)
    #: how a public sandbox reaches the network: "proxied" (no interface; an
    #: egress proxy with allow/deny rules and a log, cut in place by the
    #: ratchet), "user" (a user-mode network: full, no host loopback), "host"
    #: (the host's network namespace: its loopback services and abstract unix
    #: sockets become reachable from cells) or "none"
    network: str = "proxied"
    #: the egress rules of PROXIED sandboxes (None: all public internet)
    egress_policy: EgressPolicy | None = None
    #: fixed addresses for names, checked by the rules like any answer (a
    #: pinned mirror; the tests' loopback servers)
    egress_name_overrides: dict[str, list[str]] = field(default_factory=dict)
    #: the egress log's file (JSON lines); None: kept in memory only
    egress_log: Path | None = None
    #: the session's package layer (``%pip install``), mounted read-write into its
    #: sandboxes and never on a host import path; None: a folder of the state dir
    packages_dir: Path | None = None
    #: host uid of the sandboxes when the kernel runs as root (None: the
    #: unprivileged default; 0: root, unsafe)
    sandbox_uid: int | None = None
    #: widget frontend packages (besides the standard ones) whose models cells may use
    widget_modules: frozenset[str] = frozenset()
    #: the largest widget message (JSON and buffers) either way, in bytes
    widget_max_message_bytes: int = 8 * 1024 * 1024
    #: widget messages a sandbox may send a second (more are dropped, with a notice)
    widget_rate: float = 500.0
    #: folders a workspace may lie under although the workspace policy
    #: protects them (the agent tools' own workspaces in the data dir)
    allowed_roots: tuple[Path, ...] = ()
