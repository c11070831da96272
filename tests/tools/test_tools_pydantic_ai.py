"""The PydanticAI adapter driven by a test model (no LLM service)."""

from __future__ import annotations

from pathlib import Path

import pytest

pydantic_ai = pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelResponse, RetryPromptPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402

from sandbox_kernel.engine.ratchet import Ratchet  # noqa: E402
from sandbox_kernel.privacy import PrivacyStore, PrivateData, Sensitivity  # noqa: E402
from sandbox_kernel.tools import SessionRegistry  # noqa: E402
from sandbox_kernel.tools.pydantic_ai import PrivateDataMCPToolset, get_all_tools  # noqa: E402

pytestmark = pytest.mark.asyncio


def scripted(calls: list[tuple[str, dict]]):
    """A model that makes the given tool calls one by one, then answers 'done'."""
    step = {"i": 0}

    def model(messages, info: AgentInfo) -> ModelResponse:
        i = step["i"]
        step["i"] += 1
        if i < len(calls):
            name, args = calls[i]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{i}")])
        from pydantic_ai.messages import TextPart

        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def returns(result) -> list:
    return [
        p
        for m in result.all_messages()
        for p in getattr(m, "parts", [])
        if isinstance(p, (ToolReturnPart, RetryPromptPart))
    ]


async def test_agent_calls_the_tools(registry: SessionRegistry, data_dir: Path) -> None:
    tools = get_all_tools("pa", "s1", registry)
    assert [t.name for t in tools][:2] == ["repl_execute_cell", "repl_rerun_cell"]
    calls = [
        ("repl_execute_cell", {"code": "y = 5"}),
        ("repl_execute_cell", {"code": "y * 3"}),
        ("repl_show_cell", {"cell_number": 42}),
        ("repl_execute_cell", {"code": "import matplotlib.pyplot as plt\nplt.plot([1]); plt.show()"}),
        ("sandbox_execute", {"command": "echo shell-ok"}),
        ("repl_export_ipynb", {"path": "pa.ipynb"}),
    ]
    result = await Agent(scripted(calls), tools=tools).run("go")
    parts = returns(result)
    assert result.output == "done"
    assert "15" in str(parts[1].content)
    assert (
        isinstance(parts[2], RetryPromptPart) or getattr(parts[2], "outcome", None) == "retried"
    ) and "there is no cell 42" in str(parts[2].content)
    assert "shell-ok" in str(parts[4].content)
    assert (data_dir / "workspaces/pa/s1/pa.ipynb").exists()
    # the figure went to the model as an image, not as base64 text
    images = [
        c
        for m in result.all_messages()
        for p in getattr(m, "parts", [])
        for c in (p.content if isinstance(getattr(p, "content", None), list) else [])
        if getattr(c, "media_type", "") == "image/png"
    ]
    assert images


async def test_test_model_smoke(registry: SessionRegistry) -> None:
    from pydantic_ai.models.test import TestModel

    result = await Agent(TestModel(call_tools=["repl_show_notebook"]), tools=get_all_tools("pa", "s2", registry)).run(
        "go"
    )
    assert "empty" in result.output


async def test_private_data_routing_is_one_way(data_dir: Path) -> None:
    normal, isolated = FunctionToolset(), FunctionToolset()

    @normal.tool_plain
    def fetch() -> str:
        return "normal"

    @isolated.tool_plain
    def fetch() -> str:  # noqa: F811
        return "isolated"

    store = PrivacyStore(data_dir / "privacy")
    routed = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s3", store=store)
    agent = Agent(scripted([("fetch", {})]), toolsets=[routed])
    async with routed:
        assert "normal" in str(returns(await agent.run("go"))[0].content)
        PrivateData("pa", "s3", store).add_private_dataset("hr", Sensitivity.SECRET, source="cell")
        agent = Agent(scripted([("fetch", {})]), toolsets=[routed])
        assert "isolated" in str(returns(await agent.run("go"))[0].content)
        assert routed.private


