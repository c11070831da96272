"""Every adapter exposes exactly the catalog: same names, descriptions, arguments and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp_types import TextContent

from sandbox_kernel.tools import ALL_TOOLS, SessionRegistry
from sandbox_kernel.tools.catalog import CATALOG
from sandbox_kernel.tools.mcp_server import build_server
from sandbox_kernel.tools.pydantic_ai import get_all_tools

pytestmark = pytest.mark.asyncio


def _schema_view(schema: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    return {
        name: (prop.get("type"), prop.get("description"), prop.get("default"), name in required)
        for name, prop in props.items()
    }


def _expected() -> dict[str, dict[str, tuple[Any, ...]]]:
    import inspect

    out: dict[str, dict[str, tuple[Any, ...]]] = {}
    kinds = {str: "string", int: "integer", float: "number", bool: "boolean"}
    for spec in CATALOG:
        out[spec.name] = {
            p.name: (
                kinds[p.type],
                p.doc,
                None if p.default is inspect.Parameter.empty else p.default,
                p.default is inspect.Parameter.empty,
            )
            for p in spec.params
        }
    return out


async def test_mcp_server_exposes_the_catalog(data_dir: Path) -> None:
    server = build_server(SessionRegistry(), user_id="alice", session_id="s1")
    tools = {t.name: t for t in await server.list_tools()}
    assert list(tools) == [spec.name for spec in CATALOG]
    for spec in CATALOG:
        assert tools[spec.name].description == spec.description
    assert {name: _schema_view(t.input_schema) for name, t in tools.items()} == _expected()


async def test_pydantic_ai_exposes_the_catalog(data_dir: Path) -> None:
    tools = get_all_tools(user_id="alice", session_id="s1")
    assert [t.name for t in tools] == [spec.name for spec in CATALOG]
    for tool, spec in zip(tools, CATALOG, strict=True):
        assert tool.description == spec.description
    assert {t.name: _schema_view(t.function_schema.json_schema) for t in tools} == _expected()


async def test_plain_functions_are_the_catalog() -> None:
    assert [fn.__name__ for fn in ALL_TOOLS] == [spec.name for spec in CATALOG]
    assert [spec.func for spec in CATALOG] == ALL_TOOLS


async def test_errors_map_the_same_way_in_both_adapters(registry: SessionRegistry) -> None:
    """A bad argument is a retry for the model in both adapters, with the same message."""
    from pydantic_ai import ModelRetry

    server = build_server(registry, user_id="alice", session_id="s1")
    result = await server.call_tool("repl_show_cell", {"cell_number": 99})
    mcp_text = next(b.text for b in result.content if isinstance(b, TextContent))
    assert result.is_error and mcp_text.startswith("Error: ")
    tool = next(
        t for t in get_all_tools(user_id="alice", session_id="s1", registry=registry) if t.name == "repl_show_cell"
    )
    with pytest.raises(ModelRetry) as caught:
        await tool.function(cell_number=99)
    assert str(caught.value) == mcp_text.removeprefix("Error: ")
