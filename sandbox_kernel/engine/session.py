"""An engine session: one sandbox at a time, a continuous namespace across cells.

The session owns the worker's lifecycle. When the sandbox dies (or must be
replaced), a new one is started and the state restored from the last
checkpoint: imports and definitions replayed, the pickled namespace loaded
inside the new sandbox, and every dropped name reported.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import itertools
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..network import EgressLog, EgressPolicy, EgressProxy
from ..network.host_addresses import local_addresses
from ..outputs import MESSAGE_COST, OutputLimiter, bundle_size, format_bytes, json_size, sanitize_bundle
from ..outputs.links import defang_text
from ..outputs.sizing import text_of
from ..outputs.widgets import WIDGET_VIEW_MIME, WidgetComms, WidgetRefused, message_size
from ..privacy.enforcement import HOLDERS_WAIT, EnforcementRecord, pending_holders
from ..privacy.modes import NetworkMode
from ..privacy.state import PrivacyState
from ..sandbox import BindMount, Sandbox, SandboxProcess, SandboxResult, SandboxSpec, get_sandbox
from ..sandbox.base import DEFAULT_MAX_OUTPUT
from ..sandbox.in_container import bwrap_hint
from ..worker import proxy_forward
from ..worker.protocol import CHECKPOINT_FAILED_MARKER, Msg, Op
from . import completer_seed, owned_dirs
from .config import EngineConfig
from .cut_watchdog import WATCHDOG
from .launch import IN_EGRESS, IN_LIB, IN_PACKAGES, IN_STATE, WORKER_PACKAGE, WORKER_SOURCE, Launch, plan_launch
from .ratchet import PRIVATE_ROOT, SYSTEM_NOTICE, Ratchet, unisolated_notice, unisolated_refusal
from .replay import ReplayLog
from .safe_read import UnsafeFileError, read_bytes, read_json
from .worker import DEAD, WorkerHandle
from .workspace_policy import WorkspaceRefused

Emit = Callable[[str, dict[str, Any]], None]
AskInput = Callable[[str, bool], Awaitable[str]]

READY_TIMEOUT = 60.0
#: how long a checkpoint the host waits for may take (before a sandbox is
#: replaced or suspended), and a completion or an inspection
CHECKPOINT_WAIT = 120.0
QUERY_WAIT = 30.0
#: how long a cell the worker was told to kill may take to end before the
#: whole sandbox is (its holder does not read the channel: stopped by the cell)
KILLED_CELL_WAIT = 5.0
#: the most output a worker's DONE may say it dropped (more is a forged number:
#: 10**400 made every later cell fail formatting it)
MAX_DROPPED_SAID = 1 << 50
#: what ``input()`` in the sandbox reads when nobody can answer: end of file
EOF = "\x04"
#: before the one retry of a start that failed in a transient way
START_RETRY_DELAY = 0.25
#: bwrap's set-up of the sandbox's own network namespace (its loopback): seen
#: to fail now and then ("Failed RTM_NEWADDR") right after another sandbox's
#: namespace was torn down; not a configuration problem, unlike the rest
_TRANSIENT_START_ERRORS = ("bwrap: loopback:",)
NOTICE = "[sandbox_kernel]"
#: how many requests' outputs frames may name (``Session._forward``)
RECENT_PARENTS = 32


def _transient_start_failure(stderr_tail: Iterable[str]) -> bool:
    return any(marker in line for line in stderr_tail for marker in _TRANSIENT_START_ERRORS)


#: a one-off command of a PROXIED sandbox: start the forwarder, then exec the command
FORWARDER_THEN_EXEC = (
    "import os, sys; sys.path.insert(0, %r); import proxy_forward as f; "
    "s = f.start_from_env(); f.serve(s, os.environ[f.SOCKET_ENV], os.environ.get(f.TOKEN_ENV, '')); "
    "pid = os.fork()\n"
    "if pid == 0: os.execvp(sys.argv[1], sys.argv[1:])\n"
    "_, status = os.waitpid(pid, 0); sys.exit(os.waitstatus_to_exitcode(status))"
)


class SandboxUnavailable(RuntimeError):
    """No sandbox could be started (missing bwrap, Docker down...)."""


@dataclass
class ExecuteResult:
    status: str  # "ok" | "error" | "died"
    execution_count: int
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    user_expressions: dict[str, Any] = field(default_factory=dict)
    payload: list[dict[str, Any]] = field(default_factory=list)
    #: the cell asked its kernel to end (``exit``, ``quit``, ``kernel.do_shutdown``);
    #: what to do about it is the caller's choice (the Jupyter kernel ends, as ipykernel does)
    exit_requested: bool = False


@dataclass
class CommResult:
    """How a widget message's handlers ended."""

    status: str  # "ok" | "error" | "died"
    #: a handler asked the kernel to end (a button calling ``kernel.do_shutdown``):
    #: ipykernel ends then too, whatever request set its ``exit_now``
    exit_requested: bool = False


def _file_ids(paths: Iterable[Path]) -> dict[Path, tuple[int, int]]:
    """Each existing path's (device, inode), following links."""
    found = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found[Path(path)] = (st.st_dev, st.st_ino)
    return found


