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
isolated one for good. Set it up in one line with ``private_data_mcp_stdio``
(the isolated instance runs under bubblewrap without network) or
``private_data_mcp_http`` (the seeds' ``url`` / ``url_isolated``); both need
pydantic-ai's MCP client (``pip install 'pydantic-ai-slim[mcp]'``).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

try:
    from pydantic_ai import BinaryContent, ModelRetry, RunContext, Tool, ToolReturn
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "sandbox_kernel.tools.pydantic_ai needs pydantic-ai: pip install 'sandbox_kernel[pydantic-ai]' "
        "(or pydantic-ai-slim)"
    ) from exc
try:  # tool_error_behavior="failed" (newer pydantic-ai)
    from pydantic_ai import ToolFailed

    _TOOL_ERRORS: tuple[type[Exception], ...] = (ModelRetry, ToolFailed)
except ImportError:  # pragma: no cover - depends on the pydantic-ai version
    _TOOL_ERRORS = (ModelRetry,)

from ..engine.launch import sandbox_env
from ..engine.ratchet import Ratchet
from ..privacy import NetworkMode, PrivacyStore
from ..privacy.postgres import open_store
from ..sandbox.base import BindMount, SandboxSpec
from ..sandbox.bwrap import SYSTEM_DIRS, BubblewrapSandbox, python_roots
from .catalog import CATALOG, ToolSpec, call_tool
from .errors import FATAL_PREFIX, ToolRetryError
from .render import ToolResult, deliverable
from .sessions import SessionRegistry, current_identity, get_registry
from .workspace import workspace_dir

log = logging.getLogger(__name__)


def _out(result: ToolResult) -> Any:
    result = deliverable(result)  # a bounded number of images, each with a sane header
    if not result.images:
        return result.text
    images = [BinaryContent(data=base64.b64decode(data), media_type=mime) for mime, data in result.images]
    return ToolReturn(return_value=result.text, content=images)


def get_all_tools(
    user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None
) -> list[Tool]:
    """Every tool of the catalog (tools/catalog.py), bound to one session."""
    user, session = current_identity(user_id, session_id)
    identity = {"user_id": user, "session_id": session, "registry": registry}

    async def call(spec: ToolSpec, arguments: dict[str, Any]) -> Any:
        try:
            return _out(await call_tool(spec, arguments, identity))
        except ToolRetryError as exc:
            raise ModelRetry(str(exc)) from exc

    return [Tool(spec.bind(call), takes_ctx=False, max_retries=3) for spec in CATALOG]


def get_toolset(
    user_id: str | None = None, session_id: str | None = None, registry: SessionRegistry | None = None
) -> FunctionToolset:
    return FunctionToolset(get_all_tools(user_id, session_id, registry))


def _fatal(message: object) -> bool:
    return isinstance(message, str) and message.lstrip().startswith(FATAL_PREFIX)


