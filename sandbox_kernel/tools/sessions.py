"""Live engine sessions for agent tools, one per (user_id, session_id).

Each ``ToolSession`` keeps a real ``sandbox_kernel.engine.Session`` (the
kernel's engine: same workspace layout, same ratchet store) between tool
calls, so variables really persist. Calls on one session are serialised by
an asyncio lock; sessions idle longer than ``idle_timeout`` are checkpointed
and shut down, and resumed from their checkpoint dir when used again.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine import EngineConfig, Session
from ..engine.ratchet import UNISOLATED_FIX, Ratchet
from ..engine.replay import ReplayLog
from ..network import EgressPolicy
from ..privacy import NetworkMode, PrivacyStore, default_user_id, validate_id
from ..sandbox import ResourceLimits
from ..sandbox.limit_traits import DEFAULT_LIMITS
from ..sandbox.registry import backend_isolates
from .errors import ToolFatalError
from .notebook import MAX_CELLS, MAX_NOTEBOOK_BYTES, NOTEBOOK_FILE, Notebook
from .workspace import data_dir, session_dir, workspace_dir

if TYPE_CHECKING:  # the docker package is imported only when the Docker shell is used
    from ..docker import ContainerConfig

log = logging.getLogger("sandbox_kernel.tools")

USER_ENV = "SANDBOX_KERNEL_USER_ID"
SESSION_ENV = "SANDBOX_KERNEL_SESSION_ID"
DEFAULT_SESSION = "default"

_identity: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "sandbox_kernel_tools_identity", default=None
)


def set_identity(user_id: str, session_id: str) -> contextvars.Token[tuple[str, str] | None]:
    """Bind the session the tools act on for the current context (task)."""
    return _identity.set((validate_id(user_id, "user_id"), validate_id(session_id, "session_id")))


def reset_identity(token: contextvars.Token[tuple[str, str] | None]) -> None:
    _identity.reset(token)


def current_identity(user_id: str | None = None, session_id: str | None = None) -> tuple[str, str]:
    """Explicit ids, else the context's, else $SANDBOX_KERNEL_USER_ID / _SESSION_ID,
    else (OS user, "default")."""
    bound = _identity.get()
    user = user_id or (bound[0] if bound else None) or os.environ.get(USER_ENV) or default_user_id()
    session = session_id or (bound[1] if bound else None) or os.environ.get(SESSION_ENV) or DEFAULT_SESSION
    return validate_id(user, "user_id"), validate_id(session, "session_id")


@dataclass
class ToolsConfig:
    #: engine backend for cells: auto | bwrap | docker | subprocess
    backend: str = "auto"
    #: how sandbox_execute runs commands: "sandbox" (the engine's backend via
    #: Sandbox.run; bwrap by default) or "docker" (SandboxManager)
    shell_backend: str = "sandbox"
    idle_timeout: float = 1800.0
    max_cells: int = MAX_CELLS
    #: outputs an agent notebook keeps in all (the oldest cells' are dropped beyond)
    max_notebook_bytes: int = MAX_NOTEBOOK_BYTES
    #: None: $SANDBOX_KERNEL_DATA_DIR or <jupyter data dir>/sandbox_kernel, read when used
    data_dir: Path | None = None
    limits: ResourceLimits = DEFAULT_LIMITS
    #: public sandboxes' network: "proxied" (egress proxy), "user" (full), "host" or "none"
    network: str = "proxied"
    #: PROXIED mode: the egress rules (None: all public internet) and pinned names
    egress_policy: EgressPolicy = field(default_factory=EgressPolicy)
    egress_name_overrides: Mapping[str, list[str]] = field(default_factory=dict)
    trust_outputs: bool = False
    max_output_bytes: int = 10 * 1024 * 1024
    tmp_size: int = 1 << 30
    interrupt_grace: float = 5.0
    #: host uid of the sandboxes when root (None: 65534; 0: root, unsafe)
    sandbox_uid: int | None = None
    #: {name: {"source": path, "sensitivity": level}} mounted at /private/<name> once private
    private_datasets: Mapping[str, Any] = field(default_factory=dict)
    #: {host_path: container_path} read-only mounts for the Docker shell
    docker_read_only_mounts: Mapping[str, str] = field(default_factory=dict)
    #: container settings (image, limits, mounts) of the Docker shell; None: ContainerConfig()
    #: (environment defaults), so deployments and tests can pick an image without env vars
    docker_config: ContainerConfig | None = None
    #: keep one Docker shell container per session between commands (faster,
    #: /tmp and background processes survive) instead of one per command
    docker_persistent: bool = False
    #: seconds between checks of the ratchet store while sessions are live: a
    #: rise made elsewhere (a connector, another session sharing the folder)
    #: cuts the network of idle sandboxes and shell containers within this time
    privacy_poll_interval: float = 0.25

    #: a postgresql:// URL: the sessions' levels are shared with kernels and
    #: tools on other hosts (privacy/postgres.py); empty: this host's files only
    shared_store_url: str = ""

    def __post_init__(self) -> None:
        check_shell_network(self.shell_backend, self.network)

    def root(self) -> Path:
        return Path(self.data_dir) if self.data_dir is not None else data_dir()

    def privacy_store(self) -> PrivacyStore:
        """The ratchet's store of these sessions (one per process and URL: its connection is reused)."""
        from ..privacy.postgres import open_store

        return open_store(self.root() / "privacy", self.shared_store_url)


