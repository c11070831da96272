"""A container with the narrow settings of docs/deploy/container.md, for the
tests (and bench/container_kernel.py) that run kernels inside containers.

uid 1000, every capability dropped, not privileged, a read-only root with a
/tmp tmpfs, no network unless asked, this process's pid as owner label (the
Docker conftest removes what is left), and, with ``unmask_proc``, what
``docker run --security-opt systempaths=unconfined`` sets through the Engine
API: no masked or read-only /proc paths (docker-py has no argument for it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sandbox_kernel.docker.image import host_python_mounts
from sandbox_kernel.docker.names import LABEL_OWNER_PID

REPO = Path(__file__).resolve().parents[2]

ENVIRONMENT = {"HOME": "/tmp", "SANDBOX_KERNEL_DATA_DIR": "/tmp/sk-data"}


def this_checkout_mounts() -> dict[str, str]:
    """Host path -> container path, all read-only: what the offline image needs to
    run this checkout with the host's Python. The image lacks the loader cache
    and ldconfig, which ctypes.util needs to find libseccomp."""
    return {
        "/usr": "/usr",
        str(REPO): str(REPO),
        "/etc/ld.so.cache": "/etc/ld.so.cache",
        "/usr/sbin/ldconfig": "/sbin/ldconfig",
        **host_python_mounts(),
    }


@contextmanager
def narrow_container(
    api: Any,
    image: str,
    command: list[str],
    *,
    security_opt: list[str],
    unmask_proc: bool = True,
    **host_config: Any,
) -> Iterator[str]:
    """Create the container (not started); its id. Removed, by id, on exit.
    ``host_config`` adds to or overrides the settings (``binds``, ``network_mode``,
    ``port_bindings``...)."""
    settings: dict[str, Any] = {
        "cap_drop": ["ALL"],
        "privileged": False,
        "network_mode": "none",
        "security_opt": security_opt or None,
        "tmpfs": {"/tmp": "exec,size=256m"},
        "read_only": True,
        **host_config,
    }
    config = api.create_host_config(**settings)
    if unmask_proc:
        config["MaskedPaths"] = []
        config["ReadonlyPaths"] = []
    created = api.create_container(
        image,
        command,
        user="1000:1000",
        host_config=config,
        ports=list(settings.get("port_bindings", {})) or None,
        environment=ENVIRONMENT,
        labels={LABEL_OWNER_PID: str(os.getpid())},
    )
    try:
        yield created["Id"]
    finally:
        api.remove_container(created["Id"], force=True)


def run_to_end(api: Any, container_id: str, timeout: float = 240) -> tuple[int, str]:
    """Start the container and wait for it: its exit code and its log."""
    api.start(container_id)
    status = api.wait(container_id, timeout=timeout)
    return int(status["StatusCode"]), api.logs(container_id).decode(errors="replace")


def driver_result(code: int, logs: str) -> dict[str, Any]:
    """The JSON a driver printed on its last ``RESULT `` line (it must have exited 0)."""
    lines = [line for line in logs.splitlines() if line.startswith("RESULT ")]
    assert code == 0 and lines, f"the driver failed (exit code {code}):\n{logs[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result
