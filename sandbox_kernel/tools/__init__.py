"""Agent tools over the sandbox_kernel engine: a stateful sandboxed notebook and a shell.

Plain async functions (``repl_*`` and ``sandbox_execute``) over the same
engine the Jupyter kernel uses; adapters (``mcp_server``, ``pydantic_ai``)
only wrap them. See docs/tools.md.
"""

from .errors import FATAL_PREFIX, ToolFatalError, ToolRetryError
from .network import sandbox_network
from .notebook import MAX_CELLS, Cell, CellOutput, CellState, Notebook, NotebookCorruptError, NotebookError, OutputType
from .render import ToolResult
from .repl import (
    REPL_TOOLS,
    repl_clear_notebook,
    repl_delete_cell,
    repl_execute_cell,
    repl_export_ipynb,
    repl_rerun_cell,
    repl_show_cell,
    repl_show_notebook,
)
from .sessions import (
    SessionRegistry,
    ToolsConfig,
    ToolSession,
    current_identity,
    get_registry,
    reset_identity,
    set_identity,
    set_registry,
)
from .shell import sandbox_execute
from .workspace import WorkspacePathError, resolve_agent_path

ALL_TOOLS = [*REPL_TOOLS, sandbox_execute, sandbox_network]

__all__ = [
    "ALL_TOOLS",
    "FATAL_PREFIX",
    "MAX_CELLS",
    "REPL_TOOLS",
    "Cell",
    "CellOutput",
    "CellState",
    "Notebook",
    "NotebookCorruptError",
    "NotebookError",
    "OutputType",
    "SessionRegistry",
    "ToolFatalError",
    "ToolResult",
    "ToolRetryError",
    "ToolSession",
    "ToolsConfig",
    "WorkspacePathError",
    "current_identity",
    "get_registry",
    "repl_clear_notebook",
    "repl_delete_cell",
    "repl_execute_cell",
    "repl_export_ipynb",
    "repl_rerun_cell",
    "repl_show_cell",
    "repl_show_notebook",
    "reset_identity",
    "resolve_agent_path",
    "sandbox_execute",
    "sandbox_network",
    "set_identity",
    "set_registry",
]