def check_shell_network(shell_backend: str, network: str) -> None:
    """Refuse a Docker shell with ``network="proxied"``: its containers get no
    egress proxy (the proxy lives in the engine's sandboxes), so the shell would
    either have Docker's bridge (every host, no rules, no log: what the audit
    found) or nothing, never what the setting promises. Said at config time,
    naming both settings and the choices, instead of a shell that differs
    silently from the cells."""
    if shell_backend == "docker" and network == "proxied":
        raise ValueError(
            "shell_backend='docker' cannot honour network='proxied' (the default): the Docker shell's containers "
            "get no egress proxy, rules or log. Choose network='none' (no network for cells nor shell), "
            "network='user' (full network, no egress rules), or shell_backend='sandbox' (the shell gets the "
            "proxy like the cells)"
        )


def docker_shell_mode(config: ToolsConfig, session_mode: NetworkMode) -> NetworkMode:
    """The Docker shell's network for a session whose ratchet says ``session_mode``:
    ``ToolsConfig.network`` as the cells' sandboxes follow it ("none": none;
    "user"/"full"/"host": Docker's bridge; "proxied", which ToolsConfig refuses,
    none), and none once private whatever the setting."""
    if session_mode is not NetworkMode.FULL:
        return NetworkMode.NONE
    return NetworkMode.FULL if config.network in ("user", "full", "host") else NetworkMode.NONE


