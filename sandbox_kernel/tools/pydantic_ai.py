"""PydanticAI adapter (optional extra: ``pip install sandbox_kernel[pydantic-ai]``).

    from sandbox_kernel.tools.pydantic_ai import get_all_tools, get_toolset
    agent = Agent(model, tools=get_all_tools(user_id="alice", session_id="s1"))

Tools are the plain async functions of :mod:`sandbox_kernel.tools` bound to
one session (the model cannot choose another one). ``ToolRetryError``
becomes ``ModelRetry``; ``ToolFatalError`` is raised as is (a
``RuntimeError``: it aborts the run). Figures are sent to the model as
``BinaryContent`` images next to the text.

``PrivateDataMCPToolset`` is the seeds' ``MCPServerPrivateData``, per session:
two instances of the same data-tools server (normal, network-isolated); calls go
to the normal one until the session's ratchet says private, then to the
isolated one for good.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

try:
    from pydantic_ai import BinaryContent, ModelRetry, Tool, ToolReturn
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "sandbox_kernel.tools.pydantic_ai needs pydantic-ai: pip install 'sandbox_kernel[pydantic-ai]' "
        "(or pydantic-ai-slim)"
    ) from exc

from ..privacy import PrivacyStore, PrivateData
from . import repl, shell
from .errors import ToolRetryError
from .render import ToolResult
from .sessions import SessionRegistry, current_identity
from .workspace import data_dir


def _out(result: ToolResult) -> Any:
    if not result.images:
        return result.text
    images = [BinaryContent(data=base64.b64decode(data), media_type=mime) for mime, data in result.images]
    return ToolReturn(return_value=result.text, content=images)


def get_all_tools(user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None) -> list[Tool]:
    """The seven REPL tools and sandbox_execute, bound to one session."""
    user, session = current_identity(user_id, session_id)
    bound = {"user_id": user, "session_id": session, "registry": registry}

    async def run(fn: Any, *args: Any) -> Any:
        try:
            return _out(await fn(*args, **bound))
        except ToolRetryError as exc:
            raise ModelRetry(str(exc)) from exc

    async def repl_execute_cell(code: str, timeout: float = 30) -> Any:
        """Append a Python cell to the notebook and run it in the sandbox; variables, imports and functions persist across cells.

        Args:
            code: Python source of the cell.
            timeout: seconds before the cell is killed (its changes are discarded).
        """
        return await run(repl.repl_execute_cell, code, timeout)

    async def repl_rerun_cell(cell_number: int, timeout: float = 30) -> Any:
        """Run an existing cell again (0-based number from repl_show_notebook).

        Args:
            cell_number: the cell's number.
            timeout: seconds before the cell is killed.
        """
        return await run(repl.repl_rerun_cell, cell_number, timeout)

    async def repl_show_notebook() -> Any:
        """List the notebook's cells with their state and an output summary."""
        return await run(repl.repl_show_notebook)

    async def repl_show_cell(cell_number: int, full: bool = False) -> Any:
        """Show one cell's code and outputs.

        Args:
            cell_number: the cell's number.
            full: show outputs without truncation.
        """
        return await run(repl.repl_show_cell, cell_number, full)

    async def repl_delete_cell(cell_number: int) -> Any:
        """Delete a cell; later cells are renumbered.

        Args:
            cell_number: the cell's number.
        """
        return await run(repl.repl_delete_cell, cell_number)

    async def repl_clear_notebook() -> Any:
        """Remove every cell (variables already defined stay)."""
        return await run(repl.repl_clear_notebook)

    async def repl_export_ipynb(path: str = "notebook.ipynb") -> Any:
        """Save the notebook as a Jupyter .ipynb file in /workspace.

        Args:
            path: file path inside /workspace, ending in .ipynb.
        """
        return await run(repl.repl_export_ipynb, path)

    async def sandbox_execute(command: str, timeout: float = 60) -> Any:
        """Run a bash command in the session's sandbox, in /workspace.

        Args:
            command: the shell command.
            timeout: seconds before the command is killed.
        """
        return await run(shell.sandbox_execute, command, timeout)

    fns = [repl_execute_cell, repl_rerun_cell, repl_show_notebook, repl_show_cell,
           repl_delete_cell, repl_clear_notebook, repl_export_ipynb, sandbox_execute]
    return [Tool(fn, takes_ctx=False, max_retries=3) for fn in fns]


def get_toolset(user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None) -> FunctionToolset:
    return FunctionToolset(get_all_tools(user_id, session_id, registry))


@dataclass
class PrivateDataMCPToolset(WrapperToolset):
    """Route calls to ``isolated`` once the session is private (one-way).

    ``wrapped`` is the normal instance (its tool list is used for both);
    ``isolated`` the same server without network. Both stay open for the
    whole run; the switch is a one-way ratchet per (user_id, session_id).
    """

    isolated: AbstractToolset = field(default=None)  # type: ignore[assignment]
    user_id: str = ""
    session_id: str = ""
    store: PrivacyStore | None = None
    _switched: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.isolated is None:
            raise ValueError("PrivateDataMCPToolset needs an isolated instance")
        self.user_id, self.session_id = current_identity(self.user_id or None, self.session_id or None)

    @property
    def private(self) -> bool:
        if not self._switched:
            store = self.store or PrivacyStore(data_dir() / "privacy")
            if PrivateData(self.user_id, self.session_id, store).has_private_data:
                self._switched = True
        return self._switched

    def target(self) -> AbstractToolset:
        return self.isolated if self.private else self.wrapped

    async def __aenter__(self) -> "PrivateDataMCPToolset":
        await self.wrapped.__aenter__()
        try:
            await self.isolated.__aenter__()
        except BaseException:
            await self.wrapped.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        try:
            await self.isolated.__aexit__(*args)
        finally:
            return await self.wrapped.__aexit__(*args)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        target = self.target()
        if target is self.isolated:
            tools = await self.isolated.get_tools(ctx)
            tool = tools.get(name, tool)
        result = await target.call_tool(name, tool_args, ctx, tool)
        if isinstance(result, str) and result.startswith("[FATAL]"):
            raise RuntimeError(result)
        return result
