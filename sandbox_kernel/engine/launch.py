"""What a sandbox gets, decided in one place: environment, mounts, network, limits.

The cells' sandboxes (:class:`~sandbox_kernel.engine.session.Session`), the
shell tool's commands (``Session.run_command``) and the isolated MCP servers of
the PydanticAI adapter all launch through here. A rule about what a sandbox may
see (a secret masked, a host variable never passed, private mounts only where
there is no network) is therefore written once, and a new backend receives the
same :class:`~sandbox_kernel.sandbox.SandboxSpec` whatever started it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..sandbox import BindMount, Sandbox, SandboxSpec
from .config import EngineConfig
from .workspace_policy import apply_policy

if TYPE_CHECKING:
    from .ratchet import Ratchet

#: where a sandbox sees its workspace, its checkpoints and the worker's code
IN_WORKSPACE = "/workspace"
IN_STATE = "/.sandbox_kernel/state"
IN_LIB = "/.sandbox_kernel/lib"
#: the folder holding the egress proxy's socket (PROXIED sandboxes only)
IN_EGRESS = "/.sandbox_kernel/egress"
#: the session's package layer (``%pip install``), when it lives outside the state dir
IN_PACKAGES = "/.sandbox_kernel/packages"
#: the worker package's name inside sandboxes (never ``sandbox_kernel``: a cell
#: must not be able to import the host package's modules by accident)
WORKER_PACKAGE = "sandbox_kernel_worker"
WORKER_SOURCE = Path(__file__).resolve().parent.parent / "worker"


def sandbox_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed process: nothing of the host's
    (tokens, proxies, ``PYTHONPATH``, ``LD_PRELOAD``) is inherited."""
    bindir = str(Path(sys.executable).parent)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        **(extra or {}),
    }


@dataclass
class Launch:
    """A decided launch: the spec for the backend, and notes for the user."""

    spec: SandboxSpec
    notes: tuple[str, ...] = ()
    #: the path of the workspace as the sandboxed process sees it
    workspace: str = IN_WORKSPACE
    #: the sandbox's home/tmp as it sees it
    home: str = "/tmp"


def plan_launch(
    sandbox: Sandbox,
    config: EngineConfig,
    command: Sequence[str],
    *,
    isolate_network: bool,
    ratchet: Ratchet | None = None,
    store_dirs: Sequence[Path] = (),
    allowed_roots: Sequence[Path] = (),
    extra_mounts: Sequence[BindMount] = (),
    host_home: Path | None = None,
    env: Mapping[str, str] | None = None,
    private_mounts: bool | None = None,
) -> Launch:
    """Decide a sandbox's launch from the session's configuration and privacy.

    Raises :class:`~sandbox_kernel.engine.workspace_policy.WorkspaceRefused`
    for a workspace no sandbox may mount. Private dataset mounts are added only
    when ``isolate_network`` (ratchet before data) and ``private_mounts`` is not
    False (a PROXIED sandbox has no interface but still a way out). ``host_home`` is the
    home/tmp of a sandbox that isolates nothing (the development fallback);
    ``extra_mounts`` are the caller's own (checkpoints, the worker's code).
    """
    # where the folder is now: moved on the host under a live sandbox, whose
    # mount followed it, the next sandbox mounts it there too (privacy/live_folder.py)
    live = ratchet.workspace if ratchet is not None else None
    workspace = Path(live if live is not None else config.workspace).resolve()
    notes: tuple[str, ...] = ()
    if sandbox.isolates:
        # The workspace policy: refused folders, masks over secrets and config,
        # the home rule (engine/workspace_policy.py, docs/security.md).
        # A private dataset's source in the workspace is hidden there from
        # every sandbox, this session's too: a private one reads it only at
        # /private/<name> (read-only), a public one not at all.
        sources = ratchet.private_sources() if ratchet is not None else ()
        mounts, plan = apply_policy(workspace, IN_WORKSPACE, store_dirs, allowed_roots, sources)
        notes = plan.notes
        if ratchet is not None:
            # before it starts: what it leaves may tie the folders inside
            # together (privacy/workspace_levels.py, "reached")
            ratchet.note_reached(writable_folders(mounts, workspace))
        mounts += extra_mounts
        if isolate_network and ratchet is not None and private_mounts is not False:
            mounts += ratchet.bind_mounts()
        cwd = inside = IN_WORKSPACE
        home = "/tmp"
    else:
        mounts = []
        cwd = inside = str(workspace)
        home = str(host_home or workspace)
    spec = SandboxSpec(
        command=list(command),
        bind_mounts=mounts,
        isolate_network=isolate_network,
        network=config.network,
        cwd=cwd,
        env=sandbox_env(home, {**(env or {}), **config.extra_env}),
        limits=config.limits,
        tmp_size=config.tmp_size,
        sandbox_uid=config.sandbox_uid,
    )
    return Launch(spec=spec, notes=notes, workspace=inside, home=home)


def writable_folders(mounts: Sequence[BindMount], workspace: Path) -> list[Path]:
    """The folders of the workspace a sandbox with ``mounts`` writes in as one
    mount each (a link or a rename crosses no mount): the workspace, or under
    the home rule its top-level entries bound writable."""
    return [
        m.source
        for m in mounts
        if m.kind == "bind" and not m.readonly and (m.source == workspace or workspace in m.source.parents)
    ]


__all__ = [
    "IN_EGRESS",
    "IN_LIB",
    "IN_PACKAGES",
    "IN_STATE",
    "IN_WORKSPACE",
    "WORKER_PACKAGE",
    "WORKER_SOURCE",
    "Launch",
    "plan_launch",
    "sandbox_env",
    "writable_folders",
]