@dataclass
class PrivateDataMCPToolset(WrapperToolset):
    """Route calls to ``isolated`` once the session is private (one-way).

    ``wrapped`` is the normal instance, ``isolated`` the same server without
    network. Both are entered (connected) together and stay open while this
    toolset is; each call goes to the normal instance until the privacy store
    says the session (``user_id``, ``session_id``) holds private data, then
    to the isolated one for good: the answer is cached, and the store itself
    only goes up, so a toolset built later for the same session starts
    isolated. A store that cannot be read counts as private (fails closed).

    The tool list (and the tool objects calls are made with) come from the
    instance in use. A tool error or result whose text starts with
    ``[FATAL]`` raises ``RuntimeError`` (aborts the run) instead of a retry,
    as the seeds' ``MCPServerStrict``. Most users want the factories
    :func:`private_data_mcp_stdio` / :func:`private_data_mcp_http`.
    """

    isolated: AbstractToolset[Any] = field(default=None)  # type: ignore[arg-type]  # required: checked in __post_init__
    user_id: str = ""
    session_id: str = ""
    store: PrivacyStore | None = None
    #: the ratchet shared through PostgreSQL (``postgresql://...``), as the
    #: kernels' and MCP servers' ``shared_store_url``: a rise on any host routes
    #: this toolset to the isolated instance
    shared_store_url: str = ""
    #: the tools' registry whose store to read when ``store`` is not given:
    #: by default the one the tool functions use (``set_registry``), so a
    #: ``ToolsConfig(data_dir=...)`` is followed here too
    registry: SessionRegistry | None = None
    _switched: bool = field(default=False, init=False, repr=False)
    _ratchet: Ratchet = field(init=False, repr=False)
    #: neither ``store`` nor ``registry`` given: the session is read in every
    #: store of the host too (an app that bound the tools to its own registry
    #: and built this toolset without it read the default data dir's store,
    #: which never saw the rise: a review)
    _everywhere: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.isolated is None:
            raise ValueError("PrivateDataMCPToolset needs an isolated instance")
        if self.isolated is self.wrapped:
            raise ValueError("PrivateDataMCPToolset: the isolated instance must differ from the normal one")
        self.user_id, self.session_id = current_identity(self.user_id or None, self.session_id or None)
        if self.store is not None and self.shared_store_url:
            raise ValueError("PrivateDataMCPToolset: give store or shared_store_url, not both")
        config = (self.registry or get_registry()).config
        self._everywhere = self.store is None and self.registry is None
        if self.store is None:
            # The store the tools write: one read elsewhere (the default data
            # dir when the tools use another) never saw the rise, and routed
            # a private session's calls to the networked instance.
            self.store = open_store(config.root() / "privacy", self.shared_store_url or config.shared_store_url)
        # Read as the session's own sandboxes read it: with the level of its
        # folder, which a private session sharing it (a Lab kernel on the
        # notebook the agent exported) raises. Read without it, the REPL's
        # network was cut and data-tool calls still went to the networked
        # instance (an attack review).
        workspace = workspace_dir(self.user_id, self.session_id, config.root())
        self._ratchet = Ratchet(self.user_id, self.session_id, self.store, workspace=workspace)

    @property
    def private(self) -> bool:
        """True once the session's ratchet has risen (then forever for this toolset)."""
        if not self._switched and self._read_private():
            self._switched = True
        return self._switched

    def _read_private(self) -> bool:
        try:
            if self._ratchet.state.network_mode is NetworkMode.NONE:
                return True
            return self._everywhere and self._private_in_another_store()
        except Exception:  # fail closed: an unknown state is a private one
            log.exception(
                "cannot read the privacy state of %s/%s; routing to the isolated instance",
                self.user_id,
                self.session_id,
            )
            return True

    def _private_in_another_store(self) -> bool:
        """Whether any store of the host (the registry of stores: every one
        a kernel or the tools prepared) holds the session as private, with
        the level of the session's workspace beside it (a review: its own
        record alone missed a Lab kernel's rise in the notebook the agent
        exported there); an unreadable registry counts as private."""
        from ..privacy.store_registry import all_store_roots

        roots, problem = all_store_roots()
        if problem is not None:
            raise RuntimeError(problem)
        mine = Path(self.store.root).resolve() if self.store is not None else None
        for root in roots:
            if Path(root).resolve() == mine:
                continue
            # the tools' layout: <data dir>/privacy beside <data dir>/workspaces/<user>/<session>
            workspace = Path(root).parent / "workspaces" / self.user_id / self.session_id
            ratchet = Ratchet(
                self.user_id, self.session_id, PrivacyStore(root), workspace=workspace if workspace.is_dir() else None
            )
            if ratchet.state.network_mode is NetworkMode.NONE:
                return True
        return False

    def target(self) -> AbstractToolset:
        """The instance the next call goes to."""
        return self.isolated if self.private else self.wrapped

    # -- both instances take part in everything the agent does with toolsets

    async def __aenter__(self) -> PrivateDataMCPToolset:
        await self.wrapped.__aenter__()
        try:
            await self.isolated.__aenter__()
        except BaseException as exc:
            await self.wrapped.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        try:
            await self.isolated.__aexit__(*args)
        finally:
            await self.wrapped.__aexit__(*args)
        return None  # never swallow the caller's exception

    def _with(self, wrapped: AbstractToolset, isolated: AbstractToolset) -> PrivateDataMCPToolset:
        if wrapped is self.wrapped and isolated is self.isolated:
            return self
        copy = replace(self, wrapped=wrapped, isolated=isolated)
        copy._switched = self._switched  # a copy never starts lower than its original
        return copy

    async def for_run(self, ctx: RunContext[Any]) -> AbstractToolset:
        return self._with(await self.wrapped.for_run(ctx), await self.isolated.for_run(ctx))

    async def for_run_step(self, ctx: RunContext[Any]) -> AbstractToolset:
        return self._with(await self.wrapped.for_run_step(ctx), await self.isolated.for_run_step(ctx))

    def apply(self, visitor: Callable[[AbstractToolset], None]) -> None:
        self.wrapped.apply(visitor)
        self.isolated.apply(visitor)

    def visit_and_replace(self, visitor: Callable[[AbstractToolset], AbstractToolset]) -> AbstractToolset:
        return self._with(self.wrapped.visit_and_replace(visitor), self.isolated.visit_and_replace(visitor))

    # -- routing

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return await self.target().get_tools(ctx)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        target = self.target()
        if target is self.isolated:
            # The tool may have been listed by the normal instance before the
            # ratchet rose (within this step): call with the isolated one's.
            tools = await self.isolated.get_tools(ctx)
            if name not in tools:
                raise ModelRetry(f"Tool {name!r} is not available now that the session holds private data")
            tool = tools[name]
        try:
            result = await target.call_tool(name, tool_args, ctx, tool)
        except _TOOL_ERRORS as exc:
            message = getattr(exc, "message", None)  # both ModelRetry and ToolFailed carry it
            if _fatal(message):
                raise RuntimeError(message) from exc
            raise
        if _fatal(result):
            raise RuntimeError(result)
        return result


