"""The two kinds of tool failure every adapter distinguishes.

``ToolRetryError``: the caller's arguments were wrong (unknown cell, bad path,
invalid id, bad timeout...): the model can fix them and try again.
``ToolFatalError``: the infrastructure failed (no sandbox, Docker down, a
corrupt notebook file): retrying will not help, the run should stop.
"""

from __future__ import annotations

from ..terminal_text import terminal_safe_output

FATAL_PREFIX = "[FATAL]"
#: characters of an error's text an agent is given: an error may quote what
#: a sandbox wrote (a Docker error quotes the command's output)
MAX_ERROR_CHARS = 4000


def _shown(text: str) -> str:
    """An error's text as the agent reads it: no terminal or bidirectional
    controls (an OSC 52 sets the clipboard of the terminal showing the
    agent's transcript), and bounded."""
    text = terminal_safe_output(text, keep_colours=False)
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f" [... {len(text) - MAX_ERROR_CHARS} characters cut]"
    return text


class ToolRetryError(ValueError):
    def __str__(self) -> str:
        return _shown(super().__str__())


class ToolFatalError(RuntimeError):
    def __str__(self) -> str:
        text = _shown(super().__str__())
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
