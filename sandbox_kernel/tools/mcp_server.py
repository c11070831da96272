"""The agent tools as an MCP server (official ``mcp`` SDK, ``MCPServer``).

    python -I -m sandbox_kernel mcp [--transport stdio|streamable-http] ...

Configuration and start-up: :mod:`sandbox_kernel.tools.mcp_app`
(``MCPServerApp``, traitlets like the kernel's).

Errors: bad arguments (unknown cell, bad path, invalid id...) come back as a
tool error (``isError``) with a plain message the model can act on;
infrastructure failures (no sandbox, Docker down, corrupt notebook file) come
back as a tool error whose text starts with ``[FATAL]`` (the seeds'
convention: a strict client aborts the run instead of retrying). Figures are
MCP ``ImageContent``.

The session the tools act on is fixed per server: ``--user-id`` /
``--session-id`` (or $SANDBOX_KERNEL_USER_ID / $SANDBOX_KERNEL_SESSION_ID).
The model cannot pick another session (that would let it escape the
private-data ratchet by starting a fresh one). Over HTTP, with
``--identity-headers``, a trusted gateway may set ``X-Sandbox-User-Id`` and
``X-Sandbox-Session-Id`` per request instead.
"""

from __future__ import annotations

import inspect
import logging
import os
import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent

from ..privacy import default_user_id, validate_id
from .catalog import CATALOG, ToolSpec, call_tool
from .errors import ToolFatalError, ToolRetryError, classify
from .render import ToolResult
from .sessions import SESSION_ENV, USER_ENV, SessionRegistry

log = logging.getLogger("sandbox_kernel.tools.mcp")

INSTRUCTIONS = (
    "A stateful Python notebook and a shell, both sandboxed. repl_execute_cell runs Python; "
    "variables, imports and functions persist across cells. sandbox_execute runs shell commands. "
    "Both share /workspace. Once private data enters the session, network access is cut for good."
)


def _content(result: ToolResult) -> CallToolResult:
    blocks: list[Any] = [TextContent(type="text", text=result.text)]
    for mime, data in result.images:
        blocks.append(ImageContent(type="image", data=data, mime_type=mime))
    return CallToolResult(content=blocks)


def _error(exc: BaseException) -> CallToolResult:
    mapped = classify(exc)
    if isinstance(mapped, ToolRetryError):
        text = f"Error: {mapped}"
    else:
        text = str(mapped if isinstance(mapped, ToolFatalError) else ToolFatalError(str(mapped)))
        log.error("fatal tool error: %s", text)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def build_server(
    registry: SessionRegistry | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
    identity_headers: bool = False,
    name: str = "sandbox-kernel",
) -> MCPServer:
    """An MCPServer exposing the REPL tools and sandbox_execute for one session
    (or, with ``identity_headers``, the session named by trusted request headers)."""
    reg = registry or SessionRegistry()
    user = validate_id(user_id or os.environ.get(USER_ENV) or default_user_id(), "user_id")
    session = validate_id(session_id or os.environ.get(SESSION_ENV) or f"mcp-{uuid.uuid4().hex[:12]}", "session_id")
    server = MCPServer(name=name, instructions=INSTRUCTIONS)

    def ids(ctx: Context | None) -> dict[str, Any]:
        u, s = user, session
        if identity_headers and ctx is not None:
            try:
                headers = ctx.headers or {}
            except Exception:
                headers = {}
            lowered = {k.lower(): v for k, v in headers.items()}
            u = validate_id(lowered.get("x-sandbox-user-id", u), "user_id")
            s = validate_id(lowered.get("x-sandbox-session-id", s), "session_id")
        return {"user_id": u, "session_id": s, "registry": reg}

    async def call(spec: ToolSpec, arguments: dict[str, Any]) -> CallToolResult:
        ctx = arguments.pop("ctx", None)
        try:
            return _content(await call_tool(spec, arguments, ids(ctx)))
        except Exception as exc:
            return _error(exc)

    # the SDK injects the request context into a parameter annotated with Context
    ctx_param = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Context | None
    )
    for spec in CATALOG:
        server.add_tool(spec.bind(call, [ctx_param]))
    server.registry = reg  # type: ignore[attr-defined]
    return server
