"""Why bwrap cannot start inside a container, and what to set so that it can.

A JupyterHub spawner or ``docker run`` starts the kernel in a container whose
runtime defaults forbid what bwrap does: Docker's default seccomp profile lets a
process without CAP_SYS_ADMIN make no namespace (bwrap: "No permissions to create
new namespace"), and the runtime's masked /proc paths make mounting a fresh /proc
fail ("Can't mount proc on /newroot/proc"). The kernel never falls back to running
cells unsandboxed; these hints turn bwrap's message into the settings to change
(docs/deploy/container.md). Found by trying, in a non-privileged container with
no capabilities, as uid 1000: the shipped profile plus ``systempaths=unconfined``
is enough, and each of the two alone is not.
"""

from __future__ import annotations

import os
from pathlib import Path

PROFILE_DOC = "docs/deploy/container.md"

#: bwrap's message when the seccomp profile (or a sysctl) refuses user namespaces
_NO_NAMESPACES = "No permissions to create new namespace"
#: bwrap's message when /proc has locked (masked) submounts
_NO_PROC = "Can't mount proc"


def container_runtime(proc: Path = Path("/proc"), root: Path = Path("/")) -> str | None:
    """The kind of container this process runs in, or None on a plain host.

    Each runtime leaves its own mark: Docker ``/.dockerenv``, Podman
    ``/run/.containerenv``, Kubernetes the service variables, and the cgroup path
    of PID 1 for the rest."""
    if (root / ".dockerenv").exists():
        return "docker"
    if (root / "run/.containerenv").exists():
        return "podman"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    try:
        cgroup = (proc / "1/cgroup").read_text(errors="replace")
    except OSError:
        return None
    for mark, name in (
        ("kubepods", "kubernetes"),
        ("docker", "docker"),
        ("libpod", "podman"),
        ("containerd", "containerd"),
    ):
        if mark in cgroup:
            return name
    return None


DETECT = "detect"


def bwrap_hint(stderr: str, runtime: str | None = DETECT) -> str | None:
    """What to set for bwrap's failure ``stderr`` (None when it is not one of the
    container causes, or this is not a container). ``runtime`` is found by
    :func:`container_runtime` unless given (None: a plain host)."""
    if runtime == DETECT:
        runtime = container_runtime()
    if runtime is None:
        return None
    if _NO_NAMESPACES in stderr:
        return (
            f"This kernel runs in a container ({runtime}) whose seccomp profile refuses the user namespaces "
            "bwrap needs. Start the container with the profile `sandbox-kernel container-profile` prints "
            "(docker run --security-opt seccomp=seccomp-bwrap.json; Kubernetes: seccompProfile type Localhost) "
            "and with --security-opt systempaths=unconfined (Kubernetes: procMount: Unmasked); on AppArmor "
            f"hosts also an AppArmor profile that allows mount. See {PROFILE_DOC}."
        )
    if _NO_PROC in stderr:
        return (
            f"This kernel runs in a container ({runtime}) that masks paths under /proc, so bwrap cannot mount "
            "the sandbox's own /proc. Start it with --security-opt systempaths=unconfined (Kubernetes: "
            f"procMount: Unmasked, which needs a user-namespaced pod). See {PROFILE_DOC}."
        )
    return None
