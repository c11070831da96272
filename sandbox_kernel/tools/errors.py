"""The two kinds of tool failure every adapter distinguishes.

``ToolRetryError``: the caller's arguments were wrong (unknown cell, bad path,
invalid id, bad timeout...): the model can fix them and try again.
``ToolFatalError``: the infrastructure failed (no sandbox, Docker down, a
corrupt notebook file): retrying will not help, the run should stop.
"""

from __future__ import annotations

FATAL_PREFIX = "[FATAL]"


class ToolRetryError(ValueError):
    pass


class ToolFatalError(RuntimeError):
    def __str__(self) -> str:
        text = super().__str__()
        return text if text.startswith(FATAL_PREFIX) else f"{FATAL_PREFIX} {text}"


def classify(exc: BaseException) -> BaseException:
    """Map an exception from the core to ToolRetryError / ToolFatalError."""
    from ..engine.session import SandboxUnavailable
    from .notebook import NotebookCorruptError

    if isinstance(exc, (ToolRetryError, ToolFatalError)):
        return exc
    if isinstance(exc, (SandboxUnavailable, NotebookCorruptError)):
        return ToolFatalError(str(exc))
    if isinstance(exc, (ValueError, IndexError, TypeError)):
        return ToolRetryError(str(exc))
    if _is_docker_error(exc):
        return ToolFatalError(f"Docker failed: {exc}")
    if isinstance(exc, OSError):
        return ToolFatalError(f"{type(exc).__name__}: {exc}")
    return ToolFatalError(f"{type(exc).__name__}: {exc}")


def _is_docker_error(exc: BaseException) -> bool:
    return any(c.__module__.startswith("docker.") for c in type(exc).__mro__)
