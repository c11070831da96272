"""How every tool call runs: its session held exclusively, errors mapped, notices added.

Shared by the tool modules (``repl.py``, ``shell.py``); adapters use
:mod:`.catalog` instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from .errors import classify
from .render import ToolResult
from .sessions import SessionRegistry, ToolSession, current_identity, get_registry


def tool_errors(fn: Callable[..., Awaitable[ToolResult]]) -> Callable[..., Awaitable[ToolResult]]:
    """Map what a tool raises to ``ToolRetryError`` / ``ToolFatalError`` (:func:`.errors.classify`)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> ToolResult:
        try:
            return await fn(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mapped = classify(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    return wrapper


@asynccontextmanager
async def session_for(
    user_id: str | None, session_id: str | None, registry: SessionRegistry | None, *, engine: bool
) -> AsyncIterator[tuple[ToolSession, list[str]]]:
    """The session held exclusively; yields (session, notices) where notices gets
    the [SYSTEM] notice if the ratchet rose during the call."""
    user, session_id = current_identity(user_id, session_id)
    reg = registry or get_registry()
    async with reg.use(user, session_id) as session:
        before = session.ratchet.network_allowed
        notices: list[str] = []
        if engine:
            await session.ensure_engine()
        try:
            yield session, notices
        finally:
            if session.engine is not None:
                try:
                    await session.engine.refresh_privacy()
                except Exception:
                    pass
            if before and not session.ratchet.network_allowed:
                notices.insert(0, session.ratchet.notice())


def with_notices(result: ToolResult, notices: list[str]) -> ToolResult:
    """The [SYSTEM] notices of the call first, then the tool's text."""
    if notices:
        result.text = "\n".join(notices) + "\n\n" + result.text
    return result