class Session:
    """A sandboxed IPython namespace that survives cell crashes and sandbox loss."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        log: logging.Logger | None = None,
        sandbox: Sandbox | None = None,
        ratchet: Ratchet | None = None,
        on_privacy_change: Callable[[str | None], None] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.log = log or logging.getLogger("sandbox_kernel.engine")
        self.sandbox = sandbox or get_sandbox(self.config.backend)
        #: None: no ratchet, and no network either (the safe default)
        self.ratchet = ratchet
        # Host folders the backend mounts read-only besides the workspace
        # (DockerSandbox.read_only_mounts): their folder levels count too, or a
        # public container would read a folder another session made private.
        reads = tuple(Path(p) for p in getattr(self.sandbox, "read_only_mounts", None) or {})
        if ratchet is not None and reads:
            ratchet.read_folders = reads
        self.on_privacy_change = on_privacy_change
        self._last_privacy = ratchet.state.to_json() if ratchet else None
        self.replay = ReplayLog()
        if self.config.replay_file is not None and self.config.replay_file.exists():
            try:  # written by the host (a previous kernel of this session), read defensively anyway
                self.replay = ReplayLog.from_json(read_json(self.config.replay_file))
            except (UnsafeFileError, OSError, ValueError) as exc:
                self.log.error("ignoring the saved replay log: %s", exc)
        #: said when the first sandbox resumes an earlier kernel's checkpoint
        self.resume_reason: str | None = None
        self.isolate_network = True
        #: the live sandbox reaches the network only through ``self.proxy`` (PROXIED mode)
        self.sandbox_proxied = False
        #: the session's egress proxy (PROXIED mode), started with the first proxied sandbox
        self.proxy: EgressProxy | None = None
        #: a cell asked for a private dataset the live sandbox does not mount
        self._needs_mounts = False
        #: the private datasets the live sandbox mounts: source -> (device,
        #: inode) when it was started (see _datasets_replaced)
        self._datasets_mounted: dict[Path, tuple[int, int]] = {}
        #: the live sandbox was started public without network ("none"): no private mounts
        self._public_unmounted = False
        #: a sandbox with network is being started (no worker yet to cut)
        self._starting_network = False
        self._starting_process: SandboxProcess | None = None
        self._replace_reason: str | None = None
        self.history: list[tuple[int, str]] = []
        self.worker: WorkerHandle | None = None
        owned_dirs.collect_stale("sandbox-kernel-", tempfile.gettempdir())  # left by killed kernels
        self._runtime = owned_dirs.make("sandbox-kernel-")
        self.state_dir = self.config.state_dir or (self._runtime / "state")
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        #: the sandbox's widget comms and the policy their messages pass
        self.widgets = WidgetComms(
            modules=self.config.widget_modules,
            max_message_bytes=self.config.widget_max_message_bytes,
            rate=self.config.widget_rate,
        )
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._running: str | None = None
        #: cells accepted but not yet handed to the sandbox (waiting for the
        #: lock, a sandbox start, a restore), and those an interrupt stopped there
        self._waiting: set[object] = set()
        self._interrupted_waiting: set[object] = set()
        #: the output of recent requests by their parent's msg_id: a frame a
        #: task of an earlier cell sent names its cell (``_forward``)
        self._recent_emits: OrderedDict[str, Emit] = OrderedDict()
        #: output sent under an earlier request's parent since the last request
        #: began: charged here too (``_forward``)
        self._routed = OutputLimiter(self.config.max_output_bytes)
        #: where output sent between requests goes (``_forward_between_requests``)
        self._between: Callable[[dict[str, Any]], None] | None = None
        self._kill_reason: str | None = None
        #: the backend said its sandboxes die with this process (``_name_outliving_sandboxes``)
        self._sandboxes_die_with_us = False
        self._checkpoint_handle: asyncio.TimerHandle | None = None
        self._last_done_count = 0
        self._pending_notices: list[str] = []
        if ratchet is not None:  # a private dataset's source inside a folder the sandboxes mount
            exposed = ratchet.exposed_sources_notice()
            if exposed:
                self._pending_notices.append(f"{NOTICE} {exposed}\n")
        self._closed = False
        self._warned = False  # the isolation warning is shown once per session
        self._caps_warned = False  # so is the lack of whole-sandbox caps
        self._background: set[asyncio.Future[Any]] = set()
        #: one-off commands running with a way out, and whether it is the proxy
        self._commands: dict[SandboxProcess, bool] = {}
        #: one-off commands with a way out, decided but not started yet
        self._starting_commands = 0
        #: when the privacy poll last began, and on which loop (``cut_from_thread``)
        self._poll_began: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxy_cut_queued: EgressProxy | None = None  # by ``cut_from_thread``, once
        self._workspace_noted = False  # the home-rule note is shown once per session
        self.started_at: float | None = None
        #: tells host-side raisers waiting for the cut what this session enforces
        self._enforcement: EnforcementRecord | None = None
        self._enforcement_problem: str | None = None
        if ratchet is not None:
            try:
                ratchet.prepare()  # before any sandbox can fill the disk
            except OSError as exc:
                self.log.warning("could not make room for the ratchet's records: %s", exc)
            self._enforcement = EnforcementRecord(
                ratchet.data.store.root,
                ratchet.user_id,
                ratchet.session_id,
                workspace=Path(self.config.workspace),
                reads=reads,
            )

    # ---- public facts ----------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.sandbox.name

    @property
    def warnings(self) -> list[str]:
        return [self.sandbox.warning] if self.sandbox.warning else []

    @property
    def private(self) -> bool:
        """Once true, outputs lose external URLs and no sandbox gets network."""
        return self.ratchet is not None and self.ratchet.private

    @property
    def network_allowed(self) -> bool:
        return self.ratchet is not None and self.ratchet.network_allowed

    @property
    def proxied_mode(self) -> bool:
        """Public sandboxes get the egress proxy instead of an interface (``network="proxied"``)."""
        return self.config.network == "proxied" and self.sandbox.isolates

    @property
    def sandbox_has_network(self) -> bool:
        """The live sandbox has a way out: an interface (replaced once private)
        or an egress proxy not cut yet (cut in place once private)."""
        if self.worker is None or not self.worker.alive:
            return False
        if self.sandbox_proxied:
            return self.proxy is not None and not self.proxy.is_cut
        return not self.isolate_network

    @property
    def _launch_has_network(self) -> bool:
        """The network decision of the last launch gave the sandbox a way out
        (an interface, or the egress proxy), cut since or not."""
        return not self.isolate_network or self.sandbox_proxied

    @property
    def network_reachable(self) -> bool:
        """The live sandbox, or a command of the session (``run_command``), can
        still send: started with network, not cut since."""
        if self._starting_network or self._starting_commands:
            return True
        if self.sandbox.unstopped():  # killed, not confirmed gone: it may still send
            return True
        if self.sandbox_proxied:
            return self.sandbox_has_network or self._commands_reachable()
        worker = self.sandbox_has_network and self.worker is not None and not self.worker.process.network_cut
        return worker or self._commands_reachable()

    @property
    def network_mode(self) -> str:
        """What the live (or next) sandbox gets: "proxied", "full" or "none"."""
        if not self.network_allowed or self.config.network == "none":
            return "none"
        return "proxied" if self.proxied_mode else "full"

    def egress(self) -> dict[str, Any] | None:
        """The egress log's summary and last entries (PROXIED mode), for the widget and the tools."""
        if self.proxy is None:
            return None
        return {**self.proxy.stats(), "rules": self.proxy.policy.describe(), "recent": self.proxy.log.tail(10)}

    async def _name_outliving_sandboxes(self) -> None:
        """Before the first sandbox that can outlive this process (a Docker
        container), its holder record names it: a rise after this process's
        death then has the daemon remove it (``Sandbox.holder_facts``)."""
        if self._enforcement is None or self._enforcement.docker is not None or self._sandboxes_die_with_us:
            return
        try:
            facts = await asyncio.to_thread(self.sandbox.holder_facts)
        except (OSError, RuntimeError) as exc:
            raise SandboxUnavailable(f"could not start the {self.sandbox.name} sandbox: {exc}") from exc
        if facts is None:
            self._sandboxes_die_with_us = True  # (a backend's answer does not change: not asked again)
        else:
            self._enforcement.name_containers(facts)

    def _report_enforcement(self, state: PrivacyState | None = None) -> None:
        """Record what this session enforces now (``state``: the level the
        caller acted on, read just before; else read again)."""
        if self._enforcement is None or self.ratchet is None:
            return
        level = (state if state is not None else self.ratchet.state).sensitivity
        try:
            self._enforcement.report(level, self.network_reachable, workspace=self.ratchet.workspace)
        except OSError as exc:
            problem = str(exc)
            if problem != self._enforcement_problem:  # said once, not at every poll
                self._enforcement_problem = problem
                self.log.warning("could not report the enforced privacy level: %s", problem)
        else:
            self._enforcement_problem = None

    # ---- lifecycle -------------------------------------------------------------------
    def _visible(self, host: Path, inside: str) -> str:
        return str(host) if not self.sandbox.isolates else inside

    def _store_dirs(self) -> list[Path]:
        """The privacy store in use (hidden from sandboxes when inside a workspace)."""
        store = getattr(getattr(self.ratchet, "data", None), "store", None)
        return [Path(store.root)] if store is not None else []

    def _spec(self, withhold_mounts: bool = False) -> SandboxSpec:
        """The worker's sandbox: the session's launch (engine/launch.py) plus
        its checkpoints and the worker's code (``withhold_mounts``: without the
        private datasets, see :meth:`_holders_with_network`)."""
        extra: list[BindMount] = []
        seed = completer_seed.find()
        if self.sandbox.isolates:
            extra = [
                BindMount(self.state_dir, IN_STATE),
                BindMount(WORKER_SOURCE, f"{IN_LIB}/{WORKER_PACKAGE}", readonly=True),
            ]
            if seed is not None:
                extra.append(BindMount(seed, completer_seed.IN_COMPLETER_SEED, readonly=True))
            if self.sandbox_proxied and self.proxy is not None:
                # read-only: a cell reaches the socket and writes nothing in the
                # host's folder (a writable one was a stash beside every disk
                # cap, and Docker handed it to its container user, so a crashed
                # kernel's folder was never collected)
                extra.append(BindMount(self.proxy.socket_path.parent, IN_EGRESS, readonly=True))
            if self.config.packages_dir is not None:
                self.config.packages_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                extra.append(BindMount(self.config.packages_dir, IN_PACKAGES))
            lib_path = IN_LIB
        else:
            lib = self._runtime / "lib"
            lib.mkdir(exist_ok=True)
            link = lib / WORKER_PACKAGE
            if not link.exists():
                link.symlink_to(WORKER_SOURCE, target_is_directory=True)
            lib_path = str(lib)
        # Isolated (-I): the worker's own modules (IPython, traitlets...) are
        # imported before the workspace joins the import path, so a module a
        # cell planted there cannot stop the next sandbox from starting; cells
        # then import from their folder as in ipykernel.
        bootstrap = (
            f"import sys; sys.dont_write_bytecode = True; sys.path.insert(0, {lib_path!r}); "
            f"import {WORKER_PACKAGE}.main, {WORKER_PACKAGE}.shell; sys.path.insert(0, ''); import runpy; "
            f"runpy.run_module({WORKER_PACKAGE!r}, run_name='__main__')"
        )
        launch = self._launch(
            [sys.executable, "-I", "-u", "-c", bootstrap],
            self.isolate_network,
            extra,
            proxied=self.sandbox_proxied,
            seed=seed,
            withhold_mounts=withhold_mounts,
        )
        if launch.notes and not self._workspace_noted:
            self._workspace_noted = True
            self._pending_notices += [f"{NOTICE} {note}\n" for note in launch.notes]
        return dataclasses.replace(launch.spec, own_init=True)  # the worker's anchor (worker/main.py)

    def _launch(
        self,
        command: list[str],
        isolate_network: bool,
        extra_mounts: list[BindMount],
        proxied: bool = False,
        seed: Path | None = None,
        withhold_mounts: bool = False,
    ) -> Launch:
        state = self._visible(self.state_dir, IN_STATE)
        egress_env: dict[str, str] = {}
        seed_env: dict[str, str] = {}
        if seed is not None:  # the worker's parso cache starts from it (engine/completer_seed.py)
            seed_env[completer_seed.SEED_ENV] = self._visible(seed, completer_seed.IN_COMPLETER_SEED)
        if proxied and self.proxy is not None:
            egress_env = {
                proxy_forward.SOCKET_ENV: f"{IN_EGRESS}/{self.proxy.socket_path.name}",
                proxy_forward.TOKEN_ENV: self.proxy.token,
                proxy_forward.PORT_ENV: str(proxy_forward.DEFAULT_PORT),
                **proxy_forward.proxy_env(proxy_forward.DEFAULT_PORT),
            }
        home = self._runtime / "home"
        home.mkdir(exist_ok=True)
        try:
            return plan_launch(
                self.sandbox,
                self.config,
                command,
                isolate_network=isolate_network,
                ratchet=self.ratchet,
                # Only once private: a "none" sandbox has no interface while
                # public too, and reading a dataset there must raise the ratchet
                # (outputs, the folder's level, the tools' routing follow it).
                private_mounts=isolate_network and not proxied and not withhold_mounts and not self.network_allowed,
                store_dirs=self._store_dirs(),
                allowed_roots=self.config.allowed_roots,
                extra_mounts=extra_mounts,
                host_home=home,
                env={
                    "PYTHONDONTWRITEBYTECODE": "1",
                    "PYTHONUNBUFFERED": "1",
                    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                    "MPLCONFIGDIR": f"{state}/matplotlib",
                    "IPYTHONDIR": f"{self._visible(home, '/tmp')}/.ipython",
                    "SANDBOX_KERNEL_BACKEND": self.sandbox.name,
                    "SANDBOX_KERNEL_PACKAGES": self._packages_path(state),
                    "PIP_TARGET": self._packages_path(state),  # `!pip install` into the layer too
                    **egress_env,
                    **seed_env,
                },
            )
        except WorkspaceRefused as exc:
            raise SandboxUnavailable(f"workspace refused: {exc}") from exc

    def _packages_path(self, state: str) -> str:
        """Where the sandbox sees the package layer (``%pip install``)."""
        if self.config.packages_dir is None:
            return f"{state}/packages"
        return self._visible(self.config.packages_dir, IN_PACKAGES)

    async def run_command(
        self, command: list[str], timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> SandboxResult:
        """Run one command to completion in a fresh sandbox of this session
        (the shell tool): the same launch as the cells' sandbox, without the
        worker's checkpoints, network decided by the ratchet now."""
        await self.refresh_privacy()
        if await self._fail_closed():
            raise SandboxUnavailable(unisolated_refusal(self.sandbox.name))
        await self._name_outliving_sandboxes()
        proxied = self.network_allowed and self.proxied_mode
        isolate = not self.network_allowed or proxied or self.config.network == "none"
        # From its network decision until it runs, a command with a way out
        # counts as holding the network: a rise in that window (the workspace
        # scan of its launch can take a second) is not reported as cut, so no
        # private data is handed over before ``started`` has cut it. Measured
        # before: a connector's ``wait=True`` returned, and the command, started
        # with network, read what it handed over and sent it out.
        way_out = not isolate or proxied
        starting = way_out
        if way_out:
            self._starting_commands += 1
        live: list[SandboxProcess] = []

        def started(child: SandboxProcess) -> None:
            nonlocal starting
            live.append(child)
            if starting:
                starting = False
                self._starting_commands -= 1
                self._commands[child] = proxied
                # the level read again: one that rose since the decision cuts it now
                # (a helper killed, a container disconnected: in a task, as a
                # daemon's answer must not hold the loop)
                if self.ratchet is not None and self.ratchet.state.network_mode != NetworkMode.FULL:
                    if proxied:
                        self._cut_proxy()
                    else:
                        self._in_background(self._cut_commands())
                self._report_enforcement()

        try:
            extra: list[BindMount] = []
            if proxied:
                proxy = await self._ensure_proxy()
                extra = [
                    BindMount(proxy.socket_path.parent, IN_EGRESS, readonly=True),
                    BindMount(WORKER_SOURCE, f"{IN_LIB}/{WORKER_PACKAGE}", readonly=True),
                ]
                # a one-off command has no worker to run the forwarder: a small launcher does
                command = [sys.executable, "-I", "-c", FORWARDER_THEN_EXEC % f"{IN_LIB}/{WORKER_PACKAGE}", *command]
            withheld = await self._holders_with_network() if isolate and not proxied else None
            if withheld:
                self._pending_notices.append(self._withheld_notice(withheld))
            launch = await asyncio.to_thread(
                functools.partial(self._launch, command, isolate, extra, proxied, withhold_mounts=bool(withheld))
            )
            return await self.sandbox.run_spec(launch.spec, timeout=timeout, started=started, max_output=max_output)
        finally:
            never_ran = starting
            if never_ran:
                self._starting_commands -= 1
            ended = [child for child in live if self._commands.pop(child, None) is not None]
            if never_ran or ended:
                self._report_enforcement()

    async def _holders_with_network(self) -> str | None:
        """Before private datasets are mounted: wait until every other live
        sandbox of this session, and of the sessions sharing its folder (they
        rose with it), reports its network cut. They learn of the rise at
        their next poll; a file copied from a mount into the shared folder
        before then could still leave through them. Who still has network
        after ``HOLDERS_WAIT`` s (the mounts are then withheld), else None.

        A private session with read-only folders waits too, without datasets:
        the sessions working in those folders rise with it at their next poll
        (``WorkspaceLevels.rise_read``), and a socket one listens on there
        would take the rows its restored state holds meanwhile (a review).
        None then: there is nothing to withhold, and its notice would say
        datasets it has not."""
        if self.ratchet is None or self.network_allowed:
            return None
        if not self.ratchet.bind_mounts():
            if self.ratchet.read_folders:
                await self._wait_for_holders()
            return None
        return await self._wait_for_holders()

    async def _wait_for_holders(self) -> str | None:
        """:meth:`_holders_with_network`'s wait: who still has network after
        ``HOLDERS_WAIT`` s, else None."""
        assert self.ratchet is not None
        self._report_enforcement()  # this session's own earlier sandbox is gone
        store_root = self.ratchet.data.store.root
        level = self.ratchet.state.sensitivity
        user, session = self.ratchet.user_id, self.ratchet.session_id
        deadline = time.monotonic() + HOLDERS_WAIT
        while True:
            pending = await asyncio.to_thread(pending_holders, store_root, user, session, level)
            if not pending or time.monotonic() >= deadline:
                return ", ".join(pending[:3]) or None
            await asyncio.sleep(0.05)

    @staticmethod
    def _withheld_notice(pending: str) -> str:
        return (
            f"{NOTICE} The private datasets are not mounted in this sandbox: a sandbox sharing this session or "
            f"its folder still had network after {HOLDERS_WAIT:g} s ({pending}). Restart the kernel to try again.\n"
        )

    def _commands_reachable(self) -> bool:
        """A one-off command (the shell tool) of this session can still send."""
        for child, proxied in self._commands.items():
            if child.returncode is not None:
                continue
            if proxied and self.proxy is not None and not self.proxy.is_cut:
                return True
            if not proxied and not child.network_cut:
                return True
        return False

    async def _fail_closed(self) -> bool:
        """Once private, a backend that isolates nothing (the development
        fallback) runs nothing more: it has no network to cut, so nothing would
        keep the data in. Kills what runs; returns whether that is the case."""
        if self.sandbox.enforces_network or not self.private:
            return False
        if self.worker is not None and self.worker.alive:
            await self.worker.kill()
        for child in [c for c in self._commands if c.returncode is None]:
            await child.kill()
        return True

    async def _cut_commands(self) -> None:
        """Take the network of the session's running one-off commands away:
        theirs is the session's proxy (cut in place) or their own user-mode
        network (its helper killed); a command on the host's network, which
        cannot be taken away, is killed."""
        if await self._fail_closed():
            return
        for child, proxied in list(self._commands.items()):
            if child.returncode is not None:
                continue
            if proxied:
                self._cut_proxy()
            elif not child.network_cut:
                if not await child.cut_network():
                    await child.kill()
                    child.network_cut = True
                self.log.warning("network of a running command cut: the session became private")

    def _cut_proxy(self) -> None:
        """Cut the session's egress proxy (the live sandbox's way out and that of
        its proxied commands) once, closing what is open through it."""
        if self.proxy is not None and not self.proxy.is_cut:
            closed = self.proxy.cut()
            self.log.warning("egress proxy cut (%d connection(s) closed): the session became private", closed)

    async def _ensure_proxy(self) -> EgressProxy:
        """The session's egress proxy, started on first use (PROXIED mode)."""
        if self.proxy is None:
            # a unix socket path must stay under 108 bytes: a short private folder in /tmp
            owned_dirs.collect_stale("sk-egress-", "/tmp")
            folder = owned_dirs.make("sk-egress-", "/tmp")
            policy = self.config.egress_policy or EgressPolicy()
            # the host's own addresses (the Jupyter server listens on one) are never reached
            policy = dataclasses.replace(policy, extra_refused=(*policy.extra_refused, *local_addresses()))
            self.proxy = EgressProxy(
                folder / "proxy.sock",
                policy,
                EgressLog(self.config.egress_log),
                name_overrides=self.config.egress_name_overrides,
            )
            await self.proxy.start()
        return self.proxy

    async def start(self) -> None:
        """Start a sandbox now (the kernel calls this in the background)."""
        async with self._lock:
            await self._ensure_worker(None)

    async def _ensure_worker(self, emit: Emit | None, patience: float | None = None) -> WorkerHandle:
        """The live worker, ready for a request (``patience``: how long the
        caller grants a request abandoned earlier to end, see ``_settle``);
        a new sandbox, recovering the state, when there is none."""
        if self._closed:
            raise SandboxUnavailable("the session is shut down")
        if await self._fail_closed():
            raise SandboxUnavailable(unisolated_refusal(self.sandbox.name))
        if self.worker is not None and self.worker.alive and await self._settle(self.worker, patience):
            return self.worker
        # A session handed a replay log (agent tools resuming a notebook whose
        # process died before its first checkpoint) recovers too: its imports
        # and definitions come back even without pickled variables.
        recovering = self.worker is not None or (self.state_dir / "checkpoint.json").exists() or bool(self.replay)
        reason = self.worker.dead_reason if self.worker is not None else self.resume_reason
        self.resume_reason = None
        if self.worker is not None:
            await self.worker.kill()
            self.worker = None
        if self.sandbox.warning:
            self.log.warning(self.sandbox.warning)
        try:
            worker, msg = await self._decide_and_start(emit)
            if (
                msg.get("type") == Msg.READY
                and not self._closed
                and self._launch_has_network
                and not self.network_allowed
            ):
                # The session became private while this sandbox started with
                # network (a host-side rise finds no live sandbox to cut in that
                # window): it goes before it runs anything; one without network starts.
                await worker.kill()
                worker, msg = await self._decide_and_start(emit)
        finally:
            self._starting_network = False
            self._starting_process = None
            self._report_enforcement()
        if msg.get("type") != Msg.READY or self._closed:
            await worker.kill()
            tail = "\n".join(worker.stderr_tail)
            hint = bwrap_hint(tail) if self.sandbox.name == "bwrap" else None
            raise SandboxUnavailable(
                f"the {self.sandbox.name} sandbox failed to start: {msg.get('reason', msg)}\n{tail}\n"
                + (f"{hint}\n" if hint else "")
                + "Run `sandbox-kernel doctor` to see what is missing."
            )
        self.worker = worker
        self.widgets.clear()  # the widgets of an earlier sandbox died with it
        self.started_at = time.monotonic()
        self.log.info(
            "sandbox started (%s, python %s, %.2f s)",
            self.sandbox.name,
            msg.get("python"),
            msg.get("startup_seconds", 0),
        )
        self._report_enforcement()
        if recovering:
            await self._restore(worker, emit, reason)
        return worker

    async def _decide_and_start(self, emit: Emit | None) -> tuple[WorkerHandle, dict[str, Any]]:
        """Take the network decision for a new sandbox and start it. While a
        sandbox with network starts, the session counts as holding network
        (``_starting_network``): a rise in that window is not reported as cut."""
        await self._name_outliving_sandboxes()
        # Ratchet before data: the network decision is taken for every new sandbox.
        self.sandbox_proxied = self.network_allowed and self.proxied_mode
        self.isolate_network = not self.network_allowed or self.sandbox_proxied or self.config.network == "none"
        # From the decision on, a sandbox with network counts as holding it:
        # the proxy's start and the workspace scan come first, and a rise
        # meanwhile was reported cut (an attack review: the agent tools' engine
        # starting, data handed over, sent by a module the cell had planted)
        self._starting_network = self._launch_has_network
        self._report_enforcement()
        self._needs_mounts = False
        if self.sandbox_proxied:
            await self._ensure_proxy()
        # (a sandbox given a way out gets no private mounts to withhold; a rise
        # since its decision would have it wait for its own start's record)
        withheld = None if self._launch_has_network else await self._holders_with_network()
        if withheld:
            notice = self._withheld_notice(withheld)
            if emit is not None:
                emit("stream", {"name": "stderr", "text": notice})
            else:
                self._pending_notices.append(notice)
        # a refused workspace raises SandboxUnavailable; the workspace policy
        # scans the folder (up to 20,000 entries): off the event loop
        spec = await asyncio.to_thread(functools.partial(self._spec, withhold_mounts=bool(withheld)))
        self._datasets_mounted = _file_ids(
            m.source for m in spec.bind_mounts if m.kind == "bind" and m.target.startswith(PRIVATE_ROOT + "/")
        )
        # a public "none" sandbox: no interface, and no private mounts until private
        self._public_unmounted = (
            self.isolate_network and not self.sandbox_proxied and not withheld and self.network_allowed
        )
        worker, msg = await self._start_worker(spec)
        if msg.get("type") != Msg.READY and _transient_start_failure(worker.stderr_tail) and not self._closed:
            # The kernel's netlink set-up of a new network namespace can fail
            # while a killed sandbox's namespace is being torn down: once more.
            self.log.warning("the sandbox failed to start (%s); trying once more", " ".join(worker.stderr_tail)[-200:])
            await asyncio.sleep(START_RETRY_DELAY)
            worker, msg = await self._start_worker(spec)
        return worker, msg

    async def _start_worker(self, spec: SandboxSpec) -> tuple[WorkerHandle, dict[str, Any]]:
        """Start a sandbox and wait for its worker's first message (READY, or
        why it died)."""
        try:
            process = await self.sandbox.start(spec)
        except (OSError, RuntimeError) as exc:
            raise SandboxUnavailable(
                f"could not start the {self.sandbox.name} sandbox: {exc}. Run `sandbox-kernel doctor` to see what is missing."
            ) from exc
        worker = WorkerHandle(process, self.log)
        self._starting_process = process
        if self._closed:  # shut down while this sandbox was starting: leave nothing behind
            await worker.kill()
            raise SandboxUnavailable("the session is shut down")
        try:
            msg = await asyncio.wait_for(worker.next_message(), READY_TIMEOUT)
        except asyncio.TimeoutError:
            msg = {"type": DEAD, "reason": f"no answer within {READY_TIMEOUT:.0f} s"}
        except asyncio.CancelledError:
            # Nobody else knows of this sandbox yet: a start cancelled here (the
            # privacy watcher stopped while it replaced one, a cancelled agent
            # call) left it running until the host process ended.
            self._kill_soon(worker, "its start was cancelled")
            raise
        if msg.get("type") != Msg.READY:
            await worker.kill()  # its stderr is drained by then: the tail is whole
        return worker, msg

    async def _restore(self, worker: WorkerHandle, emit: Emit | None, reason: str | None) -> None:
        manifest: dict[str, Any] | None = None
        try:
            data = read_json(self.state_dir / "checkpoint.json")
            manifest = data if isinstance(data, dict) else None
        except FileNotFoundError:
            manifest = None
        except (UnsafeFileError, OSError, ValueError) as exc:
            self.log.error("ignoring the checkpoint manifest: %s", exc)
        path = f"{self._visible(self.state_dir, IN_STATE)}/checkpoint.bin" if manifest else None
        rid = self._new_id("r")
        worker.send(
            {
                "op": Op.RESTORE,
                "id": rid,
                "path": path,
                "imports": self.replay.imports,
                "defs": list(self.replay.defs.values()),
            }
        )
        result = await self._await_done(worker, rid, emit=None)
        dropped: dict[str, str] = {}
        if manifest:
            raw = manifest.get("dropped")
            if isinstance(raw, dict):
                dropped.update({text_of(k, 100): text_of(v, 300) for k, v in raw.items()})
        failed = result.get("failed")
        if isinstance(failed, dict):
            dropped.update({text_of(k, 100): text_of(v, 300) for k, v in failed.items()})
        cell = manifest.get("cell") if manifest else None
        cell = cell if isinstance(cell, int) and not isinstance(cell, bool) and cell > 0 else None  # sandbox-written
        lines = [f"{NOTICE} The sandbox was replaced" + (f" ({reason})" if reason else "") + "."]
        if cell:
            lines.append(
                f"State restored from the checkpoint taken after cell [{cell}]; cells run after it must be re-run."
            )
        elif manifest is not None:
            lines.append("State restored (no cell had finished before).")
        else:
            lines.append("No checkpoint existed: imports and definitions were replayed, variables were not restored.")
        if dropped:
            lines.append("Dropped: " + "; ".join(f"{k} ({v})" for k, v in sorted(dropped.items())))
        text = "\n".join(lines) + "\n"
        self.log.warning(text.strip())
        if emit is not None:
            emit("stream", {"name": "stderr", "text": text})
        else:
            self._pending_notices.append(text)

    async def shutdown(self) -> None:
        """Stop the sandbox and remove every temp dir this session made."""
        self._closed = True
        WATCHDOG.unwatch(self)
        if self._checkpoint_handle is not None:
            self._checkpoint_handle.cancel()
        if self.worker is not None:
            worker, self.worker = self.worker, None
            worker.send({"op": Op.SHUTDOWN})
            try:
                await asyncio.wait_for(worker.process.wait(), 2.0)
            except asyncio.TimeoutError:
                pass
            await worker.kill()
        if self._background:  # sandboxes being killed or cut in the background (``_in_background``)
            await asyncio.wait(list(self._background), timeout=10.0)
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy.log.close()
            await asyncio.to_thread(owned_dirs.remove_tree, self.proxy.socket_path.parent)
        await asyncio.to_thread(owned_dirs.remove_tree, self._runtime)  # (a sandbox wrote there: never raises)
        if self._enforcement is not None:
            self._enforcement.close()

    async def replace_sandbox(self, reason: str, emit: Emit | None = None) -> None:
        """Checkpoint now, drop the sandbox, start a new one from the checkpoint
        (used when the network must go)."""
        async with self._lock:
            await self._replace(reason, emit)

    async def checkpoint(self) -> None:
        """Write a checkpoint of the current state now and wait for it (before a
        sandbox is stopped on purpose, e.g. an idle agent session)."""
        async with self._lock:
            await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        if self._checkpoint_handle is not None:
            self._checkpoint_handle.cancel()
            self._checkpoint_handle = None
        if self.worker is not None and self.worker.alive and await self._settle(self.worker, CHECKPOINT_WAIT):
            rid = self._new_id("c")
            self.worker.send(
                {
                    "op": Op.CHECKPOINT,
                    "id": rid,
                    "wait": True,
                    "path": self._visible(self.state_dir, IN_STATE),
                    "cell": self._last_done_count,
                    "def_names": list(self.replay.defs),
                }
            )
            await self._await_done(self.worker, rid, emit=None, timeout=CHECKPOINT_WAIT)

    async def _replace(self, reason: str, emit: Emit | None) -> None:
        worker = self.worker
        if worker is not None and worker.alive:
            await self._checkpoint_locked()
            worker.dead_reason = reason  # the worker may have been dropped meanwhile (a cut, a death)
            await worker.kill()
        await self._ensure_worker(emit)

    async def _enforce_ratchet(
        self, emit: Emit | None, reason: str = "the session became private: its network was cut", rerun: bool = False
    ) -> None:
        """No sandbox with network may run once the session is private."""
        if await self._fail_closed():  # nothing to replace it with: say so, claim no cut
            if emit is not None:
                emit("stream", {"name": "stderr", "text": unisolated_notice(self.sandbox.name) + "\n"})
            return
        replaced = self._datasets_replaced() if self.worker is not None and self.worker.alive else []
        if replaced:
            # A bind mount holds the file it was made with: a source saved by
            # renaming a new copy over it (most programs' atomic saves) would
            # stay the old file at /private/<name> for this sandbox's life.
            # (_replace's own notice says why, and what state carried over.)
            names = ", ".join(map(str, replaced))
            await self._replace(
                f"a private dataset's source changed on the host: {names}; the new file is mounted", emit
            )
        if self._needs_mounts and self.worker is not None and self.worker.alive and not self.sandbox_has_network:
            await self._replace("to mount the private datasets", emit)
            notice = (
                f"{NOTICE} The sandbox was replaced by one with the private datasets mounted (a sandbox "
                "that had network never gets them); the state of earlier cells carried over."
            )
            notice += " Run this cell again.\n" if rerun else "\n"
            if emit is not None:
                emit("stream", {"name": "stderr", "text": notice})
            return
        if not self.sandbox_has_network:
            return  # nothing to cut, and no store read (0.3 ms of a request after a pause)
        # The level as read at most 50 ms ago: a rise by another process is
        # acted on by the poll (a fresh read) within its interval either way,
        # and its raiser's wait=True returns only after that cut.
        recent = self.ratchet.recent_state() if self.ratchet is not None else None
        if recent is None or recent.network_mode != NetworkMode.FULL:
            await self._replace(reason, emit)
            cause = self.ratchet.notice() if self.ratchet is not None else SYSTEM_NOTICE
            notice = (
                f"{cause}\nThe sandbox was replaced by one without network; the state of earlier cells carried over."
            )
            notice += " Run this cell again.\n" if rerun else "\n"
            if emit is not None:
                emit("stream", {"name": "stderr", "text": notice})
            else:
                self._pending_notices.append(notice)

    def _datasets_replaced(self) -> list[Path]:
        """The private datasets' sources the live sandbox mounts that are now
        another file (or folder) on the host: one ``stat`` each, and none
        for a sandbox that mounts no dataset. A source gone for now is not
        counted (a new sandbox could not mount it either)."""
        if not self._datasets_mounted:
            return []
        now = _file_ids(self._datasets_mounted)
        return [source for source, seen in self._datasets_mounted.items() if now.get(source, seen) != seen]

    # ---- the ratchet from outside cells (widget, host API, other processes) ---------
    async def mark_private(self, level: str, reason: str = "", source: str = "widget") -> None:
        """Raise the session's level (never lowers); cut the network now."""
        if self.ratchet is None:
            raise ValueError("this session has no private-data ratchet")
        self.ratchet.mark(level, reason, source)
        await self.refresh_privacy()

    def watch_cuts(self, interval: float) -> None:
        """Have the cut watchdog (``engine/cut_watchdog.py``) take the network
        away when this session's poll, run every ``interval`` s by the caller,
        is late: a busy loop must not keep a risen sandbox's network."""
        WATCHDOG.watch(self, interval)

    def poll_lag(self) -> float | None:
        """Seconds since the privacy poll last began (None: never yet, or shut down)."""
        began = self._poll_began
        return None if began is None or self._closed else time.monotonic() - began

    def cut_from_thread(self) -> bool:
        """From the watchdog's thread, while the loop is busy: read the level,
        and once the network is no longer allowed, take it from whatever of
        this session still has it, at once and without the loop (helpers
        killed through pidfds, containers disconnected; a sandbox whose
        network cannot be taken is killed, as the loop's cut would). The
        loop's poll then does the rest. Whether anything was cut."""
        if self.ratchet is None or self._closed:
            return False
        if self.ratchet.state.network_mode == NetworkMode.FULL:
            return False
        cut = False
        loop = self._loop
        proxy = self.proxy
        if proxy is not None and not proxy.is_cut and loop is not None and self._proxy_cut_queued is not proxy:
            # the proxy relays on the loop: nothing goes through it while the
            # loop is busy, and this runs before the loop's next reads
            self._proxy_cut_queued = proxy
            loop.call_soon_threadsafe(self._cut_proxy)
            cut = True
        # As the loop's cut: what runs on the development fallback goes
        # whatever its launch said (``_fail_closed``); else what has an
        # interface (the proxy's relays wait for the loop).
        unenforced = not self.sandbox.enforces_network
        worker, starting = self.worker, self._starting_process
        holders: list[SandboxProcess] = [p for p, proxied in list(self._commands.items()) if unenforced or not proxied]
        if worker is not None and (unenforced or not (self.isolate_network or self.sandbox_proxied)):
            holders.append(worker.process)
        if starting is not None and (unenforced or (self._starting_network and not self.sandbox_proxied)):
            holders.append(starting)
        for process in holders:
            if process.returncode is not None or process.network_cut or process.cut_now:
                continue
            if unenforced or not process.cut_network_now():
                process.kill_now()  # the host's network, or no sandbox at all: only its end takes the way out
            cut = True
        return cut

    async def refresh_privacy(self) -> bool:
        """Re-read the store (another process may have raised it); act on a rise.
        Returns whether the state changed."""
        self._poll_began = time.monotonic()
        self._loop = asyncio.get_running_loop()
        if self.ratchet is None:
            return False
        # One read of every store per poll (four a second): each check below
        # acts on it, and the next poll sees what rose meanwhile.
        state = self.ratchet.state
        allowed = state.network_mode == NetworkMode.FULL
        changed = self._notify_privacy_change(state)
        if not allowed and self._commands_reachable():
            await self._cut_commands()
        if self._starting_network and not allowed:
            # A sandbox with network is starting (no worker to cut yet): its
            # way out goes now, and the sandbox is replaced once it is up.
            if self.sandbox_proxied:
                if self.proxy is not None:  # (not made yet: cut at the next poll, once it is)
                    self._cut_proxy()
                    self._starting_network = False
            elif self._starting_process is not None and await self._starting_process.cut_network():
                self._starting_network = False
            self._report_enforcement(state)
        if self.sandbox_has_network and not allowed:
            # Cut first, carry state afterwards: the network goes within the
            # poll interval, however busy or uncooperative the sandbox is.
            proxied = self.sandbox_proxied
            await self.cut_network()
            self._report_enforcement(state)
            if proxied:
                # cut in place: the sandbox, its cell and every object in it go on
                self._pending_notices.append(
                    f"{self.ratchet.notice()}\nThe egress proxy was cut in place; the sandbox and its state are unchanged.\n"
                )
            elif self._running is not None and self.worker is not None:
                if self._kill_reason is None:  # the cell's own rise may have stopped it already
                    self._kill_reason = (
                        "the session became private while this cell ran with network, so the cell was stopped"
                    )
                    self._replace_reason = "the session became private"
                    self._kill_cell(self.worker)
            elif not self._lock.locked():
                async with self._lock:
                    await self._enforce_ratchet(None)
        self._report_enforcement(state)
        return changed

    async def cut_network(self) -> bool:
        """Take the network of the live sandbox away now (no-op without one)."""
        if await self._fail_closed():
            return True
        if self.sandbox_proxied and self.proxy is not None:
            self._cut_proxy()
            return True
        if self.worker is None or not self.worker.alive or self.isolate_network:
            return False
        if self.worker.process.network_cut:
            return True
        cut = await self.worker.process.cut_network()
        if not cut and (self.config.network == "host" or self.worker.process.cut_refused):
            # The host's own network cannot be taken away, and a Docker daemon
            # may refuse a disconnect: the sandbox goes (fail closed). Its state
            # then comes back from the last checkpoint and the replay log.
            self.worker.dead_reason = (
                "the session became private while the sandbox shared the host network"
                if self.config.network == "host"
                else "the session became private and the sandbox's network could not be cut, so the sandbox was stopped"
            )
            await self.worker.kill()
            cut = True
        if cut:
            self.log.warning("network of the sandbox cut: the session became private")
        return cut

    def _notify_privacy_change(self, state: PrivacyState | None = None) -> bool:
        """Tell the listener (the widget) when the stored state moved; return
        whether it did (``state``: just read by the caller; else read now)."""
        assert self.ratchet is not None
        if state is None:
            state = self.ratchet.state
        current = state.to_json()
        changed = current != self._last_privacy
        self._last_privacy = current
        if changed and self.on_privacy_change is not None:
            allowed = state.network_mode == NetworkMode.FULL
            self.on_privacy_change(self.ratchet.notice(state) if not allowed else None)
        return changed

    # ---- requests --------------------------------------------------------------------
    async def execute(
        self,
        code: str,
        *,
        execution_count: int,
        emit: Emit,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        ask_input: AskInput | None = None,
        timeout: float | None = None,
        parent_id: str = "",
    ) -> ExecuteResult:
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, not {type(code).__name__}")
        with self._waiting_for_sandbox() as ticket:
            async with self._lock:
                limiter = OutputLimiter(self.config.max_output_bytes)
                guarded = self._guarded_emit(emit, limiter)
                try:
                    worker = await self._ensure_worker(guarded, timeout)
                except SandboxUnavailable as exc:
                    guarded("error", {"ename": "SandboxUnavailable", "evalue": str(exc), "traceback": [str(exc)]})
                    return ExecuteResult("error", execution_count, "SandboxUnavailable", str(exc), [str(exc)])
                await self._enforce_ratchet(guarded)
                worker = self.worker or worker
                self._note_checkpoint_failure()
                for text in self._pending_notices:
                    guarded("stream", {"name": "stderr", "text": text})
                self._pending_notices.clear()
                if self.warnings and not self._warned:
                    self._warned = True
                    guarded("stream", {"name": "stderr", "text": f"{NOTICE} WARNING: {self.warnings[0]}\n"})
                problem = worker.process.cgroup_problem
                if problem and not self._caps_warned:
                    self._caps_warned = True  # never silently: the caps are per process only
                    guarded(
                        "stream",
                        {
                            "name": "stderr",
                            "text": (
                                f"{NOTICE} WARNING: no whole-sandbox memory/process caps ({problem}); "
                                "limits apply per process only.\n"
                            ),
                        },
                    )
                request = {
                    "op": Op.EXECUTE,
                    "code": code,
                    "silent": silent,
                    "store_history": store_history,
                    "user_expressions": user_expressions or {},
                    "allow_stdin": allow_stdin and ask_input is not None,
                    "execution_count": execution_count,
                    "parent_id": parent_id,
                }
                # from here on (no await before the request is sent) an interrupt reaches the cell itself
                self._waiting.discard(ticket)
                if ticket in self._interrupted_waiting:
                    return self._stopped_before_start(guarded, execution_count)
                done, hits = await self._run_request(worker, request, emit, guarded, limiter, ask_input, timeout)
                result = self._result(done, execution_count)
                if result.status == "died":
                    evalue = await self._after_death(done, hits, guarded, "The cell's")
                    guarded("error", {"ename": "CellDied", "evalue": evalue, "traceback": [f"CellDied: {evalue}"]})
                    result.ename, result.evalue, result.traceback = "CellDied", evalue, [f"CellDied: {evalue}"]
                else:
                    if store_history:
                        if self.replay.record(code):
                            self._save_replay()  # only when it changed: a save is linear in the log
                        self.history.append((execution_count, code))
                    self._last_done_count = execution_count
                    self._schedule_checkpoint()
                return result

    @contextmanager
    def _waiting_for_sandbox(self) -> Iterator[object]:
        """A ticket for a cell from its arrival until it is handed to the
        sandbox; an interrupt meanwhile stops it there (``interrupt``)."""
        ticket = object()
        self._waiting.add(ticket)
        try:
            yield ticket
        finally:
            self._waiting.discard(ticket)
            self._interrupted_waiting.discard(ticket)

    @staticmethod
    def _stopped_before_start(guarded: Emit, execution_count: int) -> ExecuteResult:
        """The reply of a cell interrupted before it reached the sandbox."""
        line = "KeyboardInterrupt: interrupted before the cell started; none of it ran"
        guarded("error", {"ename": "KeyboardInterrupt", "evalue": "", "traceback": [line]})
        return ExecuteResult("error", execution_count, "KeyboardInterrupt", "", [line])

    async def _run_request(
        self,
        worker: WorkerHandle,
        request: dict[str, Any],
        emit: Emit,
        guarded: Emit,
        limiter: OutputLimiter,
        ask_input: AskInput | None,
        timeout: float | None,
    ) -> tuple[dict[str, Any], list[str]]:
        """Run one request of user code (a cell, a widget message) to its end:
        its DONE, and the whole-sandbox caps it reached (each said in its output)."""
        caps_mark = worker.process.caps_mark()
        rid = self._new_id("x")
        self._running = rid
        self._kill_reason = None
        self._replace_reason = None
        # the worker stops sending a little after the host's budget: the host
        # still counts and notes the cut, but a flood never crosses the pipe
        budget = self.config.max_output_bytes + self.config.max_output_bytes // 10 + (1 << 20)
        worker.stop_forwarding()  # output from here on is this request's
        silent = bool(request.get("silent"))
        parent_id = request.get("parent_id")
        self._routed = OutputLimiter(self.config.max_output_bytes)
        if isinstance(parent_id, str) and parent_id and not silent:
            self._recent_emits[parent_id] = guarded
            self._recent_emits.move_to_end(parent_id)
            while len(self._recent_emits) > RECENT_PARENTS:
                self._recent_emits.popitem(last=False)
        worker.send({**request, "id": rid, "max_output_bytes": budget})
        try:
            try:
                done = await self._await_done(worker, rid, guarded, ask_input=ask_input, timeout=timeout)
            except asyncio.CancelledError:
                await self._end_abandoned(worker, rid)
                raise
        finally:
            self._running = None
            if not silent:  # a silent request's output is nobody's: the last one's goes on
                self._between = self._forward_between_requests(emit, guarded, limiter)
            if self._between is not None:
                worker.forward_between(self._between)
        dropped = done.get("dropped_output")
        if isinstance(dropped, int) and dropped > 0:
            # what the worker did not even send (at most what a frame can say)
            limiter.discarded += min(dropped, MAX_DROPPED_SAID)
        note = limiter.truncation_note()
        if note:
            emit("stream", {"name": "stderr", "text": f"\n{note}\n"})
        hits = worker.process.caps_hit(caps_mark)
        for hit in hits:
            guarded("stream", {"name": "stderr", "text": f"{NOTICE} {hit[0].upper()}{hit[1:]}.\n"})
        return done, hits

    async def _end_abandoned(self, worker: WorkerHandle, rid: str) -> None:
        """The caller stopped waiting for a request (an agent's tool call
        cancelled by its MCP client): the request is interrupted, as by the
        stop button, and its end awaited, with the session's lock still held.
        Left running, it answered the next request with its own output, that
        one hung until its timeout, and the sandbox was replaced, losing the
        state without a checkpoint. Its output goes nowhere. Cancelled again
        meanwhile (a server shutting down cancels until its tasks leave), it
        waits no more: the sandbox is killed, and the next request starts
        another."""
        self.interrupt()
        wait_at_most = self.config.interrupt_grace + 2.0  # then killed, as a timeout is
        ending = asyncio.ensure_future(self._await_done(worker, rid, None, timeout=wait_at_most))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            ending.cancel()
            self._kill_soon(worker, "its request was abandoned and it did not stop in time")
            raise
        except Exception:
            pass
        if not ending.cancelled() and ending.exception() is not None:
            # the next request finds the sandbox as it is (a dead one is replaced then)
            self.log.error("waiting for an abandoned request to end failed: %r", ending.exception())

    def _kill_soon(self, worker: WorkerHandle, reason: str) -> None:
        """Kill a sandbox from a caller being cancelled, which cannot wait for
        it: in the background (``shutdown`` waits for it)."""
        worker.dead_reason = worker.dead_reason or reason
        self._in_background(worker.kill())

    def _in_background(self, work: Awaitable[Any]) -> None:
        """Run ``work`` as a task the session holds (asyncio keeps only a weak
        reference to tasks) and ``shutdown`` waits for."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _kill_cell(self, worker: WorkerHandle) -> None:
        """Have the worker kill the running request's process; if it does not
        answer within ``KILLED_CELL_WAIT`` s, the sandbox goes (its state comes
        back from the last checkpoint and the replay log). A worker may never
        answer: a cell can stop its holder (SIGSTOP), and a process killed in
        the middle of writing a frame leaves the host waiting for the rest of
        it (a rise stopped a cell that wrote 64 MB frames: it hung for good)."""
        rid = self._running
        worker.send({"op": Op.KILL})
        loop = asyncio.get_running_loop()

        def last_resort(due: float) -> None:
            if self._running != rid or self.worker is not worker or not worker.alive:
                return
            now = time.monotonic()
            if now - due > 1.0 or not worker.messages.empty():
                # the host is behind (its loop was busy; the answer may wait
                # in the queue behind outputs still to clean), not the worker.
                # Frames that keep coming do not count: a cell that stopped
                # its holder may print on for ever.
                loop.call_later(KILLED_CELL_WAIT, last_resort, now + KILLED_CELL_WAIT)
                return
            self._kill_soon(worker, "the sandbox did not answer after the cell was killed")

        loop.call_later(KILLED_CELL_WAIT, last_resort, time.monotonic() + KILLED_CELL_WAIT)

    async def _after_death(self, done: dict[str, Any], hits: list[str], guarded: Emit, whose: str) -> str:
        """Why a request's process died (for its error), after the sandbox the
        ratchet asked for, or a new one if the whole sandbox went, is in place."""
        text = (
            self._kill_reason or (hits[0] if hits else None) or text_of(done.get("reason") or "the cell's process died")
        )
        threads = done.get("threads_lost")
        if isinstance(threads, str) and threads:
            # the request ran beside them (they live in its process): users of
            # an executor or a pool must know it is gone
            text += f"; the threads earlier cells started ended with it ({threads[:600]})"
        if self._replace_reason is not None:
            await self._enforce_ratchet(guarded, self._replace_reason, rerun=True)
            self._notify_privacy_change()
        elif done.get("type") == DEAD:
            await self._ensure_worker(guarded)
        return f"{text}. {whose} changes were discarded; the state from earlier cells is intact."

    async def comm(
        self,
        msg_type: str,
        content: dict[str, Any],
        *,
        emit: Emit,
        metadata: dict[str, Any] | None = None,
        buffers: list[bytes] | None = None,
        parent_id: str = "",
        timeout: float | None = None,
    ) -> CommResult:
        """Hand a frontend's widget message to the sandbox: its handlers run
        like a cell (outputs, the ratchet, interrupt and the output budget
        alike) and what they change is kept."""
        async with self._lock:
            limiter = OutputLimiter(self.config.max_output_bytes)
            guarded = self._guarded_emit(emit, limiter)
            try:
                worker = await self._ensure_worker(guarded, timeout)
            except SandboxUnavailable as exc:
                self.log.warning("widget message not delivered: %s", exc)
                return CommResult("error")
            await self._enforce_ratchet(guarded)
            worker = self.worker or worker
            try:
                self.widgets.from_frontend(msg_type, content)  # after any new sandbox cleared the old comms
            except WidgetRefused as exc:
                self.log.warning("%s refused: %s", msg_type, exc)
                return CommResult("error")
            request = {
                "op": Op.COMM,
                "msg_type": msg_type,
                "content": content,
                "metadata": metadata or {},
                "buffers": [base64.b64encode(b).decode("ascii") for b in buffers or []],
                "parent_id": parent_id,
            }
            done, hits = await self._run_request(worker, request, emit, guarded, limiter, None, timeout)
            status = text_of(done.get("status"))
            if status == "died":
                text = await self._after_death(done, hits, guarded, "The widget callback's")
                guarded("stream", {"name": "stderr", "text": f"{NOTICE} {text}\n"})
                return CommResult("died")
            self._schedule_checkpoint()
            return CommResult("ok" if status == "ok" else "error", exit_requested=done.get("exit_now") is True)

    def _note_checkpoint_failure(self) -> None:
        """A background checkpoint that could not be written (a full or
        read-only disk) is said before the next cell, with what a lost
        sandbox would come back to."""
        marker = self.state_dir / CHECKPOINT_FAILED_MARKER
        try:
            why = read_bytes(marker, 4096).decode("utf-8", "replace").strip() or "the disk is full"
        except FileNotFoundError:
            return
        except (UnsafeFileError, OSError) as exc:
            why = str(exc)
        try:
            marker.unlink()
        except OSError:
            pass
        try:
            data = read_json(self.state_dir / "checkpoint.json")
            cell = data.get("cell") if isinstance(data, dict) else None
        except (UnsafeFileError, OSError, ValueError):
            cell = None
        since = f"cell [{cell}]" if isinstance(cell, int) and cell > 0 else "the start (no checkpoint was written)"
        text = (
            f"{NOTICE} WARNING: the state could not be checkpointed ({plain_line(why)}): if the sandbox is lost, "
            f"the variables come back as they were after {since}. Free space in {self.state_dir}.\n"
        )
        self.log.warning(text.strip())
        self._pending_notices.append(text)

    def _save_replay(self) -> None:
        """Keep the replay log beside the checkpoints (atomically), for a resume."""
        target = self.config.replay_file
        if target is None:
            return
        try:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.replay.to_json()))
            os.replace(tmp, target)
        except OSError as exc:
            self.log.warning("could not save the replay log: %s", exc)

    async def complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        completer_seed.build_in_background()  # for the next sandboxes, when this installation has none
        return await self._query({"op": Op.COMPLETE, "code": code, "cursor_pos": cursor_pos})

    async def inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> dict[str, Any]:
        return await self._query(
            {"op": Op.INSPECT, "code": code, "cursor_pos": cursor_pos, "detail_level": detail_level}
        )

    async def _query(self, msg: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            worker = await self._ensure_worker(None, QUERY_WAIT)
            rid = self._new_id("q")
            worker.send({**msg, "id": rid})
            done = await self._await_done(worker, rid, emit=None, timeout=QUERY_WAIT)
            done.pop("type", None)
            done.pop("id", None)
            return done

    def interrupt(self) -> None:
        """Forward SIGINT to the running cell; kill it if it ignores that.

        A cell still waiting for its sandbox (being started, restored after a
        crash, busy with a checkpoint) is stopped there and never runs: the
        user pressed stop while it showed as running, and an interrupt that
        was dropped let it run on (a loop with no end needed a second press).
        """
        rid = self._running
        if rid is None or self.worker is None:
            self._interrupted_waiting.update(self._waiting)
            return
        self.worker.send({"op": Op.INTERRUPT})
        loop = asyncio.get_running_loop()

        def escalate() -> None:
            worker = self.worker
            if self._running == rid and worker is not None:
                self._kill_reason = (
                    f"the cell did not stop within {self.config.interrupt_grace:g} s of the interrupt and was killed"
                )
                # (a cell that stopped its holder hung the interrupt for good before the last resort)
                self._kill_cell(worker)

        loop.call_later(self.config.interrupt_grace, escalate)

    # ---- internals --------------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        """A request's id, which the sandbox cannot guess before it is sent:
        a cell can write frames of its own, and a DONE it queued for the next
        ids ended later cells before they ran (their history, replay log and
        checkpoint skipped)."""
        return f"{kind}{next(self._ids)}-{secrets.token_hex(6)}"

    async def _await_done(
        self,
        worker: WorkerHandle,
        rid: str,
        emit: Emit | None,
        ask_input: AskInput | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return await self._wait_done(worker, rid, emit, ask_input, timeout, deadline)
        except asyncio.CancelledError:
            if worker.abandoned is None:
                worker.abandoned = (rid, deadline)
            raise

    async def _settle(self, worker: WorkerHandle, patience: float | None) -> bool:
        """Wait for the end of a request whose caller was cancelled before
        sending the next: the worker takes one request at a time and drops one
        sent meanwhile, which then waited for ever (a cell after a cancelled
        completion) or for its whole timeout (the registry's close after a
        cancelled replacement: two minutes). The request gets the time its own
        caller would have given it, at most ``patience`` (None: no bound);
        then the sandbox is killed, and the next request starts another from
        the checkpoint. Its output goes nowhere; a prompt gets end-of-file.
        Returns whether the worker is alive for the next request."""
        limit = None if patience is None else time.monotonic() + patience
        while worker.abandoned is not None and worker.alive:
            rid, deadline = worker.abandoned
            ends = [t for t in (deadline, limit) if t is not None]
            wait = max(0.0, min(ends) - time.monotonic()) if ends else None
            try:
                msg = await asyncio.wait_for(worker.next_message(), wait)
            except asyncio.TimeoutError:
                worker.dead_reason = "a request whose caller stopped waiting for it did not end in time"
                await worker.kill()
                break
            kind = msg.get("type")
            if kind in (Msg.DONE, Msg.REPLY) and msg.get("id") == rid:
                worker.abandoned = None
            elif kind == Msg.INPUT_REQUEST:
                _reply_input(worker, msg, EOF)
            elif kind == Msg.RATCHET:
                self._on_ratchet_request(worker, msg)
        return worker.alive

    async def _wait_done(
        self,
        worker: WorkerHandle,
        rid: str,
        emit: Emit | None,
        ask_input: AskInput | None,
        timeout: float | None,
        deadline: float | None,
    ) -> dict[str, Any]:
        killed_at: float | None = None
        prompt: asyncio.Future[None] | None = None
        while True:
            wait = None
            if killed_at is not None:
                wait = max(0.0, killed_at + KILLED_CELL_WAIT - time.monotonic())
            elif deadline is not None:
                wait = max(0.0, deadline - time.monotonic())
            try:
                msg = await asyncio.wait_for(worker.next_message(), wait)
            except asyncio.TimeoutError:
                if killed_at is None:
                    self._kill_reason = f"the cell timed out after {timeout:g} s and was killed"
                    worker.send({"op": Op.KILL})
                    killed_at = time.monotonic()
                    continue
                worker.dead_reason = "the sandbox did not answer after the cell was killed"
                await worker.kill()
                return {"type": DEAD, "status": "died", "reason": worker.dead_reason}
            kind = msg.get("type")
            if kind == DEAD or (kind in (Msg.DONE, Msg.REPLY) and msg.get("id") == rid):
                if prompt is not None and not prompt.done():
                    prompt.cancel()  # the cell ended (interrupted, died): its prompt is over
                if kind == DEAD:
                    return {"type": DEAD, "status": "died", "reason": f"the sandbox died: {msg.get('reason')}"}
                if worker.abandoned is not None and worker.abandoned[0] == rid:
                    worker.abandoned = None  # ended after all (``_end_abandoned``)
                return msg
            if kind == Msg.RATCHET and self._running == rid:
                notice = self._on_ratchet_request(worker, msg)
                if notice and emit is not None:
                    emit("stream", {"name": "stderr", "text": notice})
                continue
            if kind == Msg.INPUT_REQUEST and emit is not None:
                # The prompt is answered in the background while the worker is
                # still listened to: an interrupt (the cell ends with
                # KeyboardInterrupt) or a death must not wait for a reply that
                # may never come.
                if prompt is not None:
                    prompt.cancel()
                prompt = asyncio.ensure_future(self._answer_input(worker, rid, msg, ask_input))
                continue
            if emit is not None and self._running is not None:
                try:
                    self._forward(msg, emit)
                except Exception:  # one output the frontend could not be sent must not end the wait for the cell
                    self.log.exception("forwarding a %s from the sandbox failed", kind)

    async def _answer_input(
        self, worker: WorkerHandle, rid: str, msg: dict[str, Any], ask_input: AskInput | None
    ) -> None:
        value = EOF  # when nobody can answer
        if ask_input is not None:
            try:
                value = await ask_input(text_of(msg.get("prompt", "")), bool(msg.get("password")))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the frontend went away
                self.log.warning("input request failed: %s", exc)
        if self._running == rid and worker.alive:
            _reply_input(worker, msg, value)

    def _on_ratchet_request(self, worker: WorkerHandle, msg: dict[str, Any]) -> str | None:
        """Answer a cell's ratchet request; the notice to show in its output, if any."""
        if self.ratchet is None:
            worker.send({"op": Op.RATCHET_REPLY, "ok": False, "error": "this session has no private-data ratchet"})
            return None
        reply = self.ratchet.handle_request(msg)
        warning = reply.pop("warning", None)
        notice = f"{NOTICE} WARNING: {plain_line(str(warning))}\n" if warning else None
        if reply.get("ok") and self.sandbox_proxied and not self.network_allowed and self.proxy is not None:
            # Ratchet before data, in place: nothing leaves from now on, and
            # the cell goes on with every object it holds.
            if not self.proxy.is_cut:
                closed = self.proxy.cut()
                self.log.warning("egress proxy cut by a cell: private data entered the session")
                notice = (notice or "") + (
                    f"{self.ratchet.notice()}\nThe egress proxy was cut in place ({closed} open connection(s) "
                    "closed): this cell goes on, and every variable, open file and thread is still there.\n"
                )
            self._report_enforcement()
        if reply.get("ok") and msg.get("kind") == "mount" and (self.sandbox_proxied or self._public_unmounted):
            # The proxied sandbox, or a public "none" one, never had the private
            # mounts: a new one gets them (bwrap cannot add mounts to a running sandbox).
            self._kill_reason = (
                f"the private dataset {text_of(msg.get('name'), 100)!r} is mounted only in a sandbox that never had "
                "network, so a new one was started"
            )
            self._replace_reason = "to mount the private datasets"
            self._needs_mounts = True
            self._kill_cell(worker)
        elif reply.get("ok") and not self.isolate_network and not self.network_allowed:
            # Ratchet before data: the cell stops right here, before it can use
            # what it just declared while the sandbox still has network.
            self._kill_reason = (
                "this cell made the session private while its sandbox had network, so it was stopped at that point"
                if self.sandbox.enforces_network
                # the subprocess fallback: no sandbox, and no network that could be cut
                else "this cell made the session private, and this kernel is NOT sandboxed: its network cannot be "
                "cut, so the cell was stopped at that point and no more code runs in this session"
            )
            self._replace_reason = "private data entered the session"
            self._in_background(self.cut_network())  # daemonised children lose it too
            self._kill_cell(worker)
        else:
            worker.send({"op": Op.RATCHET_REPLY, **reply})
        if reply.get("ok"):
            self._notify_privacy_change()
        return notice

    def _forward_between_requests(
        self, emit: Emit, guarded: Emit, limiter: OutputLimiter
    ) -> Callable[[dict[str, Any]], None]:
        """Where what threads and tasks of cells (and processes they started)
        print or display, and the widgets they update, goes between requests:
        published at once under the last request's parent, as ipykernel does
        with output from threads (a progress bar a thread moves, a log a
        server thread writes). It shares that request's output budget; once
        the budget is spent, the rest is dropped until the next request, and
        said once. Not a silent request's (extensions send them between
        cells): its emit drops everything, and under ipykernel what goes
        under a silent request's parent shows in no cell."""
        noted = limiter.truncated

        def forward(msg: dict[str, Any]) -> None:
            nonlocal noted
            self._forward(msg, guarded)
            if not noted and limiter.truncated:
                noted = True
                emit(
                    "stream",
                    {
                        "name": "stderr",
                        "text": f"\n{NOTICE} output sent after the cell ended is over the cell's budget "
                        f"({format_bytes(limiter.max_bytes)}, set SandboxKernel.max_output_bytes): the rest "
                        "is dropped until the next cell runs.\n",
                    },
                )

        return forward

    def _forward(self, msg: dict[str, Any], emit: Emit) -> None:
        """Publish an output frame through ``emit``, or through the emit of
        the earlier request the frame names: an asyncio task prints under the
        cell that created it, as in ipykernel. Only this session's recent
        requests can be named (what any other name says is ignored), and each
        keeps its own output budget. What goes to another request's output is
        charged to one more budget, shared by all of them until the next
        request begins: any cell can name any of the 32 recent parents, and
        one cell spent all their budgets (330 MB by default; an attack review)."""
        parent = msg.get("parent")
        if isinstance(parent, str) and parent:
            routed = self._recent_emits.get(parent)
            if routed is not None and routed is not emit:
                if not self._routed.admit_size(json_size(msg)):
                    return
                emit = routed
        kind = msg.get("type")
        if kind == Msg.STREAM:
            name, text = msg.get("name"), msg.get("text")
            if name in ("stdout", "stderr") and isinstance(text, str):
                emit("stream", {"name": name, "text": text})
        elif kind in (Msg.DISPLAY_DATA, Msg.UPDATE_DISPLAY_DATA, Msg.EXECUTE_RESULT):
            transient = msg.get("transient")
            display_id = transient.get("display_id") if isinstance(transient, dict) else None
            content: dict[str, Any] = {"data": msg.get("data"), "metadata": msg.get("metadata")}
            if kind == Msg.EXECUTE_RESULT:
                count = msg.get("execution_count")
                content["execution_count"] = count if isinstance(count, int) else None
            else:
                content["transient"] = {"display_id": display_id} if isinstance(display_id, str) else {}
            emit(kind, content)
        elif kind == Msg.ERROR:
            tb = msg.get("traceback")
            emit(
                "error",
                {
                    "ename": text_of(msg.get("ename", "Error"), 200),
                    "evalue": text_of(msg.get("evalue", ""), 100000),
                    "traceback": [text_of(line) for line in tb[:1000]] if isinstance(tb, list) else [],
                },
            )
        elif kind == Msg.CLEAR_OUTPUT:
            emit("clear_output", {"wait": bool(msg.get("wait"))})
        elif kind == Msg.COMM:
            emit(Msg.COMM, msg)  # checked by the guard (outputs/widgets.py)

    def _guarded_emit(self, emit: Emit, limiter: OutputLimiter) -> Emit:
        """Enforce the per-cell output budget, then sanitise what will be sent.

        The budget is counted on the raw bundle BEFORE any cleaning: once a
        cell's budget is spent, further outputs cost the host a size count and
        nothing else (10,000 large HTML outputs used to keep the kernel busy
        sanitising for minutes). Once the session is private, stream and error
        text are defanged (frontends turn URLs in text into links)."""
        notes: set[str] = set()

        def guarded(kind: str, content: dict[str, Any]) -> None:
            private = self.private
            if kind == Msg.STREAM:
                text = limiter.admit_text(content["text"])
                if text:
                    emit(kind, {**content, "text": defang_text(text) if private else text})
                return
            if kind == Msg.COMM:
                self._emit_comm(content, emit, limiter, notes, private)
                return
            if kind in (Msg.DISPLAY_DATA, Msg.UPDATE_DISPLAY_DATA, Msg.EXECUTE_RESULT):
                data = content.get("data")
                # what goes beside the data is charged too: metadata and a
                # display id of a MB each went out uncounted, 300 MB per cell
                beside = json_size(content.get("metadata")) + json_size(content.get("transient"))
                if isinstance(data, Mapping) and not limiter.admit_size(bundle_size(data) + beside):
                    return  # over budget: dropped uncleaned, counted for the truncation note
                view = None
                if isinstance(data, Mapping) and WIDGET_VIEW_MIME in data:
                    # a view of one of this session's widgets: the model was checked when it opened
                    try:
                        view = self.widgets.view(data[WIDGET_VIEW_MIME], private=private)
                    except WidgetRefused as exc:
                        _note_once(notes, f"a widget view was dropped: {exc}", emit, private)
                    else:
                        if view is None:
                            _note_once(
                                notes, "a widget view was dropped: it names no widget of this session", emit, private
                            )
                    data = {k: v for k, v in data.items() if k != WIDGET_VIEW_MIME}
                clean = sanitize_bundle(  # a non-mapping is named in clean.removed, never trusted
                    data,  # type: ignore[arg-type]
                    content.get("metadata"),
                    trusted=self.config.trust_outputs,
                    private=private,
                )
                if view is not None:
                    clean.data[WIDGET_VIEW_MIME] = view
                for note in clean.removed:
                    _note_once(notes, note, emit, private)
                if not clean.data or (not isinstance(data, Mapping) and not limiter.admit_bundle(clean.data)):
                    return
                emit(kind, {**content, "data": clean.data, "metadata": clean.metadata})
                return
            if kind == Msg.ERROR:
                traceback = content.get("traceback")
                lines = traceback if isinstance(traceback, list) else [traceback]
                parts = [content.get("ename"), content.get("evalue"), *lines]
                if limiter.admit_bundle({"text/plain": "\n".join(str(part) for part in parts)}):
                    if private:
                        content = {
                            **content,
                            # (a class name is any string: type('https://…', (Exception,), {}))
                            "ename": defang_text(text_of(content.get("ename", ""))),
                            "evalue": defang_text(content.get("evalue", "")),
                            "traceback": [defang_text(line) for line in content.get("traceback", [])],
                        }
                    emit(kind, content)
                return
            if kind == Msg.CLEAR_OUTPUT and not limiter.admit_size(MESSAGE_COST):
                return  # a message with no data costs the host and the client all the same
            emit(kind, content)

        return guarded

    def _emit_comm(
        self, msg: dict[str, Any], emit: Emit, limiter: OutputLimiter, notes: set[str], private: bool
    ) -> None:
        """A widget comm message from the sandbox: charged to the request's
        output budget, checked by the widget policy, then published."""
        raw = msg.get("buffers", [])
        buffers: list[bytes] = []
        problem = None
        try:
            if not isinstance(raw, list):
                raise TypeError
            buffers = [base64.b64decode(b, validate=True) for b in raw]
        except (TypeError, ValueError):
            problem = "buffers must be a list of base64 strings"
        if not limiter.admit_size(message_size(msg.get("content"), buffers)):
            return
        try:
            if problem:
                raise WidgetRefused(problem)
            clean = self.widgets.from_sandbox(msg, buffers, private=private)
        except WidgetRefused as exc:
            self.log.warning("widget message from the sandbox dropped: %s", exc)
            _note_once(notes, f"a widget message was dropped: {exc}", emit, private)
            return
        for note in clean.notes:
            _note_once(notes, note, emit, private)
        emit(clean.msg_type, {"content": clean.content, "metadata": clean.metadata, "buffers": clean.buffers})

    @staticmethod
    def _result(done: dict[str, Any], execution_count: int) -> ExecuteResult:
        status = done.get("status")
        if status not in ("ok", "error", "died"):
            status = "error"
        tb = done.get("traceback")
        payload = done.get("payload")
        expressions = done.get("user_expressions")
        return ExecuteResult(
            status=status,
            execution_count=execution_count,
            ename=text_of(done.get("ename", "")),
            evalue=text_of(done.get("evalue", "")),
            traceback=[text_of(x) for x in tb] if isinstance(tb, list) else [],
            user_expressions=expressions if isinstance(expressions, dict) else {},
            payload=[p for p in payload if isinstance(p, dict)] if isinstance(payload, list) else [],
            exit_requested=done.get("exit_now") is True,
        )

    def _schedule_checkpoint(self) -> None:
        if self._checkpoint_handle is not None:
            self._checkpoint_handle.cancel()
        loop = asyncio.get_running_loop()
        self._checkpoint_handle = loop.call_later(self.config.checkpoint_delay, self._checkpoint_now)

    def _checkpoint_now(self) -> None:
        self._checkpoint_handle = None
        if self._lock.locked():
            self._schedule_checkpoint()
            return
        if self.worker is not None and self.worker.alive:
            self.worker.send(
                {
                    "op": Op.CHECKPOINT,
                    "path": self._visible(self.state_dir, IN_STATE),
                    "cell": self._last_done_count,
                    "def_names": list(self.replay.defs),
                }
            )


def _reply_input(worker: WorkerHandle, request: dict[str, Any], value: str) -> None:
    """Answer the worker's input request (naming which, when it said)."""
    req = request.get("req")
    worker.send({"op": Op.INPUT_REPLY, "value": value, **({"req": req} if isinstance(req, int) else {})})


def _note_once(notes: set[str], note: str, emit: Emit, private: bool = False) -> None:
    """Tell the user once per request what the output policy removed. A note
    may quote what the sandbox named (a MIME type, a metadata key): one
    printable line, and once private no link (JupyterLab links URLs in
    stream text, and a MIME type can be ``x-https://host/?d=...``)."""
    line = plain_line(note)
    if line not in notes:
        notes.add(line)
        emit("stream", {"name": "stderr", "text": f"{NOTICE} {defang_text(line) if private else line}\n"})


def plain_line(text: str) -> str:
    """One printable line of sandbox-written text (a marker file's contents)."""
    return "".join(c if c.isprintable() else " " for c in text)[:300]