async def test_private_data_routing_reads_the_store_the_tools_use(tmp_path: Path, data_dir: Path) -> None:
    """Tools on ``ToolsConfig(data_dir=...)``, the toolset built as documented
    (no ``store=``): it read the default data dir's store, never saw the rise,
    and kept routing a private session to the networked instance (an audit)."""
    from sandbox_kernel.tools import ToolsConfig, set_registry

    custom = SessionRegistry(ToolsConfig(backend="bwrap", data_dir=tmp_path / "custom"))
    set_registry(custom)
    try:
        normal, isolated = FunctionToolset(), FunctionToolset()
        routed = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s4")
        assert not routed.private
        PrivateData("pa", "s4", custom.config.privacy_store()).add_private_dataset("hr", Sensitivity.SECRET)
        assert routed.private and routed.target() is isolated
        explicit = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s4", registry=custom)
        assert explicit.private
    finally:
        set_registry(None)
        await custom.aclose()


async def test_private_data_routing_without_the_tools_registry_reads_every_store(
    tmp_path: Path, data_dir: Path
) -> None:
    """A review: tools bound to a registry of their own
    (``get_all_tools(..., registry=reg)``) and the toolset built by the
    factories, which took no ``registry``: it read the default data dir's
    store, and a private session's data-tool calls went to the networked
    instance. Without ``store`` or ``registry`` every store of the host is
    read now; the factories take ``registry``."""
    import inspect

    from sandbox_kernel.tools import ToolsConfig
    from sandbox_kernel.tools.pydantic_ai import private_data_mcp_http, private_data_mcp_stdio

    own = SessionRegistry(ToolsConfig(backend="bwrap", data_dir=tmp_path / "own"))
    try:
        normal, isolated = FunctionToolset(), FunctionToolset()
        routed = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s6")
        assert not routed.private
        tools = {t.name: t for t in get_all_tools("pa", "s6", own)}
        await tools["repl_execute_cell"].function(
            code="import sandbox_kernel.private as p\np.add_dataset('patients', 'SECRET')"
        )
        assert (await own.get("pa", "s6")).ratchet.private
        assert routed.private and routed.target() is isolated
        # and by the level of the session's folder there (a review): a Lab
        # kernel on the notebook the agent exported rises, not the session
        other = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s7")
        (await own.get("pa", "s7")).workspace.mkdir(parents=True, exist_ok=True)
        lab = Ratchet("pa", "lab-kernel", own.config.privacy_store(), workspace=(await own.get("pa", "s7")).workspace)
        lab.mark("SECRET", "loaded payroll", "cell")
        assert lab.private  # (its read records its folder's level, as the kernel's poll does)
        assert other.private and other.target() is isolated
        for factory in (private_data_mcp_http, private_data_mcp_stdio):
            assert "registry" in inspect.signature(factory).parameters
    finally:
        await own.aclose()


async def test_private_data_routing_follows_the_level_of_the_sessions_folder(tmp_path: Path) -> None:
    """Another session made private in the agent's folder (a Lab kernel on the
    notebook the agent exported) raises the agent's session: its REPL lost its
    network, and the data tools must go isolated too (an attack review found
    them still routed to the networked instance)."""
    from sandbox_kernel.engine.ratchet import Ratchet
    from sandbox_kernel.tools import ToolsConfig
    from sandbox_kernel.tools.workspace import workspace_dir

    registry = SessionRegistry(ToolsConfig(backend="bwrap", data_dir=tmp_path / "tools"))
    try:
        normal, isolated = FunctionToolset(), FunctionToolset()
        routed = PrivateDataMCPToolset(normal, isolated=isolated, user_id="pa", session_id="s5", registry=registry)
        assert not routed.private and routed.target() is normal
        folder = workspace_dir("pa", "s5", registry.config.root())
        folder.mkdir(parents=True, exist_ok=True)
        store = registry.config.privacy_store()
        other = Ratchet("pa", "lab-kernel-42", store, workspace=folder)
        other.mark("SECRET", "loaded payroll", "cell")
        assert other.private  # (its read records the folder's level, as the kernel's poll does)
        # the agent's own record is untouched: only its folder's level rose
        assert not PrivateData("pa", "s5", store).state.has_private_data
        assert routed.private and routed.target() is isolated
    finally:
        await registry.aclose()
