"""Docker sandboxes: hardened containers for shell commands (and, later, cells).

- :class:`ContainerConfig` and presets (``config``)
- :func:`build_container_kwargs`: the hardened docker-py kwargs (``hardening``)
- :class:`SandboxManager`, :class:`SandboxSession`: per-session containers for
  commands, ephemeral by default (``manager``, ``session``)
- :func:`remove_orphans`: garbage collection by owner labels (``gc``)
- :func:`ensure_test_image`: an image built offline (``image``)

The Docker SDK (``pip install sandbox_kernel[docker]``) is imported only when a
Docker call is made. See docs/docker.md.
"""

from typing import Any

from ..privacy.identity import validate_id
from .config import PRESETS, ContainerConfig, ResourcePreset
from .hardening import build_container_kwargs, check_read_only_mounts, docker_network, resolve_user
from .image import TEST_IMAGE, ensure_test_image, offline_config, remove_test_image
from .manager import TIMEOUT_EXIT_CODE, ContainerGone, NetworkModeChanged, SandboxManager
from .names import container_name
from .session import SandboxSession

__all__ = [
    "PRESETS",
    "TEST_IMAGE",
    "TIMEOUT_EXIT_CODE",
    "ContainerConfig",
    "ContainerGone",
    "GCReport",
    "NetworkModeChanged",
    "ResourcePreset",
    "SandboxManager",
    "SandboxSession",
    "build_container_kwargs",
    "check_read_only_mounts",
    "container_name",
    "docker_network",
    "ensure_test_image",
    "offline_config",
    "remove_orphans",
    "remove_test_image",
    "resolve_user",
    "validate_id",
]


def __getattr__(name: str) -> Any:
    # gc is imported lazily so that `python -m sandbox_kernel.docker.gc` does not
    # find it already imported (runpy warns about that).
    if name in ("GCReport", "remove_orphans"):
        from . import gc

        return getattr(gc, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
