"""The agent tools, described once: every adapter loops over :data:`CATALOG`.

Each :class:`ToolSpec` holds a tool's name, its plain async function, the
description a model reads, and the documentation of each argument. The
errors map the same way everywhere (:func:`call_tool`): ``ToolRetryError``
means the model's arguments were wrong and it may try again,
``ToolFatalError`` means the infrastructure failed and the run should stop.

Adding an adapter (LangChain, the OpenAI Agents SDK...) is one module::

    for spec in CATALOG:
        fn = spec.bind(lambda spec, args: call_tool(spec, args, identity))
        framework.register(fn)        # fn has the tool's real signature,
                                      # name, description and argument docs

``bind`` makes a function with the tool's signature (``Annotated`` types
whose ``Field`` carries the argument's documentation), so frameworks that
build a JSON schema from a signature (pydantic, the MCP SDK, PydanticAI) see
the same arguments and texts. See ``mcp_server.py`` and ``pydantic_ai.py``.

Adding a tool is one entry here plus its coroutine (in ``repl.py`` or
``shell.py``): every adapter picks it up.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from . import network, repl, shell
from .render import ToolResult

_REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    """One argument a model passes: its name, type, default and documentation."""

    name: str
    type: type
    doc: str
    default: Any = _REQUIRED


@dataclass(frozen=True)
class ToolSpec:
    """A tool as every adapter exposes it."""

    name: str
    #: the plain async tool; called with the arguments plus user_id, session_id, registry
    func: Callable[..., Awaitable[ToolResult]]
    #: what the model reads to decide when to call it
    description: str
    params: tuple[Param, ...] = ()

    def signature(self, extra: Sequence[inspect.Parameter] = ()) -> inspect.Signature:
        """The tool's signature: each argument ``Annotated`` with its documentation."""
        from pydantic import Field  # every framework that reads it brings pydantic

        params = [
            inspect.Parameter(
                p.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=p.default,
                annotation=Annotated[p.type, Field(description=p.doc)],
            )
            for p in self.params
        ]
        return inspect.Signature([*params, *extra], return_annotation=Any)

    def bind(
        self,
        call: Callable[[ToolSpec, dict[str, Any]], Awaitable[Any]],
        extra: Sequence[inspect.Parameter] = (),
    ) -> Callable[..., Awaitable[Any]]:
        """A function named like the tool, with its signature and description,
        that hands its arguments (``extra`` ones included) to ``call``."""
        signature = self.signature(extra)

        async def tool(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return await call(self, dict(bound.arguments))

        tool.__name__ = tool.__qualname__ = self.name
        tool.__doc__ = self.description
        tool.__signature__ = signature  # type: ignore[attr-defined]  # read by inspect.signature
        tool.__annotations__ = {
            **{p.name: p.annotation for p in signature.parameters.values()},
            "return": Any,
        }
        return tool


async def call_tool(spec: ToolSpec, arguments: Mapping[str, Any], identity: Mapping[str, Any]) -> ToolResult:
    """Run a tool for one session. Raises ``ToolRetryError`` (bad arguments:
    the model may retry) or ``ToolFatalError`` (infrastructure: stop)."""
    known = {p.name: arguments[p.name] for p in spec.params if p.name in arguments}
    return await spec.func(**known, **identity)


_TIMEOUT_CELL = Param("timeout", float, "seconds before the cell is killed (its changes are discarded)", 30)
_CELL_NUMBER = Param("cell_number", int, "the cell's 0-based number (see repl_show_notebook)")

CATALOG: tuple[ToolSpec, ...] = (
    ToolSpec(
        "repl_execute_cell",
        repl.repl_execute_cell,
        "Append a Python cell to the notebook and run it in the sandbox. Variables, imports and functions "
        "persist across cells. Returns the outputs (long ones truncated) and figures as images.",
        (Param("code", str, "Python source of the cell"), _TIMEOUT_CELL),
    ),
    ToolSpec(
        "repl_rerun_cell",
        repl.repl_rerun_cell,
        "Run an existing cell (0-based number from repl_show_notebook) again; its outputs are replaced.",
        (_CELL_NUMBER, _TIMEOUT_CELL),
    ),
    ToolSpec(
        "repl_show_notebook",
        repl.repl_show_notebook,
        "List the notebook's cells: number, state, first lines of code and an output summary.",
    ),
    ToolSpec(
        "repl_show_cell",
        repl.repl_show_cell,
        "Show one cell's code and outputs; full=true shows outputs without truncation.",
        (_CELL_NUMBER, Param("full", bool, "show outputs without truncation", False)),
    ),
    ToolSpec(
        "repl_delete_cell",
        repl.repl_delete_cell,
        "Delete a cell (variables it defined stay in the session); later cells are renumbered.",
        (_CELL_NUMBER,),
    ),
    ToolSpec(
        "repl_clear_notebook",
        repl.repl_clear_notebook,
        "Remove every cell from the notebook (variables already defined stay available).",
    ),
    ToolSpec(
        "repl_export_ipynb",
        repl.repl_export_ipynb,
        "Save the notebook as a Jupyter .ipynb file in /workspace (a path relative to /workspace).",
        (Param("path", str, "file path inside /workspace, ending in .ipynb", "notebook.ipynb"),),
    ),
    ToolSpec(
        "sandbox_execute",
        shell.sandbox_execute,
        "Run a bash command in the session's sandbox, in /workspace (shared with the notebook). "
        "Returns the exit code and the output.",
        (
            Param("command", str, "the shell command"),
            Param("timeout", float, "seconds before the command is killed", 60),
        ),
    ),
    ToolSpec(
        "sandbox_network",
        network.sandbox_network,
        "Show the session's network: its mode (proxied, full or none), the egress rules, and the last "
        "connections its sandbox made or tried (allowed or refused, with the rule that decided).",
        (Param("entries", int, "how many of the last connections to show (1-200)", 20),),
    ),
)

__all__ = ["CATALOG", "Param", "ToolSpec", "call_tool"]
