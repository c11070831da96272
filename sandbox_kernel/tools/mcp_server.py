"""The agent tools as an MCP server (official ``mcp`` SDK, ``MCPServer``).

    python -m sandbox_kernel mcp [--transport stdio|streamable-http] ...
    python -m sandbox_kernel.tools.mcp_server ...      (the same)

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

import logging
import os
import sys
import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent

from ..privacy import default_user_id, validate_id
from . import repl, shell
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

    async def call(fn: Any, ctx: Context | None, *args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return _content(await fn(*args, **kwargs, **ids(ctx)))
        except Exception as exc:
            return _error(exc)

    async def repl_execute_cell(code: str, timeout: float = 30, ctx: Context | None = None) -> CallToolResult:
        """Append a Python cell to the notebook and run it in the sandbox. Variables, imports
        and functions persist across cells. Returns the outputs (long ones truncated) and figures as images."""
        return await call(repl.repl_execute_cell, ctx, code, timeout)

    async def repl_rerun_cell(cell_number: int, timeout: float = 30, ctx: Context | None = None) -> CallToolResult:
        """Run an existing cell (0-based number from repl_show_notebook) again; its outputs are replaced."""
        return await call(repl.repl_rerun_cell, ctx, cell_number, timeout)

    async def repl_show_notebook(ctx: Context | None = None) -> CallToolResult:
        """List the notebook's cells: number, state, first lines of code and an output summary."""
        return await call(repl.repl_show_notebook, ctx)

    async def repl_show_cell(cell_number: int, full: bool = False, ctx: Context | None = None) -> CallToolResult:
        """Show one cell's code and outputs; full=true shows outputs without truncation."""
        return await call(repl.repl_show_cell, ctx, cell_number, full)

    async def repl_delete_cell(cell_number: int, ctx: Context | None = None) -> CallToolResult:
        """Delete a cell (variables it defined stay in the session); later cells are renumbered."""
        return await call(repl.repl_delete_cell, ctx, cell_number)

    async def repl_clear_notebook(ctx: Context | None = None) -> CallToolResult:
        """Remove every cell from the notebook (variables already defined stay available)."""
        return await call(repl.repl_clear_notebook, ctx)

    async def repl_export_ipynb(path: str = "notebook.ipynb", ctx: Context | None = None) -> CallToolResult:
        """Save the notebook as a Jupyter .ipynb file in /workspace (a path relative to /workspace)."""
        return await call(repl.repl_export_ipynb, ctx, path)

    async def sandbox_execute(command: str, timeout: float = 60, ctx: Context | None = None) -> CallToolResult:
        """Run a bash command in the session's sandbox, in /workspace (shared with the notebook).
        Returns the exit code and the output."""
        return await call(shell.sandbox_execute, ctx, command, timeout)

    for fn in (
        repl_execute_cell,
        repl_rerun_cell,
        repl_show_notebook,
        repl_show_cell,
        repl_delete_cell,
        repl_clear_notebook,
        repl_export_ipynb,
        sandbox_execute,
    ):
        server.add_tool(fn)
    server.registry = reg  # type: ignore[attr-defined]
    return server


if __name__ == "__main__":
    from .mcp_app import main

    sys.exit(main())