def _hold_session(folder: Path, user_id: str, session_id: str) -> int:
    """An exclusive lock on the session's folder for this process, as a
    kernel holds its state folder: two tool processes on one session (two
    MCP servers given the same ids) each rewrote the notebook whole and
    checkpointed into the same folder, and one's cells and variables were
    lost (an attack review). Raises :class:`ToolFatalError` naming the
    session when another process holds it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ToolFatalError(
            f"session {user_id}/{session_id} is in use by another process of the agent tools (an MCP server "
            "given the same session id?): one process at a time keeps its notebook and state; use another "
            "session id, or stop the other process"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class ToolSession:
    """One agent session: notebook, workspace, and (while live) its engine."""

    def __init__(self, registry: SessionRegistry, user_id: str, session_id: str) -> None:
        self.registry = registry
        self.config = registry.config
        self.user_id = user_id
        self.session_id = session_id
        root = self.config.root()
        self.workspace = workspace_dir(user_id, session_id, root)
        if self.config.shell_backend == "docker":
            # before any cell writes: what cells create must be writable by the shell's containers
            registry.docker_manager().prepare_workspace(user_id, session_id)
        self.dir = session_dir(user_id, session_id, root)
        self.state_dir = self.dir / "state"
        self._held = _hold_session(self.dir, user_id, session_id)
        try:
            self._set_up(registry, user_id, session_id)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let another process take the session (once this one is retired)."""
        fd, self._held = self._held, -1
        if fd >= 0:
            os.close(fd)

    def _set_up(self, registry: SessionRegistry, user_id: str, session_id: str) -> None:
        self.store = self.config.privacy_store()
        self.notebook = Notebook.load(
            user_id, session_id, self.dir / NOTEBOOK_FILE, self.config.max_cells, self.config.max_notebook_bytes
        )
        self.ratchet = Ratchet(user_id, session_id, self.store, self.config.private_datasets, workspace=self.workspace)
        if self.config.shell_backend == "docker":
            # the shell's containers mount them read-only: once private, the
            # sessions working in them rise (WorkspaceLevels.rise_read)
            self.ratchet.read_folders = tuple(registry.docker_manager().read_only_sources())
        #: the backend the cells' (and the default shell's) sandboxes use, and
        #: whether it isolates anything: what the tools report and the notices say
        try:
            self.backend, self.isolates = backend_isolates(self.config.backend)
        except ValueError:  # unknown or broken: the engine names the error when it starts
            self.backend, self.isolates = self.config.backend, True
        if not self.isolates:
            self.ratchet.unisolated = self.backend
        self.engine: Session | None = None
        #: engines started for one shell command while no REPL engine is live
        #: (tools/shell.py): watched for rises like ``engine``
        self.command_engines: set[Session] = set()
        #: the engine ``suspend`` is checkpointing and stopping: the privacy
        #: watcher still cuts it (a cell's object can make the checkpoint last
        #: up to 120 s)
        self.suspending: Session | None = None
        #: the engine ``ensure_engine`` is starting (or resuming): watched too,
        #: from before its network decision (a rise while it started was
        #: reported cut, and a module the cell had planted sent the data on)
        self.starting: Session | None = None
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        #: set once the registry took this session out and ``suspend`` ended:
        #: only then may another ToolSession of the same ids resume from the
        #: checkpoint (``SessionRegistry.get`` waits for it)
        self.retired = asyncio.Event()

    @property
    def key(self) -> tuple[str, str]:
        return (self.user_id, self.session_id)

    def new_engine(self) -> Session:
        """An engine session of this tool session, not started: ``ensure_engine``
        starts it; the shell tool runs one command through it when no engine is live."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        engine = Session(
            EngineConfig(
                backend=self.config.backend,
                workspace=self.workspace,
                state_dir=self.state_dir,
                limits=self.config.limits,
                trust_outputs=self.config.trust_outputs,
                max_output_bytes=self.config.max_output_bytes,
                network=self.config.network,
                egress_policy=self.config.egress_policy,
                egress_name_overrides=dict(self.config.egress_name_overrides),
                egress_log=self.dir / "egress.jsonl",
                tmp_size=self.config.tmp_size,
                interrupt_grace=self.config.interrupt_grace,
                sandbox_uid=self.config.sandbox_uid,
            ),
            log=log,
            ratchet=self.ratchet,
        )
        engine.watch_cuts(self.config.privacy_poll_interval)  # polled by ``_ensure_watcher``
        return engine

    async def ensure_engine(self) -> Session:
        """The live engine; started (or resumed from the checkpoint) if needed.
        Raises ``SandboxUnavailable`` when no sandbox can be started."""
        if self.engine is not None:
            return self.engine
        engine = self.new_engine()
        # definitions and imports of earlier cells are replayed, not pickled
        engine.replay = ReplayLog.from_json(self.notebook.replay)
        engine._last_done_count = self.notebook.execution_count
        self.starting = engine
        try:
            await engine.start()
        except BaseException:
            await engine.shutdown()
            raise
        finally:
            self.starting = None
        self.engine = engine
        self.notebook.engine = engine
        return engine

    async def checkpoint(self, engine: Session | None = None) -> None:
        """Take a checkpoint now and wait for it (before the sandbox goes away)."""
        engine = engine or self.engine
        if engine is None or engine.worker is None or not engine.worker.alive:
            return
        await engine.checkpoint()

    async def suspend(self) -> None:
        """Checkpoint and stop the sandbox; the next call resumes from the checkpoint."""
        engine, self.engine = self.engine, None
        self.notebook.engine = None
        if engine is None:
            return
        self.suspending = engine
        try:
            await self.checkpoint(engine)
        except Exception as exc:  # the last background checkpoint is still there
            log.warning("checkpoint before suspending %s/%s failed: %s", self.user_id, self.session_id, exc)
        finally:
            try:
                await engine.shutdown()
            finally:
                self.suspending = None

    def cell_network(self) -> tuple[str, str]:
        """What the cells' sandboxes (and the default shell's) really get: a
        short name and a sentence. The configured mode only where the backend
        enforces it; a backend that isolates nothing is said to."""
        allowed = self.ratchet.network_allowed
        if not self.isolates:
            if allowed:
                return "full, not isolated", (
                    f"full, NOT isolated: the development {self.backend!r} backend runs cells and commands as plain "
                    "processes with this host's network; no egress rules apply and nothing is logged"
                )
            return "NOT cut, cells and commands refused", (
                f"NOT cut: the session holds private data, but the development {self.backend!r} backend isolates "
                f"nothing, so its network was never cut and cells and shell commands are refused. {UNISOLATED_FIX}"
            )
        if not allowed:
            return "none", "none (the session holds private data)"
        short = {"user": "full"}.get(self.config.network, self.config.network)
        return short, {"host": "host (the host's network)"}.get(short, short)

    def shell_network(self) -> tuple[str, str]:
        """What ``sandbox_execute`` really gets: the Docker shell's own network
        (:func:`docker_shell_mode`), else the same as the cells."""
        if self.config.shell_backend != "docker":
            return self.cell_network()
        if docker_shell_mode(self.config, self.ratchet.state.network_mode) is NetworkMode.FULL:
            return "full", "full (Docker's bridge network; no egress rules apply and nothing is logged)"
        return "none", "none (the session holds private data)" if not self.ratchet.network_allowed else "none"

    def privacy(self) -> dict[str, Any]:
        state = self.ratchet.state
        # A whole-session mark (widget, host API, a private session sharing the
        # folder) is provenance too: who raised it, why and when.
        mark = state.mark.to_json() if state.mark is not None else None
        return {
            **state.to_json(),
            "mark": mark,
            "network": self.cell_network()[0],
            "shell_network": self.shell_network()[0],
            "backend": self.backend,
            "isolated": self.isolates,
        }


class SessionRegistry:
    """The live tool sessions of this process."""

    def __init__(self, config: ToolsConfig | None = None) -> None:
        self.config = config or ToolsConfig()
        self._sessions: dict[tuple[str, str], ToolSession] = {}
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        #: sessions out of the registry whose sandbox is still being suspended:
        #: the watcher cuts them too (``_retire``)
        self._retiring: set[ToolSession] = set()
        self._docker: Any = None
        self._shell_records: dict[tuple[str, str, str], Any] = {}

    async def get(self, user_id: str, session_id: str) -> ToolSession:
        """The live session of these ids, built (from its files on the host)
        if there is none. A session of the same ids still being suspended is
        waited for first: a second one resumed meanwhile from the checkpoint
        then in the state dir (an older one: the suspending engine was still
        writing its own), and the checkpoint it took next superseded the one
        the suspension finished, losing earlier cells' state for good (an
        attack review). Refused while the registry closes (:meth:`aclose`)."""
        key = (validate_id(user_id, "user_id"), validate_id(session_id, "session_id"))
        while True:
            async with self._lock:
                self._refuse_while_closing(key)
                retiring = self._still_retiring(key)
                if retiring is None:
                    session = self._sessions.get(key)
                    if session is None:
                        session = await self._build(key)
                        self._sessions[session.key] = session
                    self._ensure_reaper()
                    self._ensure_watcher()
                    return session
            await retiring.retired.wait()  # without the registry's lock: other sessions go on

    @staticmethod
    async def _build_in(registry: SessionRegistry, key: tuple[str, str]) -> ToolSession:
        return await asyncio.to_thread(ToolSession, registry, *key)

    async def _build(self, key: tuple[str, str]) -> ToolSession:
        """A new session of ``key``, built in a thread. A call cancelled
        meanwhile does not stop the thread, and the session it built held the
        session's lock for good, never registered (a review: every later call
        on those ids was refused); it lets the lock go."""
        building = asyncio.ensure_future(self._build_in(self, key))
        try:
            return await asyncio.shield(building)
        except asyncio.CancelledError:

            def let_go(done: asyncio.Future[ToolSession]) -> None:
                if not done.cancelled() and done.exception() is None:
                    done.result().release()

            building.add_done_callback(let_go)
            raise

    def _refuse_while_closing(self, key: tuple[str, str]) -> None:
        """A call arriving while :meth:`aclose` checkpoints and stops every
        session gets a clear error: a session built now would be missed by
        the close (left running, unwatched, after it returned) or resume
        from a checkpoint the close is still replacing."""
        if self._closing:
            raise ToolFatalError(
                f"the agent tools are shutting down (the session registry is closing: every session is being "
                f"checkpointed and stopped), so this call on session {key[0]}/{key[1]} was not run; "
                "call again once the tools are served again"
            )

    def _still_retiring(self, key: tuple[str, str]) -> ToolSession | None:
        """A session of ``key`` out of the registry whose suspension has not ended."""
        return next((s for s in self._retiring if s.key == key and not s.retired.is_set()), None)

    @asynccontextmanager
    async def use(self, user_id: str, session_id: str) -> AsyncIterator[ToolSession]:
        """The session, held exclusively (calls on one session run one at a time)."""
        while True:
            session = await self.get(user_id, session_id)
            await session.lock.acquire()
            if self._sessions.get(session.key) is session:
                break
            session.lock.release()  # it expired while we waited: take the new one
        try:
            session.last_used = time.monotonic()
            yield session
        finally:
            session.last_used = time.monotonic()
            session.lock.release()

    def live(self) -> list[ToolSession]:
        return list(self._sessions.values())

    async def expire_idle(self, max_idle: float | None = None) -> list[tuple[str, str]]:
        """Suspend sessions idle longer than ``max_idle`` (default: the config's)."""
        limit = self.config.idle_timeout if max_idle is None else max_idle
        now = time.monotonic()
        expired = []
        for session in list(self._sessions.values()):
            if session.lock.locked() or now - session.last_used < limit:
                continue
            async with session.lock:
                if now - session.last_used < limit:
                    continue
                async with self._lock:
                    if self._sessions.get(session.key) is not session:
                        continue  # the close took it: the close suspends it
                    del self._sessions[session.key]
                    self._retiring.add(session)  # with the removal: ``get`` sees one or the other
                await self._retire(session)
                expired.append(session.key)
        return expired

    async def _retire(self, session: ToolSession) -> None:
        """Suspend a session taken out of the registry, still watched: its
        checkpoint can last up to 120 s (a cell's ``__reduce__`` decides), and
        a rise meanwhile left its sandbox, and a daemon in it, with network for
        all of that time, ``wait=True`` timing out (an attack review). A call
        for the same ids waits for ``session.retired`` (:meth:`get`)."""
        self._retiring.add(session)
        try:
            await session.suspend()
        finally:
            self._retiring.discard(session)
            session.release()
            session.retired.set()

    async def _retirements_ended(self) -> None:
        """Wait for the suspensions the reaper began before the close: the
        reaper is cancelled next, and an engine cut off in its checkpoint
        would lose what that checkpoint was saving."""
        while pending := [s for s in self._retiring if not s.retired.is_set()]:
            await pending[0].retired.wait()

    def _ensure_reaper(self) -> None:
        if self._reaper is not None and not self._reaper.done():
            return
        if self.config.idle_timeout <= 0:
            return

        async def reap() -> None:
            interval = max(0.05, min(60.0, self.config.idle_timeout / 4))
            while self._sessions and not self._closing:
                await asyncio.sleep(interval)
                try:
                    await self.expire_idle()
                except Exception as exc:  # never let the reaper die
                    log.error("expiring idle sessions failed: %s", exc)

        self._reaper = asyncio.get_running_loop().create_task(reap())

    def _ensure_watcher(self) -> None:
        """Poll the ratchet while sessions are live, so a rise made elsewhere
        cuts idle sandboxes and shell containers without waiting for a call."""
        if self._watcher is not None and not self._watcher.done():
            return
        if self.config.privacy_poll_interval <= 0:
            return

        # With the shared store, a rise on any host wakes the watcher at once
        # (LISTEN/NOTIFY); the interval stays the fallback.
        wake = self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        store = self.config.privacy_store()
        listen = getattr(store, "listen", None)
        stop_listening = listen(lambda user, session: loop.call_soon_threadsafe(wake.set)) if listen else None

        async def watch() -> None:
            try:
                while self._sessions or self._retiring:
                    try:
                        await asyncio.wait_for(wake.wait(), self.config.privacy_poll_interval)
                    except asyncio.TimeoutError:
                        pass
                    wake.clear()
                    await check()
            finally:
                if stop_listening is not None:
                    stop_listening()

        async def check() -> None:
            for session in [*self._sessions.values(), *self._retiring]:
                for engine in [session.engine, session.starting, session.suspending, *session.command_engines]:
                    if engine is None:
                        continue
                    try:
                        await engine.refresh_privacy()
                    except Exception as exc:  # never let the watcher die
                        log.error("privacy check of %s/%s failed: %s", session.user_id, session.session_id, exc)
            if self._docker is not None:
                try:
                    await asyncio.to_thread(self._docker.enforce_network)
                    self._report_shell_containers()
                except Exception as exc:
                    log.error("cutting shell containers failed: %s", exc)

        self._watcher = loop.create_task(watch())

    def _report_shell_containers(self) -> None:
        """Tell host-side raisers waiting for a cut (``wait=True``) about the
        Docker shell's persistent containers too: each is a holder of its
        session, with network until the watcher disconnected it."""
        from ..docker.hardening import docker_network
        from ..privacy.enforcement import EnforcementRecord

        store_root = self.config.root() / "privacy"
        live = {}
        for shell in self._docker.sessions():
            key = (shell.user_id, shell.session_id, shell.container_id)
            workspace = workspace_dir(shell.user_id, shell.session_id, self.config.root())
            record = self._shell_records.get(key) or EnforcementRecord(
                store_root,
                shell.user_id,
                shell.session_id,
                workspace=workspace,
                reads=self._docker.read_only_sources(),  # its read-only mounts rise it too (docker/manager.py)
            )
            # the session's level with its folder's, as the watcher's cut decides it
            level = self._shell_ratchet(shell.user_id, shell.session_id).state.sensitivity
            record.report(level, docker_network(shell.network_mode) != "none")
            live[key] = record
        for key, record in self._shell_records.items():
            if key not in live:
                record.close()
        self._shell_records = live

    def _shell_ratchet(self, user_id: str, session_id: str) -> Ratchet:
        """The ratchet of a session as its Docker shell's containers see it:
        their workspace and read-only mounts (once private, the sessions
        working in those rise: ``WorkspaceLevels.rise_read``)."""
        ratchet = Ratchet(
            user_id,
            session_id,
            self.config.privacy_store(),
            workspace=workspace_dir(user_id, session_id, self.config.root()),
        )
        if self._docker is not None:
            ratchet.read_folders = tuple(self._docker.read_only_sources())
        return ratchet

    def docker_manager(self) -> Any:
        if self._docker is None:
            check_shell_network(self.config.shell_backend, self.config.network)  # a config changed after it was made
            from ..docker import SandboxManager

            # workspace_root/<user>/<session> is workspace_dir(user, session, root):
            # the shell mounts the very directory the REPL cells use
            self._docker = SandboxManager(
                read_only_mounts=dict(self.config.docker_read_only_mounts) or None,
                config=self.config.docker_config,
                workspace_root=self.config.root() / "workspaces",
                # ToolsConfig.network and the ratchet together (the manager keeps
                # the most restrictive it has seen): not the ratchet alone, which
                # says FULL for every public session whatever the setting
                network_mode_getter=lambda u, s: docker_shell_mode(
                    self.config, self._shell_ratchet(u, s).state.network_mode
                ),
                shared_workspace=True,
                # its own watcher cuts held containers as often as the registry's
                # looks, and its records (persistent and ephemeral containers,
                # from before their mode is read) are what wait=True waits for
                privacy_poll_interval=max(self.config.privacy_poll_interval, 0.0),
                enforcement_store=self.config.root() / "privacy",
            )
        return self._docker

    async def aclose(self) -> None:
        """Shut every live session down (checkpointed) and stop the reaper
        and the watcher. The sessions are suspended while the watcher still
        runs (a rise during their checkpoints is cut); it is stopped
        afterwards, and also ends by itself once no session is left (a
        cancellation that lands while it replaces a sandbox must not leave it
        polling). Calls arriving meanwhile are refused (:meth:`get`)."""
        self._closing = True
        try:
            await self._close_sessions()
            if self._docker is not None:
                await self._docker.aclose_all()
                self._docker = None
        finally:
            self._closing = False  # a registry closed is empty, and may be used again

    async def _close_sessions(self) -> None:
        """Suspend every session (and wait for those the reaper is suspending),
        then stop the reaper, the watcher and the shell containers' records."""
        async with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._retiring.update(sessions)
        try:
            for session in sessions:
                async with session.lock:
                    await self._retire(session)
            await self._retirements_ended()
        finally:
            self._retiring.difference_update(sessions)
            if self._wake is not None:
                self._wake.set()
            for task in (self._reaper, self._watcher):
                if task is not None:
                    task.cancel()
                    try:
                        await task
                    except (asyncio.CancelledError, Exception):
                        pass
            self._reaper = self._watcher = None
            for record in self._shell_records.values():
                record.close()
            self._shell_records = {}


_default: SessionRegistry | None = None


def get_registry() -> SessionRegistry:
    global _default
    if _default is None:
        _default = SessionRegistry()
    return _default


def set_registry(registry: SessionRegistry | None) -> None:
    global _default
    _default = registry
