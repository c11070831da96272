"""``SandboxManager``: shell commands in per-session Docker containers.

Ephemeral by default (seed 003): every ``execute_command`` creates a container,
runs the command and removes the container, through :meth:`ephemeral_session`.
``persistent=True`` keeps one container per ``(user_id, session_id)`` until
``close_session``, ``close_all``, the idle reaper or process exit.

Every access asks ``network_mode_getter(user_id, session_id)`` for the session's
network mode and combines it with what this manager has already seen for the
session (a one-way ratchet): once a session was NONE (or PROXIED), it never gets a
bridge network again from this manager, whatever the getter says later. A
persistent container created with a network is removed and replaced by a
network-less one before the next command runs; the workspace (a host directory
bind-mounted at ``/workspace``) survives.

The manager is synchronous (docker-py is blocking). Async callers use the
``a*`` wrappers, which run each call in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sandbox_kernel.engine.launch import writable_folders
from sandbox_kernel.engine.workspace_policy import WorkspaceRefused, apply_policy, hide_private_sources
from sandbox_kernel.privacy.enforcement import HOLDERS_WAIT, EnforcementRecord
from sandbox_kernel.privacy.modes import NetworkMode
from sandbox_kernel.privacy.sensitivity import Sensitivity
from sandbox_kernel.sandbox.docker_backend import container_cgroup, to_docker_mount

from .config import (
    ContainerConfig,
    _positive_float,
    coerce_network_mode,
    container_prefix,
    default_workspace_root,
    session_timeout,
    validate_prefix,
)
from .hardening import (
    build_container_kwargs,
    check_read_only_mounts,
    docker_network,
    join_sandbox_network,
    most_restrictive,
    prepare_workspace,
    resolve_user,
    share_workspace,
)
from .names import (
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_OWNER_PID,
    LABEL_SESSION,
    LABEL_USER,
    container_labels,
    container_name,
    owner_status,
    validate_ids,
)
from .orphans import daemon_id, docker_facts
from .session import SandboxSession

if TYPE_CHECKING:
    from sandbox_kernel.privacy.state import PrivacyState
    from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

log = logging.getLogger(__name__)

#: Exit code returned when a command hit its timeout (GNU timeout's convention).
TIMEOUT_EXIT_CODE = 124
#: Keep-alive command of every container (docker-init is PID 1 and reaps zombies).
KEEPALIVE_COMMAND = ["sleep", "infinity"]
#: Runs the user's command under ``timeout -s KILL`` (which kills the whole process
#: group) with bash when the image has it, else sh. $1 = seconds, $2 = command.
#: stderr goes into stdout's pipe, so the combined output keeps the exact order.
EXEC_WRAPPER = (
    't="$1"; c="$2"; exec 2>&1; '
    "if command -v bash >/dev/null 2>&1; then s=bash; else s=sh; fi; "
    'if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL "$t" "$s" -c "$c"; fi; '
    'exec "$s" -c "$c"'
)

NetworkModeGetter = Callable[[str, str], "NetworkMode | str"]


def _default_network_mode(user_id: str, session_id: str) -> NetworkMode | str:
    """The privacy store's mode for a session (imported lazily, on first use).

    No fallback: if the privacy module cannot be imported the command fails rather
    than run with a network it might not be allowed.
    """
    from sandbox_kernel.privacy import get_network_mode

    return get_network_mode(user_id, session_id)


def _why(state: PrivacyState) -> str:
    """What a record of the session's folders says made them private."""
    return state.mark.reason if state.mark is not None and state.mark.reason else state.sensitivity.name


class ContainerGone(RuntimeError):
    """The session's container no longer exists or is not running."""


class NetworkModeChanged(RuntimeError):
    """A held ephemeral session became private: its networked container is refused."""


class _Registry:
    """Managers alive in this process, closed at interpreter exit."""

    managers: ClassVar[weakref.WeakSet[SandboxManager]] = weakref.WeakSet()
    registered = False
    lock = threading.Lock()

    @classmethod
    def add(cls, manager: SandboxManager) -> None:
        with cls.lock:
            cls.managers.add(manager)
            if not cls.registered:
                atexit.register(cls.close_all)
                cls.registered = True

    @classmethod
    def close_all(cls) -> None:
        for manager in list(cls.managers):
            try:
                manager.close_all()
            except Exception:  # pragma: no cover - best effort at exit
                log.exception("closing sandbox containers at exit failed")


def _check_command(command: object) -> str:
    if not isinstance(command, str):
        raise ValueError(f"command must be a string, got {type(command).__name__}")
    if "\0" in command:
        raise ValueError("command must not contain NUL characters")
    return command


def _format_seconds(seconds: float) -> str:
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return text or "0.001"


