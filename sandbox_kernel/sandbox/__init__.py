"""Process sandboxes: start a command in isolation (bwrap, docker, or a plain subprocess)."""

from __future__ import annotations

from .base import BindMount, ResourceLimits, Sandbox, SandboxProcess, SandboxResult, SandboxSpec
from .bwrap import BubblewrapSandbox
from .registry import backend_names, get_sandbox, load_backend
from .subprocess_backend import SubprocessSandbox

__all__ = [
    "BindMount",
    "BubblewrapSandbox",
    "ResourceLimits",
    "Sandbox",
    "SandboxProcess",
    "SandboxResult",
    "SandboxSpec",
    "SubprocessSandbox",
    "backend_names",
    "get_sandbox",
    "load_backend",
]
