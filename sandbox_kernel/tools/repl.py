"""The REPL tools: plain async functions over the live engine session.

Every tool acts on the session named by ``user_id``/``session_id`` (default:
:func:`sandbox_kernel.tools.sessions.current_identity`) and returns a
:class:`ToolResult` (``str()`` gives the text). Bad arguments raise
``ToolRetryError``; infrastructure failures raise ``ToolFatalError``.
When the session turned private during a call, the text starts with the
[SYSTEM] notice.
"""

from __future__ import annotations

import asyncio
import errno

from ..terminal_text import terminal_safe_output
from .calls import session_for, tool_errors, with_notices
from .render import ToolResult, render_cell, render_notebook
from .sessions import SessionRegistry
from .workspace import agent_view, resolve_agent_path

#: what a bad path gives when the export is written: the agent's to fix
_PATH_ERRORS = {errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM}


@tool_errors
async def repl_execute_cell(
    code: str,
    timeout: float = 30,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Append a cell with ``code`` to the notebook and run it in the sandbox.

    Variables, imports and definitions persist across cells. Returns the cell's
    outputs (long ones truncated; repl_show_cell gives the full text).
    """
    async with session_for(user_id, session_id, registry, engine=True) as (session, notices):
        cell = await session.notebook.add_cell(code, execute=True, timeout=timeout)
        number = session.notebook.index_of(cell)
        private = session.ratchet.private
    return with_notices(render_cell(cell, number, show_code=False, private=private), notices)


@tool_errors
async def repl_rerun_cell(
    cell_number: int,
    timeout: float = 30,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Run an existing cell again (its outputs are replaced)."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        session.notebook.get_cell(cell_number)  # a bad number is reported before any sandbox starts
        await session.ensure_engine()
        cell = await session.notebook.rerun_cell(cell_number, timeout=timeout)
        private = session.ratchet.private
    return with_notices(render_cell(cell, cell_number, show_code=False, private=private), notices)


@tool_errors
async def repl_show_notebook(
    *, user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None
) -> ToolResult:
    """List every cell: number, execution count, state, first lines of code, a summary of its output."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        p = session.privacy()
        text = render_notebook(session.notebook, private=bool(p.get("private")))
        if p.get("private"):
            text += f"\nSession privacy: {p['level']} (network: {p['network']})"
    return with_notices(ToolResult(text), notices)


@tool_errors
async def repl_show_cell(
    cell_number: int,
    full: bool = False,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Show one cell: code and outputs (``full=True``: without truncation)."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        cell = session.notebook.get_cell(cell_number)
        result = render_cell(cell, cell_number, full=bool(full), private=session.ratchet.private)
    return with_notices(result, notices)


@tool_errors
async def repl_delete_cell(
    cell_number: int,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Delete a cell from the notebook (variables it created stay in the session)."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        cell = await asyncio.to_thread(session.notebook.delete_cell, cell_number)
        left = len(session.notebook.cells)
    first = (cell.code.splitlines() or [""])[0][:80]
    return with_notices(
        ToolResult(f"Deleted cell {cell_number} ({first!r}); {left} cell(s) left. Later cells were renumbered."),
        notices,
    )


@tool_errors
async def repl_clear_notebook(
    *, user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None
) -> ToolResult:
    """Remove every cell. Variables already defined stay in the session."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        n = await asyncio.to_thread(session.notebook.clear)
    return with_notices(
        ToolResult(f"Cleared the notebook ({n} cell(s) removed). Variables already defined are still available."),
        notices,
    )


@tool_errors
async def repl_export_ipynb(
    path: str = "notebook.ipynb",
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Save the notebook as a Jupyter .ipynb file in the workspace (e.g. 'analysis.ipynb')."""
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        target = resolve_agent_path(session.workspace, path)
        if target.suffix != ".ipynb":
            raise ValueError(f"path {path!r} must end with .ipynb")
        try:
            if target.is_dir():
                raise ValueError(f"path {path!r} is a directory")
            await asyncio.to_thread(session.notebook.save_as_ipynb, target, session.privacy())
        except OSError as exc:
            if exc.errno not in _PATH_ERRORS:
                raise
            # the agent's path, not the host's: a file where a folder is
            # needed, a name too long, a folder it cannot write
            raise ValueError(f"path {path!r} cannot be written: {exc.strerror}") from None
        shown = agent_view(session.workspace, target)
        n = len(session.notebook.cells)
    # as an error's text: the path is the agent's, and a terminal shows the answer
    return with_notices(ToolResult(terminal_safe_output(f"Saved {n} cell(s) to {shown}", keep_colours=False)), notices)


REPL_TOOLS = [
    repl_execute_cell,
    repl_rerun_cell,
    repl_show_notebook,
    repl_show_cell,
    repl_delete_cell,
    repl_clear_notebook,
    repl_export_ipynb,
]