def _mcp_toolset_class() -> type:
    try:
        from pydantic_ai.mcp import MCPToolset
    except ImportError as exc:
        raise ImportError(
            "MCP servers need pydantic-ai's MCP client: pip install 'pydantic-ai-slim[mcp]' "
            f"(it brings fastmcp-slim[client]); import failed: {exc}"
        ) from exc
    return MCPToolset


def private_data_mcp_http(
    url: str,
    url_isolated: str,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    store: PrivacyStore | None = None,
    shared_store_url: str = "",
    registry: SessionRegistry | None = None,
    isolated_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> PrivateDataMCPToolset:
    """The seeds' ``get_mcp_client`` with ``url`` / ``url_isolated``: two
    streamable-HTTP (or SSE, from the URL) connections to the same MCP server.

        toolset = private_data_mcp_http("http://data-tools:8000/mcp",
                                        "http://data-tools-isolated:8000/mcp",
                                        user_id="alice", session_id="s1")
        agent = Agent(model, toolsets=[toolset])

    ``kwargs`` go to both ``pydantic_ai.mcp.MCPToolset`` instances (``id``,
    ``headers``, ``read_timeout``, ``http_client``...); ``isolated_kwargs``
    override them for the isolated one only (e.g. an ``http_client`` that
    reaches it over a unix socket). That ``url_isolated`` really has no
    network is the deployment's job (see docs/tools.md). ``shared_store_url``
    reads the ratchet from the shared PostgreSQL store, as the MCP servers do;
    ``registry``: the tools' registry whose store the session rises in (that
    of ``get_all_tools(..., registry=)``; without it, every store of the host
    is read too).
    """
    MCPToolset = _mcp_toolset_class()
    normal = MCPToolset(url, **kwargs)
    isolated = MCPToolset(url_isolated, **{**kwargs, **dict(isolated_kwargs or {})})
    return PrivateDataMCPToolset(
        normal,
        isolated=isolated,
        user_id=user_id or "",
        session_id=session_id or "",
        store=store,
        shared_store_url=shared_store_url,
        registry=registry,
    )


def _visible_in_sandbox(path: str, bind_mounts: Sequence[BindMount]) -> bool:
    roots = [*SYSTEM_DIRS, *(str(r) for r in python_roots()), *(m.target for m in bind_mounts)]
    p = PurePosixPath(os.path.normpath(path))
    return any(p == PurePosixPath(r) or PurePosixPath(r) in p.parents for r in roots)


def private_data_mcp_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    bind_mounts: Sequence[BindMount] = (),
    isolated_env: Mapping[str, str] | None = None,
    isolated_cwd: str | None = None,
    isolated_sandbox: BubblewrapSandbox | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
    store: PrivacyStore | None = None,
    shared_store_url: str = "",
    registry: SessionRegistry | None = None,
    log_file: Any = None,
    **kwargs: Any,
) -> PrivateDataMCPToolset:
    """A stdio MCP server run twice: as is, and inside bubblewrap without network.

        toolset = private_data_mcp_stdio(
            sys.executable, ["/srv/data_tools.py"],
            bind_mounts=[BindMount(Path("/srv"), "/srv", readonly=True),
                         BindMount(Path("/data/alice"), "/data/alice", readonly=True)],
            env={"DATA_DIR": "/data/alice"}, user_id="alice", session_id="s1")

    The normal instance is ``command args`` started on the host (``env`` is
    merged over the MCP SDK's default environment, in ``cwd``). The isolated
    instance is the same command under
    ``BubblewrapSandbox().build_argv(SandboxSpec(..., isolate_network=True))``:
    its own network namespace with only ``lo`` (nothing on the host, not even
    its loopback, is reachable), every other namespace unshared, read-only
    system and Python trees (``python_roots()``), a private ``/tmp``, and only
    ``bind_mounts`` besides. Its environment is cleared and set to
    ``HOME=/tmp``, a system ``PATH``, ``LANG``, then ``env``, then
    ``isolated_env``; it starts in ``isolated_cwd``, else ``cwd``, else /tmp.
    ``command`` (resolved on the host's PATH), an absolute path among
    ``args`` and the working directory must be visible inside: mount them
    (at the same path) or a ``ValueError`` says which one is missing.

    Limits: the process is spawned by the MCP SDK's stdio client (pydantic-ai's
    ``MCPToolset`` over fastmcp's ``StdioTransport``), not by
    ``sandbox_kernel.sandbox.base.spawn``, so the sandbox's rlimits
    (``SandboxSpec.limits``: memory, processes, file size) are NOT applied to
    it; bwrap's ``--die-with-parent`` and the SDK's process-tree kill on exit
    still end it with the toolset. Both processes start when the toolset is
    entered (``async with toolset`` or an agent run) and stop when it exits
    (``keep_alive=False``).

    ``kwargs`` go to both ``pydantic_ai.mcp.MCPToolset`` instances (``id``,
    ``max_retries``, ``init_timeout``, ``read_timeout``...); ``log_file``
    receives both servers' stderr (default: this process's stderr);
    ``registry`` as for :func:`private_data_mcp_http`.
    Raises ``FileNotFoundError`` when bubblewrap is not installed.
    """
    MCPToolset = _mcp_toolset_class()
    from fastmcp.client.transports import StdioTransport

    if isolated_sandbox is None:
        try:
            isolated_sandbox = BubblewrapSandbox()
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                "private_data_mcp_stdio runs the isolated MCP server under bubblewrap (bwrap), which is "
                "not installed: install the Debian/Ubuntu package 'bubblewrap' (apt-get install bubblewrap)"
            ) from exc
    args = [str(a) for a in args]
    env = dict(env or {})
    search_path = env.get("PATH") or os.environ.get("PATH")
    resolved = command if os.path.isabs(command) else shutil.which(command, path=search_path)
    if not resolved:
        raise FileNotFoundError(f"MCP server command {command!r} not found on PATH")
    resolved = os.path.abspath(resolved)
    inside_cwd = isolated_cwd or (os.fspath(cwd) if cwd is not None else "/tmp")
    for what, path in [
        ("command", resolved),
        *(("argument", a) for a in args if os.path.isabs(a) and os.path.exists(a)),
    ]:
        if not _visible_in_sandbox(path, bind_mounts):
            raise ValueError(
                f"the MCP server's {what} {path} is not visible inside the isolated instance's sandbox: "
                f"add BindMount(Path({os.path.dirname(path)!r}), {os.path.dirname(path)!r}, readonly=True) to bind_mounts"
            )
    if inside_cwd != "/tmp" and not _visible_in_sandbox(inside_cwd, bind_mounts):
        raise ValueError(
            f"the working directory {inside_cwd} is not visible inside the isolated instance's sandbox: "
            "bind-mount it or pass isolated_cwd"
        )
    # the same clean environment as every sandbox (engine/launch.py), plus the caller's
    inside_env = sandbox_env("/tmp", {**env, **dict(isolated_env or {})})
    argv = isolated_sandbox.build_argv(
        SandboxSpec(
            command=[resolved, *args],
            bind_mounts=list(bind_mounts),
            isolate_network=True,
            cwd=inside_cwd,
            env=inside_env,
        )
    )
    normal = MCPToolset(
        StdioTransport(
            command,
            args,
            env=env or None,
            cwd=os.fspath(cwd) if cwd is not None else None,
            keep_alive=False,
            log_file=log_file,
        ),
        **kwargs,
    )
    isolated = MCPToolset(StdioTransport(argv[0], argv[1:], keep_alive=False, log_file=log_file), **kwargs)
    return PrivateDataMCPToolset(
        normal,
        isolated=isolated,
        user_id=user_id or "",
        session_id=session_id or "",
        store=store,
        shared_store_url=shared_store_url,
        registry=registry,
    )