def _join(thread: threading.Thread | None) -> None:
    """Wait (bounded) for a stopped periodic thread, unless it is the caller."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=10)


def _reap_once(manager: SandboxManager) -> bool:
    manager.reap_idle()
    return True


class SandboxManager:
    """Docker containers for shell commands, one workspace per session.

    Parameters
    ----------
    read_only_mounts:
        ``{host_path: container_path}`` added read-only to every container (skills:
        ``{".../skills/x/scripts": "/skills/x/scripts"}``), on top of
        ``config.read_only_mounts``.
    config:
        a :class:`ContainerConfig`; default ``ContainerConfig()`` (environment).
    workspace_root:
        host directory holding ``<user_id>/<session_id>`` workspaces; default
        ``SANDBOX_WORKSPACE_ROOT``, else ``<data dir>/workspaces`` next to the privacy
        store (``SANDBOX_KERNEL_DATA_DIR`` or ``<jupyter data dir>/sandbox_kernel``).
        With a remote ``DOCKER_HOST`` this path must exist on the daemon's host.
    network_mode_getter:
        ``(user_id, session_id) -> NetworkMode``; default
        ``sandbox_kernel.privacy.get_network_mode``.
    client:
        a ``docker.DockerClient``; default ``docker.from_env()`` on first use.
    prefix, session_timeout, max_output_bytes, kill_grace:
        container name prefix (default ``SANDBOX_CONTAINER_PREFIX``), idle seconds
        before the reaper removes a persistent container (default
        ``SANDBOX_SESSION_TIMEOUT``), output kept per command, and seconds after a
        timeout before the host kills the container itself.
    shared_workspace:
        the workspaces are also written by sandboxes running as this process's
        uid (the agent tools' bwrap cells). As root the container user is then
        granted access by a POSIX ACL instead of being given the directory
        (which would lock the cells out); see ``hardening.share_workspace``.
    privacy_poll_interval:
        seconds between the watcher's checks of the network mode while a
        container with a network is held (as ``ToolsConfig.privacy_poll_interval``):
        a rise made elsewhere cuts it within this time, without a command. 0
        turns the watcher off, for a caller that runs :meth:`enforce_network`
        itself.
    enforcement_store:
        the privacy store (its root folder) whose raisers' ``wait=True``
        waits for this manager's cuts: each session that may hold a container
        with a network is a holder there, from before the container's mode is
        read. By default the default store when the getter is the default one
        (a custom getter's store is its caller's to name).
    """

    def __init__(
        self,
        read_only_mounts: Mapping[str, str] | None = None,
        config: ContainerConfig | None = None,
        workspace_root: str | Path | None = None,
        network_mode_getter: NetworkModeGetter | None = None,
        client: Any = None,
        *,
        prefix: str | None = None,
        session_timeout: float | None = None,
        max_output_bytes: int = 1024 * 1024,
        kill_grace: float = 5.0,
        shared_workspace: bool = False,
        privacy_poll_interval: float = 0.25,
        enforcement_store: str | Path | None = None,
    ) -> None:
        self.config = config if config is not None else ContainerConfig()
        #: the workspaces are also used by sandboxes running as this process's
        #: uid: share them (ACL) instead of handing them to the container user
        self.shared_workspace = bool(shared_workspace)
        if not isinstance(self.config, ContainerConfig):
            raise ValueError("config must be a ContainerConfig")
        self.read_only_mounts = check_read_only_mounts(read_only_mounts)
        check_read_only_mounts({**self.config.read_only_mounts, **self.read_only_mounts})
        root = Path(workspace_root) if workspace_root is not None else default_workspace_root()
        if not root.is_absolute():
            raise ValueError(f"workspace_root {str(root)!r} must be an absolute path")
        self.workspace_root = root
        self._getter: NetworkModeGetter = network_mode_getter or _default_network_mode
        self._enforcement_store = Path(enforcement_store) if enforcement_store is not None else None
        self._client = client
        self._prefix = validate_prefix(prefix, "prefix") if prefix is not None else None
        self._session_timeout = (
            _positive_float(session_timeout, "session_timeout") if session_timeout is not None else None
        )
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be a positive integer")
        self.max_output_bytes = max_output_bytes
        self.kill_grace = _positive_float(kill_grace, "kill_grace")
        self.privacy_poll_interval = (
            0.0
            if privacy_poll_interval == 0 and not isinstance(privacy_poll_interval, bool)
            else _positive_float(privacy_poll_interval, "privacy_poll_interval")
        )

        self._lock = threading.RLock()
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self._sessions: dict[tuple[str, str], SandboxSession] = {}
        self._ephemeral: dict[str, SandboxSession] = {}
        self._ratchet: dict[tuple[str, str], NetworkMode] = {}
        #: containers this manager dropped but the daemon did not remove (it did
        #: not answer): a later same-named one may replace them
        self._unremoved: set[str] = set()
        self._ncpu: float | None = None
        self._daemon = ""
        self._reaper: threading.Thread | None = None
        self._reaper_stop = threading.Event()
        #: the network watcher (see _hold_network), and one cut at a time (the
        #: tools' registry runs enforce_network too)
        self._watcher: threading.Thread | None = None
        self._watcher_stop = threading.Event()
        self._enforce_lock = threading.Lock()
        #: containers being made whose network is not known yet, per session
        self._creating: dict[tuple[str, str], int] = {}
        #: containers dropped with their network that could not be stopped
        self._uncut: dict[str, SandboxSession] = {}
        #: what raisers waiting for the cut (``wait=True``) read, per session
        #: that may hold a container with network
        self._records: dict[tuple[str, str], EnforcementRecord] = {}
        #: the level each private session's folders were recorded at
        self._recorded: dict[tuple[str, str], Sensitivity] = {}
        #: sessions recorded at a new level whose held container has not waited
        #: for the holders in their folders since (:meth:`_wait_for_holders`)
        self._unwaited: set[tuple[str, str]] = set()
        _Registry.add(self)

    # ------------------------------------------------------------------ basics

    @property
    def client(self) -> Any:
        """The Docker client (``docker.from_env()``: honours DOCKER_HOST & co.)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import docker

                    self._client = docker.from_env()
        return self._client

    @property
    def prefix(self) -> str:
        return self._prefix if self._prefix is not None else container_prefix()

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()

    def _key_lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._lock:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.Lock()
            return lock

    def _daemon_cpus(self) -> float | None:
        if self._ncpu is None:
            try:
                self._ncpu = float(self.client.info().get("NCPU") or 0) or None
            except Exception:  # informational only
                self._ncpu = None
        return self._ncpu

    def _daemon_id(self) -> str:
        """The daemon's ID, for the holder records (``orphans.docker_facts``)."""
        if not self._daemon:
            self._daemon = daemon_id(self.client)
        return self._daemon

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.config.command_timeout
        return _positive_float(timeout, "timeout", maximum=7 * 24 * 3600.0)

    def workspace_for(self, user_id: str, session_id: str) -> Path:
        """The host workspace of a session, created (mode 0700) if missing."""
        user_id, session_id = validate_ids(user_id, session_id)
        self.workspace_root.mkdir(parents=True, exist_ok=True)
        user_dir = self.workspace_root / user_id
        user_dir.mkdir(mode=0o700, exist_ok=True)
        workspace = user_dir / session_id
        workspace.mkdir(mode=0o700, exist_ok=True)
        if workspace.is_symlink() or not workspace.is_dir():
            raise ValueError(f"workspace {workspace} is not a plain directory")
        return workspace

    def prepare_workspace(self, user_id: str, session_id: str) -> tuple[Path, str]:
        """The session's workspace made writable for its containers, and the
        ``uid:gid`` they run as. Called before each container starts; callers
        sharing the workspace call it earlier too, so that files made before
        the first container inherit the shared access."""
        workspace = self.workspace_for(user_id, session_id)
        user = resolve_user(self.config.user, workspace)
        if self.shared_workspace:
            share_workspace(workspace, user)
        else:
            prepare_workspace(workspace, user)
        return workspace, user

    # ----------------------------------------------------------------- ratchet

    def mounted_folders(self, user_id: str, session_id: str) -> list[Path]:
        """Every host folder a container of the session mounts: its workspace
        first, then the read-only mounts (``config.read_only_mounts`` and this
        manager's)."""
        user_id, session_id = validate_ids(user_id, session_id)
        return [self.workspace_root / user_id / session_id, *self.read_only_sources()]

    def read_only_sources(self) -> list[Path]:
        """The host side of every read-only mount of this manager's containers."""
        return [Path(source) for source in {**self.config.read_only_mounts, **self.read_only_mounts}]

    def _folders_mode(self, user_id: str, session_id: str) -> NetworkMode:
        """The network the folders a container mounts allow: none when any of
        them holds, lies in or is private data (its folder level, over every
        store of the host: ``privacy/workspace_levels.py``), whatever the
        getter says. A getter knows the session, not what this manager mounts
        beside its workspace (a read-only ``/ref`` that a private kernel
        writes into), and the default one ignores folder levels altogether.

        The workspace is then recorded at that level too: the container can
        copy what it reads into it, and every sandbox sharing the workspace
        (the tools' cells, a kernel in that folder) must rise with it."""
        from sandbox_kernel.engine.ratchet import folders_level

        workspace, *mounts = self.mounted_folders(user_id, session_id)
        state = folders_level([workspace, *mounts], self._own_levels(), [workspace])
        if state.has_private_data:
            self._ensure_recorded(user_id, session_id, state.sensitivity, _why(state))
        return state.network_mode

    def _own_levels(self) -> WorkspaceLevels:
        """The folder levels this manager records (beside :meth:`_levels_store`)."""
        from sandbox_kernel.privacy.workspace_levels import FOLDER_LEVELS, levels_at

        return levels_at(self._levels_store().parent / FOLDER_LEVELS)

    def _ensure_recorded(self, user_id: str, session_id: str, level: Sensitivity, why: str) -> bool:
        """The session's folders recorded at ``level`` at least (once per
        level: :meth:`_record_folders`); False when that failed."""
        key = (user_id, session_id)
        if self._recorded.get(key, Sensitivity.PUBLIC) >= level:
            return True
        if not self._record_folders(self._own_levels(), user_id, session_id, level, why):
            with self._lock:
                self._unwaited.add(key)  # (a held container's next command retries, or is refused)
            return False
        self._note_level(key, level)
        return True

    def _note_level(self, key: tuple[str, str], level: Sensitivity) -> None:
        """The session's folders are recorded at ``level``: its containers
        report it while held without network (:meth:`_sync_record`), and the
        next command waits for the holders in those folders."""
        with self._lock:
            if level <= self._recorded.get(key, Sensitivity.PUBLIC):
                return
            self._recorded[key] = level
            self._unwaited.add(key)
        try:  # (a record of a container already without network is kept from now on)
            self._sync_record(key)
        except OSError as exc:
            log.error("could not report session %s of %s at %s: %s", key[1], key[0], level.name, exc)

    def _record_folders(
        self, own: WorkspaceLevels, user_id: str, session_id: str, level: Sensitivity, why: str
    ) -> bool:
        """Record the session's workspace at ``level``, and each read-only
        mount as read at it (``WorkspaceLevels.record_read``): a sandbox
        working in a mount could take the data through a socket there. False
        (logged) when that failed: then no command of the session runs
        (:meth:`_wait_for_holders`), and it is tried again."""
        workspace, *mounts = self.mounted_folders(user_id, session_id)
        who = f"the Docker shell of session {session_id} of {user_id}"
        try:
            own.record(workspace, level, f"{why}; {who} mounts that folder")
            for mount in mounts:
                own.record_read(mount, level, f"{why}; {who} mounts {mount} read-only")
        except (OSError, ValueError) as exc:
            log.error(
                "could not record the level of %s (no command of the session runs until it is): %s", workspace, exc
            )
            return False
        return True

    def _record_private_session(self, user_id: str, session_id: str) -> None:
        """A session whose own record is private (the getter already said no
        network, so :meth:`_folders_mode` is not asked) records its folders
        too, once per level. Before, only a session made private by its
        folders recorded them, and a public kernel with network listening on a
        socket in ``/ref`` received the rows of a session made private through
        ``add_private_dataset`` (a review). A getter with no store known here
        (``enforcement_store``) records for itself, as the tools' does."""
        state = self._private_state(user_id, session_id)
        if state is not None:
            self._ensure_recorded(user_id, session_id, state.sensitivity, _why(state))

    def _private_state(self, user_id: str, session_id: str) -> PrivacyState | None:
        """The session's own state if it is private, read from the store the
        getter reads (None for a getter with none known here)."""
        root = self._enforcement_root()
        if root is None:
            return None
        from sandbox_kernel.privacy.store import PrivacyStore

        state = PrivacyStore(root).read(user_id, session_id)
        return state if state.has_private_data else None

    def _wait_for_holders(self, user_id: str, session_id: str) -> None:
        """Before a private session's command runs in a container made or
        first used since its folders were recorded: make sure they are
        recorded at the session's level (its own, or its folders'), then wait
        (at most ``HOLDERS_WAIT`` s) for the sandboxes working in its
        workspace, around it or in its read-only mounts to report their cut.
        They learn of the rise at their next poll, and a socket one listens on
        in a mount, or a file it reads in the workspace, would take the rows
        meanwhile. Raises :class:`WorkspaceRefused` when the records cannot
        be written or one of them still has network after the wait: the
        command does not run (a review: a failed record was taken as done,
        and the command ran after the wait; a kernel with network in the
        mount received the rows)."""
        self._await_holders(user_id, session_id)
        with self._lock:  # (only once it is done: a refused command's retry waits again, a review)
            self._unwaited.discard((user_id, session_id))

    def _await_holders(self, user_id: str, session_id: str) -> None:
        """:meth:`_wait_for_holders`'s work."""
        root = self._enforcement_root()
        if root is None:
            return
        level = self._held_level(user_id, session_id)
        if level == Sensitivity.PUBLIC:
            return
        if not self._ensure_recorded(user_id, session_id, level, level.name):
            raise WorkspaceRefused(
                f"session {session_id} of {user_id} holds private data, and its folders could not be recorded "
                "at its level in the privacy store (see the log): the sandboxes working in them would keep "
                "their network, so no command runs until they can be"
            )
        from sandbox_kernel.privacy.enforcement import pending_holders

        record = self._records.get((user_id, session_id))
        mine = [record.path] if record is not None else []  # (counted as networked while it is made)
        workspace = str(self.workspace_root / user_id / session_id)
        mounts = [str(mount) for mount in self.read_only_sources()]
        deadline = time.monotonic() + HOLDERS_WAIT
        while True:
            pending = pending_holders(root, user_id, session_id, level, workspaces=[workspace], reads=mounts, skip=mine)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if pending:
            raise WorkspaceRefused(
                f"session {session_id} of {user_id} holds private data, and sandboxes sharing its folders still "
                f"had network after {HOLDERS_WAIT:g} s ({', '.join(pending[:3])}): no command runs beside them; "
                "try again once they are cut"
            )

    def _held_level(self, user_id: str, session_id: str) -> Sensitivity:
        """The level the session's containers hold: its own record's, or its
        folders' (over every store of the host), whichever is higher."""
        from sandbox_kernel.engine.ratchet import folders_level

        state = self._private_state(user_id, session_id)
        workspace, *mounts = self.mounted_folders(user_id, session_id)
        folders = folders_level([workspace, *mounts], self._own_levels(), [workspace]).sensitivity
        return max(state.sensitivity if state is not None else Sensitivity.PUBLIC, folders)

    def _note_reached(self, folders: list[Path], user_id: str, session_id: str) -> None:
        """Record, before a container starts, the folders it writes in, as the
        kernel's sandboxes do (``Ratchet.note_reached``): a link or socket it
        leaves in one folder inside its workspace can tie it to another, so a
        later rise of one raises the workspace, and every folder in it. A
        workspace root a user points at their projects holds notebook folders.
        Raises :class:`WorkspaceRefused` when the records cannot be written:
        the container must not start then."""
        from sandbox_kernel.privacy.workspace_levels import folder_of

        if not folders:
            return
        try:
            self._own_levels().note_reached(
                [folder_of(folder) for folder in folders],
                f"the Docker shell of session {session_id} of {user_id}",
            )
        except (OSError, ValueError) as exc:  # (a PrivacyStoreError is an OSError)
            raise WorkspaceRefused(
                f"could not record that a container works in {folders[0]} in the privacy store ({exc}): the ratchet "
                "needs it to keep the folders inside at their level"
            ) from exc

    def _levels_store(self) -> Path:
        """The store beside which this manager records folder levels: its
        enforcement store, else the default one (every reader reads both)."""
        root = self._enforcement_root()
        if root is not None:
            return root
        from sandbox_kernel.privacy.store import default_store

        return default_store().root

    def network_mode_for(self, user_id: str, session_id: str) -> NetworkMode:
        """The effective mode: getter, config, the levels of the folders the
        container mounts and this manager's memory, most restrictive."""
        user_id, session_id = validate_ids(user_id, session_id)
        reported = coerce_network_mode(
            self._getter(user_id, session_id), "network mode returned by network_mode_getter"
        )
        key = (user_id, session_id)
        with self._lock:
            known = most_restrictive(self.config.network_mode, reported, self._ratchet.get(key, NetworkMode.FULL))
        if known is NetworkMode.FULL:
            folders = self._folders_mode(user_id, session_id)
        else:
            folders = known
            self._record_private_session(user_id, session_id)
        with self._lock:
            mode = most_restrictive(known, folders, self._ratchet.get(key, NetworkMode.FULL))
            if mode is not NetworkMode.FULL:
                self._ratchet[key] = mode
        return mode

    # ----------------------------------------------------------------- watcher
    #
    # A held container keeps its network until a command or enforce_network
    # looks at the session again; a background process in it would keep
    # sending meanwhile. The watcher runs enforce_network every
    # privacy_poll_interval while this manager may hold a container with a
    # network, and each such session is a holder in the privacy store's
    # enforcement records (privacy/enforcement.py), so a raiser's
    # ``wait=True`` returns only after the cut.

    def _hold_network(self, key: tuple[str, str]) -> bool:
        """Called before a new container's mode is read: count it as networked
        (and report the session as a holder with network) until it is known.
        A rise that ``wait=True`` did not see us for is then read by that very
        mode check. False when the container cannot get a network anyway."""
        with self._lock:
            known = most_restrictive(self.config.network_mode, self._ratchet.get(key, NetworkMode.FULL))
            if known is not NetworkMode.FULL:
                return False
            self._creating[key] = self._creating.get(key, 0) + 1
            try:
                self._sync_record(key)
            except BaseException:
                self._release_network(key)
                raise
            self._ensure_watcher()
        return True

    def _release_network(self, key: tuple[str, str]) -> None:
        """The container counted by :meth:`_hold_network` is held (or was not made)."""
        with self._lock:
            left = self._creating.get(key, 0) - 1
            if left > 0:
                self._creating[key] = left
            else:
                self._creating.pop(key, None)
            self._sync_record(key)

    def _networked(self, key: tuple[str, str] | None = None) -> bool:
        """May this manager hold a container with a network (of ``key``, or any)?"""
        with self._lock:
            if self._creating.get(key, 0) if key is not None else self._creating:
                return True
            held = [*self._sessions.values(), *self._ephemeral.values(), *self._uncut.values()]
            return any((key is None or s.key == key) and docker_network(s.network_mode) != "none" for s in held)

    def _enforcement_root(self) -> Path | None:
        """The privacy store whose raisers wait on this manager's records:
        the one given, else the default getter's; None for another getter
        without one, whose caller reports."""
        if self._enforcement_store is not None:
            return self._enforcement_store
        if self._getter is not _default_network_mode:
            return None
        from sandbox_kernel.privacy.store import default_store

        return default_store().root

    def _sync_record(self, key: tuple[str, str]) -> None:
        """Keep the session's record while it may have a network; remove it
        once it has none (a network-less container enforces every level).
        Raises OSError when the record cannot be written."""
        with self._lock:
            record = self._records.get(key)
            if self._networked(key):
                if record is None:
                    root = self._enforcement_root()
                    if root is None:
                        return
                    workspace = self.workspace_root / key[0] / key[1]
                    # its containers outlive this process (SIGKILL runs no
                    # cleanup): the record names them for a rise after that
                    daemon = self._daemon_id()
                    if not daemon:
                        # a record without it could never be confirmed gone:
                        # every later rise would time out on it (review 76)
                        raise OSError(
                            "the Docker daemon does not say its ID (docker info): a container with network started "
                            "now could not be found again by a rise if this process died; not started"
                        )
                    facts = docker_facts(daemon, {LABEL_USER: key[0], LABEL_SESSION: key[1]})
                    record = self._records[key] = EnforcementRecord(
                        root, *key, workspace=workspace, reads=self.read_only_sources(), docker=facts
                    )
                record.report(Sensitivity.PUBLIC, True)
            elif record is not None:
                if self._recorded.get(key, Sensitivity.PUBLIC) > Sensitivity.PUBLIC and self._holds(key):
                    # A container held without network still names the
                    # session's folders: a raiser's wait reads the workspace
                    # and mounts from it, and once it was gone it stopped
                    # waiting for the sandboxes working in them (a review:
                    # the rows reached one still with network). Without
                    # network it enforces every level: a later rise must
                    # not wait on it. The watcher records its folders at
                    # each new level meanwhile (_follow_private_levels).
                    record.report(Sensitivity.SECRET, False)
                    self._ensure_watcher()
                    return
                del self._records[key]
                record.close()

    def _holds(self, key: tuple[str, str]) -> bool:
        """Whether this manager holds a container of ``key`` (with a network or not)."""
        with self._lock:
            held = [*self._sessions.values(), *self._ephemeral.values(), *self._uncut.values()]
            return any(s.key == key for s in held)

    def _ensure_watcher(self) -> None:
        with self._lock:
            if self.privacy_poll_interval <= 0 or (self._watcher is not None and self._watcher.is_alive()):
                return
            self._watcher_stop = threading.Event()
            self._watcher = self._periodic(
                "sandbox-network-watcher", self.privacy_poll_interval, self._watcher_stop, SandboxManager._watch_once
            )

    def _watch_once(self) -> bool:
        """One round of the watcher; False once nothing with a network is
        held, and no container of a private session whose folders it records."""
        try:
            self.enforce_network()
        except Exception:  # never let the watcher die
            log.exception("cutting held containers' network failed")
        try:
            self._follow_private_levels()
        except Exception:
            log.exception("recording private sessions' folders failed")
        with self._lock:
            if self._networked() or self._kept_records():
                return True
            if self._watcher is threading.current_thread():
                self._watcher = None
            return False

    def _kept_records(self) -> list[tuple[str, str]]:
        """The sessions whose held containers, cut, keep their record."""
        with self._lock:
            return [key for key in self._records if not self._networked(key)]

    def _follow_private_levels(self) -> None:
        """Record the folders of each held private session again when its
        level rose: the sandboxes working in them see only what is recorded,
        and a raiser waits for them to see the new level (a review: a higher
        rise timed out on a kernel cut at the first one, which nothing
        raised again once the watcher had stopped)."""
        for user_id, session_id in self._kept_records():
            level = self._held_level(user_id, session_id)  # (its own level, or its folders')
            if level > Sensitivity.PUBLIC:
                self._ensure_recorded(user_id, session_id, level, level.name)

    def stop_watcher(self) -> None:
        with self._lock:
            thread, self._watcher = self._watcher, None
            self._watcher_stop.set()
        _join(thread)

    def _periodic(
        self, name: str, interval: float, stop: threading.Event, step: Callable[[SandboxManager], bool]
    ) -> threading.Thread:
        """A daemon thread running ``step(self)`` every ``interval`` seconds
        until ``stop`` is set, ``step`` returns False or the manager is gone
        (it holds the manager weakly)."""
        ref = weakref.ref(self)

        def loop() -> None:
            while not stop.wait(interval):
                manager = ref()
                if manager is None:
                    return
                try:
                    going = step(manager)
                except Exception:
                    log.exception("%s failed", name)
                    going = True
                del manager
                if not going:
                    return

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        return thread

    # -------------------------------------------------------------- containers

    def _new_session(self, user_id: str, session_id: str, mode: NetworkMode, *, ephemeral: bool) -> SandboxSession:
        workspace, user = self.prepare_workspace(user_id, session_id)
        name = container_name(self.prefix, user_id, session_id, ephemeral=ephemeral)
        labels = container_labels(
            user_id, session_id, kind="ephemeral" if ephemeral else "persistent", network=mode.value
        )
        # The workspace policy (engine/workspace_policy.py): the same refusals and
        # masks as the kernel's sandboxes, which share this folder.
        policy_mounts, plan = apply_policy(workspace, self.config.working_dir, allowed_roots=[self.workspace_root])
        self._note_reached(writable_folders(policy_mounts, workspace), user_id, session_id)
        if mode is not NetworkMode.FULL:
            self._wait_for_holders(user_id, session_id)
        kwargs = build_container_kwargs(
            self.config,
            network_mode=mode,
            workspace=None if plan.home_rule else workspace,
            user=user,
            labels=labels,
            extra_read_only_mounts=self.read_only_mounts,
            max_cpus=self._daemon_cpus(),
        )
        kwargs["mounts"] += [to_docker_mount(m) for m in (policy_mounts if plan.home_rule else policy_mounts[1:])]
        # private dataset sources inside the read-only folders (docs/security.md, "Private dataset sources")
        for src, tgt in {**self.config.read_only_mounts, **self.read_only_mounts}.items():
            kwargs["mounts"] += [to_docker_mount(m) for m in hide_private_sources(Path(src), tgt)]
        kwargs = join_sandbox_network(self.client, kwargs)
        container_id = self._create_and_start(name, kwargs, replace_stale=None if ephemeral else (user_id, session_id))
        try:
            cgroup = container_cgroup(self.client, container_id)
        except Exception as exc:  # no cgroup view from here (a remote daemon...)
            log.debug("cgroup of container %s not found: %s", container_id[:12], exc)
            cgroup = None
        log.debug(
            "started %s container %s (%s) network=%s",
            "ephemeral" if ephemeral else "persistent",
            name,
            container_id[:12],
            kwargs["network_mode"],
        )
        return SandboxSession(
            user_id=user_id,
            session_id=session_id,
            container_id=container_id,
            container_name=name,
            network_mode=mode,
            config=self.config,
            workspace=workspace,
            user=user,
            ephemeral=ephemeral,
            cgroup=cgroup,
        )

    def _create_and_start(self, name: str, kwargs: dict[str, Any], *, replace_stale: tuple[str, str] | None) -> str:
        """Create and start a container; ``replace_stale`` is the persistent
        session's ``(user_id, session_id)`` whose dead same-named container may
        be replaced."""
        import docker

        try:
            container = self.client.containers.create(command=KEEPALIVE_COMMAND, name=name, detach=True, **kwargs)
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or replace_stale is None or not self._remove_stale(name, replace_stale):
                raise
            container = self.client.containers.create(command=KEEPALIVE_COMMAND, name=name, detach=True, **kwargs)
        try:
            container.start()
        except BaseException:
            self._remove_container(container.id)
            raise
        container_id: str = container.id
        return container_id

    def _remove_stale(self, name: str, key: tuple[str, str]) -> bool:
        """Remove a same-named container the session's dead owner left; refuse
        a live one's. The labels must name this very session: a name is no
        proof of whose container it is (another prefix, an older naming), and
        another session's container is never removed, nor used."""
        import docker

        try:
            existing = self.client.containers.get(name)
        except docker.errors.NotFound:
            return True  # gone meanwhile: just retry
        labels = existing.labels or {}
        if labels.get(LABEL_MANAGED) != "1":
            raise RuntimeError(f"a container named {name!r} exists and is not managed by sandbox_kernel")
        owner = (labels.get(LABEL_USER), labels.get(LABEL_SESSION), labels.get(LABEL_KIND))
        if owner != (*key, "persistent"):
            raise RuntimeError(
                f"a container named {name!r} exists and is not the persistent container of session "
                f"{key[0]}/{key[1]} (its labels: user {owner[0]!r}, session {owner[1]!r}, kind {owner[2]!r}); "
                "it is left alone"
            )
        alive, why = owner_status(labels)
        if existing.id in self._unremoved:
            alive, why = False, "this manager dropped it while the daemon did not answer"
        if alive is False:
            log.info("removing stale container %s: %s", name, why)
            self._remove_container(existing.id)
            return True
        raise RuntimeError(
            f"container {name!r} already exists for this session and is in use "
            f"({why}, pid label {labels.get(LABEL_OWNER_PID)!r}); close it there or run "
            "`sandbox-kernel gc`"
        )

    def _remove_container(self, container_id: str) -> None:
        import docker

        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc):
                return
            raise

    def _stop_from_host(self, session: SandboxSession) -> bool:
        """The daemon neither cut nor removed a container that must lose its
        network (it does not answer: restarted, hung, killed): it would run on,
        networked, beside a private workspace until the daemon came back. The
        host kills what runs in its cgroup itself; a container without a
        process has no network. Its removal waits for the daemon (the next
        same-named container, or ``sandbox-kernel gc``). True when stopped."""
        self._unremoved.add(session.container_id)
        if session.cgroup is None:
            log.error("container %s keeps running: its cgroup is not known on this host", session.container_name)
        elif not session.cgroup.kill_all(2.0, foreign=True):
            log.error("container %s still has processes after the kill", session.container_name)
        else:
            log.warning("container %s stopped from the host: its daemon did not answer", session.container_name)
            return True
        return False

    def _forget(self, session: SandboxSession) -> None:
        """Drop a persistent session from the cache (if still current) and remove its container."""
        with self._lock:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]
        self._remove_container(session.container_id)
        self._sync_record(session.key)

    # ---------------------------------------------------------------- sessions

    def get_or_create_session(self, user_id: str, session_id: str) -> SandboxSession:
        """The persistent session of ``(user_id, session_id)``, created if needed.

        Checks the network mode first: a container with a network whose session is
        now private is removed and replaced by one without (workspace kept).
        """
        user_id, session_id = validate_ids(user_id, session_id)
        key = (user_id, session_id)
        with self._key_lock(key):
            held = self._hold_network(key)
            try:
                return self._current_session(key)
            finally:
                if held:
                    self._release_network(key)

    def _current_session(self, key: tuple[str, str]) -> SandboxSession:
        """The persistent session, replaced or made as the mode requires (under the key lock)."""
        user_id, session_id = key
        mode = self.network_mode_for(user_id, session_id)
        with self._lock:
            session = self._sessions.get(key)
        if session is not None and docker_network(session.network_mode) != docker_network(mode):
            log.info(
                "session %s/%s became %s: replacing container %s",
                user_id,
                session_id,
                mode.name,
                session.container_name,
            )
            self._forget(session)
            session = None
        elif session is not None and session.network_mode is not mode:
            session.network_mode = most_restrictive(session.network_mode, mode)
        if session is not None and key in self._unwaited:
            self._wait_for_holders(user_id, session_id)  # (a rise since its last command)
        if session is None:
            session = self._new_session(user_id, session_id, mode, ephemeral=False)
            with self._lock:
                self._sessions[key] = session
        return session

    def enforce_network(self) -> list[str]:
        """Disconnect, at once and without the container's help, every container
        whose session has become private since it was created (the daemon does
        it; the container keeps running, network-less, with its workspace).
        This manager's watcher calls it every ``privacy_poll_interval`` while it
        holds a container with a network (the tools' registry calls it too), so
        the cut does not wait for the next command. Returns the names of the
        containers cut."""
        with self._enforce_lock:  # two at once would each disconnect, and the later one fail
            return self._enforce_network()

    def _enforce_network(self) -> list[str]:
        with self._lock:
            held = list(self._sessions.values()) + list(self._ephemeral.values())
        cut = []
        for session in held:
            if docker_network(session.network_mode) == docker_network(NetworkMode.NONE):
                continue
            mode = self.network_mode_for(session.user_id, session.session_id)
            if docker_network(mode) == docker_network(session.network_mode):
                continue
            try:
                info = self.client.api.inspect_container(session.container_id)
                for name in (info.get("NetworkSettings") or {}).get("Networks") or {}:
                    if name != "none":
                        self.client.api.disconnect_container_from_network(session.container_id, name, force=True)
            except Exception as exc:  # the container may be gone; removing it is the fallback
                # Fail closed for both kinds: an ephemeral container left running
                # here would keep its network beside a private workspace until
                # its command ends (its holder then removes an absent container).
                log.warning("could not disconnect %s (%s): removing it", session.container_name, exc)
                stopped = True
                try:
                    if session.ephemeral:
                        self._remove_container(session.container_id)
                    else:
                        self._forget(session)
                except Exception as gone_exc:  # keep cutting the others
                    log.error("could not remove %s either: %s", session.container_name, gone_exc)
                    stopped = self._stop_from_host(session)
                with self._lock:
                    # no longer held (its holder's exit removes nothing more);
                    # one still running counts as networked for wait=True
                    self._ephemeral.pop(session.container_id, None)
                    if not stopped:
                        self._uncut[session.container_id] = session
                self._sync_record(session.key)
                continue
            session.network_mode = mode
            self._sync_record(session.key)
            cut.append(session.container_name)
        return cut

    def get_session(self, user_id: str, session_id: str) -> SandboxSession | None:
        """The cached persistent session, if any (no Docker call, no mode check)."""
        with self._lock:
            return self._sessions.get(validate_ids(user_id, session_id))

    def sessions(self) -> list[SandboxSession]:
        """Persistent sessions currently held."""
        with self._lock:
            return list(self._sessions.values())

    @contextmanager
    def ephemeral_session(self, user_id: str, session_id: str) -> Iterator[SandboxSession]:
        """A fresh container (uuid-suffixed name) that is removed on exit, always."""
        user_id, session_id = validate_ids(user_id, session_id)
        key = (user_id, session_id)
        held = self._hold_network(key)
        try:
            mode = self.network_mode_for(user_id, session_id)
            session = self._new_session(user_id, session_id, mode, ephemeral=True)
            with self._lock:
                self._ephemeral[session.container_id] = session
        finally:
            if held:
                self._release_network(key)
        try:
            yield session
        finally:
            with self._lock:
                self._ephemeral.pop(session.container_id, None)
            self._remove_container(session.container_id)
            self._sync_record(key)

    def close_session(self, user_id: str, session_id: str) -> bool:
        """Remove the persistent container of a session; True if there was one.

        The workspace stays on the host, and so does this manager's memory of the
        session's network mode (the ratchet).
        """
        user_id, session_id = validate_ids(user_id, session_id)
        key = (user_id, session_id)
        with self._key_lock(key):
            with self._lock:
                session = self._sessions.pop(key, None)
            if session is None:
                return False
            self._remove_container(session.container_id)
            self._sync_record(key)
            return True

    def close_all(self) -> None:
        """Stop the reaper and the watcher and remove every container this manager holds."""
        self.stop_reaper()
        self.stop_watcher()
        with self._lock:
            sessions = [*self._sessions.values(), *self._ephemeral.values(), *self._uncut.values()]
            self._sessions.clear()
            self._ephemeral.clear()
            self._uncut.clear()
        errors = []
        for session in sessions:
            try:
                self._remove_container(session.container_id)
            except Exception as exc:  # keep going: remove the others
                errors.append(f"{session.container_name}: {exc}")
                with self._lock:  # still there: still a holder
                    self._uncut[session.container_id] = session
        for key in {session.key for session in sessions}:
            self._sync_record(key)
        if errors:
            raise RuntimeError("could not remove some containers: " + "; ".join(errors))

    # ---------------------------------------------------------------- commands

    def execute_command(
        self,
        user_id: str,
        session_id: str,
        command: str,
        timeout: float | None = None,
        persistent: bool = False,
    ) -> tuple[int, str]:
        """Run ``command`` with bash (sh if absent) in the session's sandbox.

        Returns ``(exit_code, output)``: stdout and stderr share one pipe, so the
        output keeps the order in which the command wrote them. On timeout the command's whole process group is killed and the
        exit code is 124 with a note at the end of the output.
        """
        user_id, session_id = validate_ids(user_id, session_id)
        command = _check_command(command)
        seconds = self._timeout(timeout)
        if not persistent:
            with self.ephemeral_session(user_id, session_id) as session:
                return self._run_command(session, command, seconds)
        for attempt in range(2):
            session = self.get_or_create_session(user_id, session_id)
            try:
                return self._run_command(session, command, seconds)
            except ContainerGone:
                self._forget(session)
                if attempt:
                    raise
                log.info("container of %s/%s is gone: recreating it", user_id, session_id)
        raise AssertionError("unreachable")

    def run_in_session(self, session: SandboxSession, command: str, timeout: float | None = None) -> tuple[int, str]:
        """Run a command in a session you hold (e.g. from ``ephemeral_session``).

        The network mode is checked first: a persistent session that has to lose its
        network is replaced (the command runs in the new container); an ephemeral
        one raises :class:`NetworkModeChanged`, since its container cannot be.
        """
        command = _check_command(command)
        seconds = self._timeout(timeout)
        mode = self.network_mode_for(session.user_id, session.session_id)
        if docker_network(session.network_mode) != docker_network(mode):
            if session.ephemeral:
                raise NetworkModeChanged(
                    f"session {session.user_id}/{session.session_id} is now {mode.name}: its "
                    f"ephemeral container {session.container_name} has a network and takes no "
                    "more commands; open a new ephemeral session"
                )
            session = self.get_or_create_session(session.user_id, session.session_id)
        elif session.key in self._unwaited:
            self._wait_for_holders(session.user_id, session.session_id)
        return self._run_command(session, command, seconds)

    def _run_command(self, session: SandboxSession, command: str, seconds: float) -> tuple[int, str]:
        with self._lock:
            session.in_flight += 1
        session.touch()
        try:
            return self._exec(session, command, seconds)
        finally:
            with self._lock:
                session.in_flight -= 1
            session.touch()

    def _exec(self, session: SandboxSession, command: str, seconds: float) -> tuple[int, str]:
        import docker

        api = self.client.api
        cmd = ["/bin/sh", "-c", EXEC_WRAPPER, "sandbox-exec", _format_seconds(seconds), command]
        try:
            exec_id = api.exec_create(
                session.container_id,
                cmd,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                workdir=session.config.working_dir,
            )["Id"]
        except docker.errors.NotFound as exc:
            raise ContainerGone(str(exc)) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # not running / paused / being removed
                raise ContainerGone(str(exc)) from exc
            raise

        fired = threading.Event()
        watchdog = threading.Timer(seconds + self.kill_grace, self._hard_stop, args=(session, fired))
        watchdog.daemon = True
        out = bytearray()
        dropped = 0
        started = time.monotonic()
        watchdog.start()
        try:
            try:
                for chunk in api.exec_start(exec_id, stream=True, demux=False):
                    room = self.max_output_bytes - len(out)
                    if room > 0:
                        out += chunk[:room]
                    dropped += max(0, len(chunk) - max(room, 0))
            except Exception:
                if not fired.is_set():
                    raise
        finally:
            watchdog.cancel()
            if fired.is_set():
                watchdog.join()  # let the hard stop finish before reporting
        elapsed = time.monotonic() - started

        text = out.decode("utf-8", errors="replace")
        if dropped:
            text += f"\n[sandbox_kernel] output truncated: {dropped} more bytes not shown\n"
        if fired.is_set():
            note = (
                f"\n[sandbox_kernel] command timed out after {seconds:g} s; it did not stop in "
                f"time, so its container was killed"
                + ("" if session.ephemeral else " (the persistent container will be recreated)")
                + "\n"
            )
            return TIMEOUT_EXIT_CODE, text + note

        exit_code = self._exit_code(exec_id)
        if exit_code in (124, 137) and elapsed >= seconds - 0.05:
            return TIMEOUT_EXIT_CODE, text + (
                f"\n[sandbox_kernel] command timed out after {seconds:g} s and was killed\n"
            )
        if exit_code is None or exit_code == 137:
            # Killed: by the OOM killer, or the whole container died. A dead
            # persistent container is dropped so the next call gets a new one.
            if not session.ephemeral and not self._is_running(session.container_id):
                self._forget(session)
                text += "\n[sandbox_kernel] the sandbox container stopped; a new one will be created\n"
            if exit_code is None:
                exit_code = 137
        return exit_code, text

    def _exit_code(self, exec_id: str) -> int | None:
        deadline = time.monotonic() + 2.0
        while True:
            try:
                info = self.client.api.exec_inspect(exec_id)
            except Exception:
                return None
            if not info.get("Running") or time.monotonic() > deadline:
                code = info.get("ExitCode")
                return int(code) if code is not None else None
            time.sleep(0.02)

    def _is_running(self, container_id: str) -> bool:
        try:
            state = self.client.api.inspect_container(container_id)["State"]
        except Exception:
            return False
        return bool(state.get("Running")) and not state.get("Paused")

    def _hard_stop(self, session: SandboxSession, fired: threading.Event) -> None:
        """Watchdog: the in-container timeout did not end the command; kill the container."""
        fired.set()
        log.warning("command in %s outlived its timeout: killing the container", session.container_name)
        try:
            if session.ephemeral:
                self.client.api.kill(session.container_id)
            else:
                self._forget(session)
        except Exception:
            log.exception("could not kill container %s", session.container_name)

    # ------------------------------------------------------------------ reaper

    def reap_idle(self, max_idle: float | None = None) -> list[tuple[str, str]]:
        """Remove persistent containers idle for ``max_idle`` seconds (default
        ``session_timeout`` / SANDBOX_SESSION_TIMEOUT); returns their keys."""
        if max_idle is None:
            max_idle = self._session_timeout if self._session_timeout is not None else session_timeout()
        max_idle = _positive_float(max_idle, "max_idle")
        now = time.time()
        with self._lock:
            idle = [s for s in self._sessions.values() if s.in_flight == 0 and s.idle_seconds(now) >= max_idle]
        reaped = []
        for session in idle:
            with self._key_lock(session.key):
                with self._lock:
                    current = self._sessions.get(session.key)
                    if current is not session or session.in_flight or session.idle_seconds() < max_idle:
                        continue
                    del self._sessions[session.key]
                try:
                    self._remove_container(session.container_id)
                except Exception:
                    log.exception("reaper: could not remove %s", session.container_name)
                    continue
                self._sync_record(session.key)
                log.info("reaped idle sandbox %s", session.container_name)
                reaped.append(session.key)
        return reaped

    def start_reaper(self, interval: float | None = None) -> None:
        """Run :meth:`reap_idle` every ``interval`` seconds in a daemon thread."""
        if interval is None:
            limit = self._session_timeout if self._session_timeout is not None else session_timeout()
            interval = max(1.0, min(60.0, limit / 4))
        interval = _positive_float(interval, "interval")
        with self._lock:
            if self._reaper is not None and self._reaper.is_alive():
                return
            self._reaper_stop = threading.Event()
            self._reaper = self._periodic("sandbox-reaper", interval, self._reaper_stop, _reap_once)

    def stop_reaper(self) -> None:
        with self._lock:
            thread, self._reaper = self._reaper, None
            self._reaper_stop.set()
        _join(thread)

    # ------------------------------------------------------------ async facade

    async def aexecute_command(
        self,
        user_id: str,
        session_id: str,
        command: str,
        timeout: float | None = None,
        persistent: bool = False,
    ) -> tuple[int, str]:
        """:meth:`execute_command` in a worker thread: never blocks the event loop."""
        return await asyncio.to_thread(self.execute_command, user_id, session_id, command, timeout, persistent)

    async def aget_or_create_session(self, user_id: str, session_id: str) -> SandboxSession:
        return await asyncio.to_thread(self.get_or_create_session, user_id, session_id)

    async def aclose_session(self, user_id: str, session_id: str) -> bool:
        return await asyncio.to_thread(self.close_session, user_id, session_id)

    async def aclose_all(self) -> None:
        await asyncio.to_thread(self.close_all)

    async def areap_idle(self, max_idle: float | None = None) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self.reap_idle, max_idle)

    async def arun_in_session(
        self, session: SandboxSession, command: str, timeout: float | None = None
    ) -> tuple[int, str]:
        return await asyncio.to_thread(self.run_in_session, session, command, timeout)

    @asynccontextmanager
    async def aephemeral_session(self, user_id: str, session_id: str) -> AsyncIterator[SandboxSession]:
        """Async :meth:`ephemeral_session`: creation and removal run in threads."""
        cm = self.ephemeral_session(user_id, session_id)
        entering = asyncio.ensure_future(asyncio.to_thread(cm.__enter__))
        try:
            session = await asyncio.shield(entering)
        except asyncio.CancelledError:
            # The worker thread still creates the container: remove it when it has.
            def cleanup(fut: asyncio.Future[SandboxSession]) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    threading.Thread(target=cm.__exit__, args=(None, None, None), daemon=True).start()

            entering.add_done_callback(cleanup)
            raise
        try:
            yield session
        except BaseException as exc:
            await asyncio.to_thread(cm.__exit__, type(exc), exc, exc.__traceback__)
            raise
        else:
            await asyncio.to_thread(cm.__exit__, None, None, None)
