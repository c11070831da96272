"""Process sandboxes: start a command in isolation (bwrap, docker, or a plain subprocess)."""

from __future__ import annotations

import shutil

from .base import BindMount, ResourceLimits, Sandbox, SandboxProcess, SandboxResult, SandboxSpec
from .bwrap import BubblewrapSandbox
from .subprocess_backend import SubprocessSandbox

BACKENDS = ("bwrap", "subprocess", "docker")


def get_sandbox(backend: str = "auto") -> Sandbox:
    """The seeds' factory: bwrap when installed, else the (unsafe) subprocess fallback.

    An explicit backend that is unavailable raises instead of silently
    degrading: only ``auto`` may fall back.
    """
    if backend == "auto":
        return BubblewrapSandbox() if shutil.which("bwrap") else SubprocessSandbox()
    if backend == "bwrap":
        return BubblewrapSandbox()
    if backend == "subprocess":
        return SubprocessSandbox()
    if backend == "docker":
        from .docker_backend import DockerSandbox

        return DockerSandbox()
    raise ValueError(f"unknown sandbox backend {backend!r}: choose one of {', '.join(BACKENDS)} or 'auto'")


__all__ = [
    "BindMount",
    "BubblewrapSandbox",
    "ResourceLimits",
    "Sandbox",
    "SandboxProcess",
    "SandboxResult",
    "SandboxSpec",
    "SubprocessSandbox",
    "get_sandbox",
]
