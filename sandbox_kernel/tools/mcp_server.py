"""The agent tools as an MCP server (official ``mcp`` SDK, ``MCPServer``).

    python -m sandbox_kernel.tools.mcp_server [--transport stdio|streamable-http] ...
    sandbox-kernel mcp ...                  (the same, once wired into the CLI)

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

import argparse
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent

from ..privacy import default_user_id, validate_id
from . import repl, shell
from .errors import ToolFatalError, ToolRetryError, classify
from .render import ToolResult
from .sessions import SESSION_ENV, USER_ENV, SessionRegistry, ToolsConfig

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

    for fn in (repl_execute_cell, repl_rerun_cell, repl_show_notebook, repl_show_cell,
               repl_delete_cell, repl_clear_notebook, repl_export_ipynb, sandbox_execute):
        server.add_tool(fn)
    server.registry = reg  # type: ignore[attr-defined]
    return server


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sandbox-kernel mcp", description="Serve the sandbox_kernel agent tools over MCP.")
    p.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (streamable-http)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (streamable-http)")
    p.add_argument("--path", default="/mcp", help="HTTP endpoint path (streamable-http)")
    p.add_argument("--user-id", default=None, help=f"user id (default ${USER_ENV} or the OS user)")
    p.add_argument("--session-id", default=None, help=f"session id (default ${SESSION_ENV} or a fresh mcp-<random> id)")
    p.add_argument("--identity-headers", action="store_true",
                   help="HTTP only: take the session from X-Sandbox-User-Id / X-Sandbox-Session-Id headers "
                        "(only behind a gateway that sets them: clients could otherwise pick any session)")
    p.add_argument("--backend", choices=["auto", "bwrap", "docker", "subprocess"], default="auto", help="sandbox for cells")
    p.add_argument("--shell-backend", choices=["sandbox", "docker"], default="sandbox", help="where sandbox_execute runs commands")
    p.add_argument("--idle-timeout", type=float, default=1800.0, help="seconds before an idle session is suspended (checkpointed)")
    p.add_argument("--data-dir", default=None, help="data dir (default $SANDBOX_KERNEL_DATA_DIR or <jupyter data dir>/sandbox_kernel)")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    from pathlib import Path

    config = ToolsConfig(backend=args.backend, shell_backend=args.shell_backend, idle_timeout=args.idle_timeout,
                         data_dir=Path(args.data_dir).absolute() if args.data_dir else None)
    registry = SessionRegistry(config)
    try:
        server = build_server(registry, args.user_id, args.session_id, identity_headers=args.identity_headers)
    except ValueError as exc:
        print(f"sandbox-kernel mcp: {exc}", file=sys.stderr)
        return 2
    import anyio

    async def serve() -> None:
        try:
            if args.transport == "stdio":
                await server.run_stdio_async()
            else:
                await server.run_streamable_http_async(host=args.host, port=args.port, streamable_http_path=args.path)
        finally:
            with anyio.CancelScope(shield=True):
                await registry.aclose()

    try:
        anyio.run(serve)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
