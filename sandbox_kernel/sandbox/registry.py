"""Sandbox backends by name: the built-in ones and any a third party registers.

A backend is a :class:`~sandbox_kernel.sandbox.base.Sandbox` subclass published
under the entry-point group ``sandbox_kernel.backends`` (as jupyter_client finds
kernel provisioners), so a package adds one without editing this project::

    [project.entry-points."sandbox_kernel.backends"]
    k8s = "my_package.k8s:KubernetesSandbox"

Every list of backend names (traitlets, the status comm's validation, the CLI)
comes from :func:`backend_names`.
"""

from __future__ import annotations

import importlib
import shutil
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from traitlets.config import Configurable

from .base import Sandbox

GROUP = "sandbox_kernel.backends"
#: the built-in backends, also found without installed metadata (a source tree)
BUILTIN: dict[str, str] = {
    "bwrap": "sandbox_kernel.sandbox.bwrap:BubblewrapSandbox",
    "docker": "sandbox_kernel.sandbox.docker_backend:DockerSandbox",
    "subprocess": "sandbox_kernel.sandbox.subprocess_backend:SubprocessSandbox",
}
#: ``auto`` picks the first of these whose ``available()`` is true
AUTO_ORDER = ("bwrap", "subprocess")


@lru_cache(maxsize=1)
def _registered() -> dict[str, str]:
    found = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep.value)  # a plug-in cannot replace a built-in backend
    return found


def backend_names() -> tuple[str, ...]:
    """Every registered backend name, sorted (``auto`` is not one)."""
    return tuple(sorted(_registered()))


def load_backend(name: str) -> type[Sandbox]:
    """The backend class registered as ``name``; a clear error when unknown or broken."""
    target = _registered().get(name)
    if target is None:
        raise ValueError(f"unknown sandbox backend {name!r}: choose one of {', '.join(backend_names())} or 'auto'")
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"sandbox backend {name!r} ({target}) cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise ValueError(f"sandbox backend {name!r} ({target}) is not a Sandbox subclass")
    return cls


def resolve_name(name: str = "auto") -> str:
    """``auto`` → the backend it stands for here; other names unchanged (validated)."""
    if name == "auto":
        return "bwrap" if shutil.which("bwrap") else "subprocess"
    if name not in _registered():
        load_backend(name)  # raises the error naming the choices
    return name


def backend_isolates(backend: str = "auto") -> tuple[str, bool]:
    """The backend ``backend`` stands for here, and whether it isolates
    anything, without starting one: the agent tools report what a session's
    sandbox gives (and the ratchet's notices say whether the network was
    really cut) before any sandbox runs. ``ValueError`` as :func:`load_backend`."""
    name = resolve_name(backend)
    return name, bool(load_backend(name).isolates)


def get_sandbox(backend: str = "auto", parent: Any = None) -> Sandbox:
    """A sandbox of the named backend. ``auto``: bwrap when installed, else the
    (unsafe) subprocess fallback; an explicit backend that is unavailable
    raises instead of silently degrading. Configurable backends (traitlets)
    get ``parent``, so ``--DockerSandbox.x=`` reaches them."""
    cls = load_backend(resolve_name(backend))
    if parent is not None and issubclass(cls, Configurable):
        return cls(parent=parent)  # a Configurable's constructor takes its parent
    return cls()


__all__ = ["BUILTIN", "GROUP", "backend_isolates", "backend_names", "get_sandbox", "load_backend", "resolve_name"]
