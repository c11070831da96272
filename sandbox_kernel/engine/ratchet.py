"""The engine's view of the private-data ratchet of one session.

Requests from cells are validated here and recorded in the host-side store
(``sandbox_kernel.privacy``); the session then makes sure no sandbox with
network runs after the session turned private.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..outputs.sizing import text_of
from ..privacy import (
    NetworkMode,
    PrivacyState,
    PrivacyStore,
    PrivacyStoreError,
    PrivateData,
    Sensitivity,
    SessionMark,
    merge,
    validate_id,
)
from ..privacy.live_folder import LiveFolder
from ..privacy.records import clean_reason
from ..privacy.workspace_levels import READ_EXACT, WorkspaceLevels, folder_of, read_all_folders
from ..sandbox import BindMount
from .workspace_policy import WorkspaceRefused

SYSTEM_NOTICE = (
    "[SYSTEM] Network access has been restricted because private data entered this "
    "session. Outbound connections are blocked."
)
PRIVATE_ROOT = "/private"
#: characters of a refused ratchet request's error sent back to the cell
MAX_ERROR_TEXT = 1000
#: datasets a session's cells may name; past it, a cell's new dataset raises
#: the level as a mark does, without a record of its own. Each record makes
#: every later write of the session's file longer: a cell adding 2,000 took
#: 154 s of the host's event loop (each request is answered there)
MAX_CELL_DATASETS = 100
#: held by every read and write of a ratchet's state in this process (see
#: ``Ratchet.state``): reentrant, since a write reads the state it raises
READ_LOCK = threading.RLock()
#: what to do about a backend that isolates nothing (said in every refusal)
UNISOLATED_FIX = (
    "Install bubblewrap (package 'bubblewrap') or choose the docker backend "
    "(ToolsConfig.backend / --backend, or --SandboxKernel.backend=docker)."
)


def unisolated_notice(backend: str) -> str:
    """The rise's notice on a backend that isolates nothing (the development
    fallback): there is no network to cut there, and saying it was cut would
    make users trust a session that keeps nothing in."""
    return (
        f"[SYSTEM] Private data entered this session, but its network was NOT cut: the {backend!r} backend "
        "(the development fallback) isolates nothing, so cells and commands run as plain processes with this "
        f"host's network and files. Cells and shell commands of this session are refused from now on. {UNISOLATED_FIX}"
    )


def unisolated_refusal(backend: str) -> str:
    """Why a private session on a backend that isolates nothing runs no more code (fail closed)."""
    return (
        f"refused: this session holds private data and the {backend!r} backend isolates nothing (its network "
        f"was never cut), so no cell or command runs in it any more. {UNISOLATED_FIX}"
    )


#: exposure warnings already logged by this process (each once)
_said_exposed: set[str] = set()


@functools.lru_cache(maxsize=1)
def _always_mounted() -> tuple[str, ...]:
    """``sandbox.bwrap.always_mounted()``, found once per process (the
    interpreter's installation does not move under it)."""
    from ..sandbox.bwrap import always_mounted

    return tuple(always_mounted())


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _overlaps(source: str, place: str) -> bool:
    """Whether a sandbox mounting ``place`` sees (part of) ``source``: the
    source lies in it, is it, or holds it (both resolved)."""
    return _within(source, place) or _within(place, source)


def exposed_sources(sources: Iterable[Path], folders: Iterable[Path]) -> list[tuple[Path, Path]]:
    """Each dataset source that lies in (or is, or holds) a folder the
    session's sandboxes mount, with that folder: paths compared resolved."""
    found = []
    places = [os.path.realpath(f) for f in folders]
    for source in sources:
        real = os.path.realpath(source)
        for place in places:
            if _overlaps(real, place):
                found.append((Path(real), Path(place)))
                break
    return found


def exposed_sources_warning(sources: Iterable[Path], folders: Iterable[Path]) -> str | None:
    """The warning for private dataset sources inside a folder the sandboxes
    mount (their workspace, a read-only mount), or None when there is none.

    Every sandbox hides such a source by a mount over it
    (``engine/workspace_policy.py``). That mount holds only while the file (or
    folder) stays the same: a host program that replaces it by a rename (an
    editor's or pandas' atomic save, ``mv``, ``rsync``, ``git checkout``) or
    deletes and re-creates it detaches the mount in every running sandbox.
    So the folder counts as holding private data (:func:`record_source`), and
    its sandboxes run without network: this says why, once."""
    found = exposed_sources(sources, folders)
    if not found:
        return None
    listed = ", ".join(f"{source} (in {folder})" for source, folder in found)
    return (
        f"private dataset source(s) inside a folder this notebook's sandboxes mount: {listed}. They are hidden "
        "from the sandboxes, but a program on the host that replaces such a file (saves it by renaming a new "
        "copy over it, or deletes and re-creates it: editors, pandas/Excel exports, mv, rsync, git checkout) "
        "makes the new file readable by every sandbox running on that folder. So that folder holds private "
        "data: every sandbox on it runs without network, from its first cell, for good. Keep private data "
        "outside notebook folders (and every folder a sandbox mounts) to keep their network."
    )


def record_source(levels: WorkspaceLevels, mount: PrivateMount) -> None:
    """Record a private dataset's source as a place holding data at its level.

    Why: every sandbox hides a source inside its workspace by a mount over
    it, but a mount holds only while the file stays the same. A host program
    that replaces it (an atomic save: a new copy renamed over it; or a delete
    and re-create) detaches the mount in every running sandbox, and a sandbox
    with network would then read the new contents. So a folder holding a
    source is a folder holding private data, like one a private session wrote
    in: every session whose workspace (or Docker read-only mount) holds it is
    at least at the dataset's level from its first cell, without network (the
    folder levels' ``below`` records, read over every store). Sessions whose
    folders do not hold it are untouched. Recording is raise-only and done
    once (later calls find the record). Failing to record leaves the hiding
    (said in the log)."""
    reason = (
        f"the private dataset {mount.name!r} ({mount.sensitivity.name}) has its source at {mount.source}, in "
        "this folder: a sandbox with network could read it once a program replaced the file"
    )
    try:
        levels.record(mount.source, mount.sensitivity, reason)
    except (PrivacyStoreError, OSError, ValueError) as exc:
        logging.getLogger("sandbox_kernel.engine").warning(
            "could not record private dataset %r's source %s as private: %s", mount.name, mount.source, exc
        )


def sources_held(folders: Iterable[Path]) -> PrivacyState | None:
    """A private state when a dataset source listed host-wide
    (``privacy/dataset_registry.py``) lies in one of ``folders``, else None.

    Why: :func:`record_source` makes such a folder private through the folder
    levels, but its records may fail to be written (a full disk, an unusable
    store) where the list entry was written, or the reverse; either signal
    is enough. The list keeps no level: CONFIDENTIAL, the datasets' default
    (any private level takes the network). A stat of the list's folder while
    it is unchanged; a gone source still counts until its entry expires (a
    program may be writing it again)."""
    from ..privacy import dataset_registry, store_registry

    entries, _ = store_registry._entries(dataset_registry.registry_dir())
    if not entries:
        return None
    # the listed paths are resolved already (dataset_registry.register): only
    # the folders are, here, at every read; and every sandbox sees the places
    # of _always_mounted (a source there is refused, but another process, or
    # an older version, may have listed one)
    places = [os.path.realpath(folder) for folder in folders] + list(_always_mounted())
    found = [(source, place) for _, source in entries for place in places if _overlaps(str(source), place)]
    if not found:
        return None
    source, place = found[0]
    reason = (
        f"a private dataset's source is at {source}, in {place}: a sandbox with network could read it once a "
        "program replaced the file"
    )
    return PrivacyState.build(mark=SessionMark.create(Sensitivity.CONFIDENTIAL, "workspace", clean_reason(reason)))


def folders_level(folders: Sequence[Path], own: WorkspaceLevels | None, written: Sequence[Path] = ()) -> PrivacyState:
    """The least level of a sandbox that mounts ``folders`` and writes in
    ``written`` (its workspace, one of them): their folder levels over every
    store of the host (``own``: the caller's store), and any listed dataset
    source they hold (:func:`sources_held`). Shared by a session's ratchet
    and the Docker shell's manager."""
    found = read_all_folders(folders, own, written)
    held = sources_held(folders)
    return found if held is None else merge(found, held)


@dataclass(frozen=True)
class PrivateMount:
    """A host file or folder mounted read-only at /private/<name>, only into
    sandboxes without network."""

    name: str
    source: Path
    sensitivity: Sensitivity

    @classmethod
    def parse(cls, name: str, spec: Any) -> PrivateMount:
        validate_id(name, "private dataset name")
        if not isinstance(spec, Mapping) or "source" not in spec:
            raise ValueError(
                f"private dataset {name!r}: expected {{'source': PATH, 'sensitivity': LEVEL}}, got {spec!r}"
            )
        source = Path(str(spec["source"])).expanduser().resolve()
        if not source.exists():
            raise ValueError(f"private dataset {name!r}: source {source} does not exist")
        level = Sensitivity.parse(
            spec.get("sensitivity", "CONFIDENTIAL"), what=f"sensitivity of private dataset {name!r}"
        )
        if level == Sensitivity.PUBLIC:
            raise ValueError(f"private dataset {name!r}: sensitivity PUBLIC makes no sense for a private mount")
        for place in _always_mounted():
            if _overlaps(str(source), place):
                raise ValueError(
                    f"private dataset {name!r}: source {source} "
                    f"{'lies in' if _within(str(source), place) else 'holds'} {place}, which every sandbox mounts "
                    "read-only (the Python installation, system folders, the worker's code): it would be readable "
                    "with network. Keep private data elsewhere"
                )
        return cls(name, source, level)


class Ratchet:
    def __init__(
        self,
        user_id: str,
        session_id: str,
        store: PrivacyStore | None = None,
        mounts: Mapping[str, Any] | None = None,
        workspace: Path | None = None,
    ) -> None:
        self.data = PrivateData(user_id, session_id, store)
        self.mounts = {name: PrivateMount.parse(name, spec) for name, spec in (mounts or {}).items()}
        # recorded host-wide before any sandbox starts: every sandbox of every
        # kernel whose workspace holds a source hides it (docs/security.md)
        self.private_sources()
        #: the folder the session's sandboxes mount read-write: its level is
        #: shared with every session whose workspace overlaps it
        self._workspace = LiveFolder(workspace) if workspace is not None else None
        self.folders = WorkspaceLevels.beside(self.data.store) if workspace is not None else None
        #: host folders the sandboxes mount read-only besides the workspace (a
        #: Docker backend's read_only_mounts): their levels count as the folder's
        self.read_folders: tuple[Path, ...] = ()
        #: the last level read from the store, and when (see :meth:`recent_state`)
        self._memo: tuple[float, PrivacyState] | None = None
        #: whether a cell was told that its datasets past MAX_CELL_DATASETS go unlisted
        self._said_cell_cap = False
        #: the highest level recorded for a cell's datasets past
        #: MAX_CELL_DATASETS (as a mark): another at most this high needs no
        #: store read or write
        self._cell_cap_level: Sensitivity | None = None
        #: the same for a cell's marks (kept apart: a dataset named after a
        #: mark is still listed while under the cap)
        self._cell_marked: Sensitivity | None = None
        #: the name of the session's backend when it isolates nothing (set by
        #: whoever chose the backend): :meth:`notice` then says the network
        #: was NOT cut instead of claiming a cut that cannot happen
        self.unisolated: str | None = None
        # a source in the workspace is hidden by a mount that a host-side
        # replace of the file undoes: said once (see exposed_sources_warning)
        self.exposed_sources_notice()

    def prepare(self) -> None:
        """Before the session's first sandbox: make what a later rise needs
        room for on disk (the file store's slots; see ``PrivacyStore.prepare``),
        so a sandbox that fills the disk cannot keep a rise from lasting."""
        self.data.store.prepare(self.user_id, self.session_id)
        if self.folders is not None and self.workspace is not None:
            self.folders.prepare(self.workspace)
            self.folders.prepare_reached([folder_of(self.workspace)])
            for folder in self.read_folders:
                self.folders.prepare(folder, READ_EXACT)

    def note_reached(self, folders: Sequence[Path]) -> None:
        """Record, before a sandbox of this session starts, the folders it
        writes in (:meth:`WorkspaceLevels.note_reached`: a later rise of a
        folder inside one raises it). Raises :class:`WorkspaceRefused` when
        they cannot be recorded: that sandbox must not start."""
        if self.folders is None or not folders:
            return
        try:
            self.folders.note_reached(
                [folder_of(folder) for folder in folders], f"session {self.session_id} of {self.user_id}"
            )
        except (PrivacyStoreError, OSError, ValueError) as exc:
            raise WorkspaceRefused(
                f"could not record that a sandbox works in {folders[0]} in the privacy store ({exc}): the ratchet "
                "needs it to keep the folders inside at their level"
            ) from exc

    @property
    def workspace(self) -> Path | None:
        """The session's folder where it is now (it may have moved on the host
        under a live sandbox, whose mount followed it: :mod:`..privacy.live_folder`)."""
        return self._workspace.path if self._workspace is not None else None

    @property
    def user_id(self) -> str:
        return self.data.user_id

    @property
    def session_id(self) -> str:
        return self.data.session_id

    @property
    def own_state(self) -> PrivacyState:
        """The session's own record (what was raised in or for this session)."""
        return self.data.state

    @property
    def state(self) -> PrivacyState:
        """The session's level: its own, and that of its folder (a private
        session sharing the workspace raises this one too). Read from the
        store every time (a few stat() calls and small reads). One read at a
        time in the process: the cut watchdog's thread reads too, and the
        stores' and folder levels' caches are shared."""
        with READ_LOCK:
            state = self._read_state()
            self._memo = (time.monotonic(), state)
        return state

    def recent_state(self, max_age: float = 0.05) -> PrivacyState:
        """The level as read at most ``max_age`` seconds ago, for hot paths
        (each output's cleaning asks). Enforcement (the network decision of a
        new sandbox, the poll that cuts) reads :attr:`state` itself, and every
        read refreshes this: once a host-side raiser's ``wait=True`` returns,
        the poll's read has been seen here too. Rises made through this object
        forget the memo at once."""
        memo = self._memo
        if memo is not None and time.monotonic() - memo[0] <= max_age:
            return memo[1]
        return self.state

    @property
    def private(self) -> bool:
        """Whether private data entered the session: a level read private
        stays private (raise-only), so only a public one is read again."""
        memo = self._memo
        if memo is not None and memo[1].has_private_data:
            return True
        return self.recent_state().has_private_data

    def _rise_read_folders(self, state: PrivacyState) -> None:
        """A private session's read-only folders are recorded as read by it
        (:meth:`WorkspaceLevels.rise_read`): the sessions working in them
        rise, since a cell of this one can connect to a socket they listen on
        there (an attack review). Those only reading them do not."""
        assert self.folders is not None
        for folder in self.read_folders:
            self.folders.rise_read(folder, state, f"session {self.session_id} of {self.user_id}")

    def _read_state(self) -> PrivacyState:
        own = self.data.state
        workspace = self.workspace
        if self.folders is None or workspace is None:
            return own
        if own.has_private_data:
            try:
                self.folders.rise(workspace, own, f"session {self.session_id} of {self.user_id}")
                self._rise_read_folders(own)
            except (PrivacyStoreError, OSError, ValueError) as exc:
                return merge(own, PrivacyState.build(error=f"the folder's level could not be recorded: {exc}"))
        # every store's records of the folder, not only those beside this
        # session's store: a kernel with another privacy_dir or data_dir may
        # share the folder (privacy/workspace_levels.py, read_all_folders)
        folder = folders_level([workspace, *self.read_folders], self.folders, [workspace])
        if folder.sensitivity <= own.sensitivity and folder.error is None:
            return own  # nothing the session does not already have (its own rise is recorded there too)
        if folder.has_private_data and folder.sensitivity > own.sensitivity:
            # Private because its folder holds (or lies in) a private one: its
            # cells can copy that data anywhere in the folder, so the folder
            # is recorded at that level, and every session in a folder inside
            # it rises too (a sibling of the private folder with network
            # would otherwise receive the copy and send it out). A read that
            # failed closed (a record lost, a full disk) is recorded at the
            # level it answered: the siblings must not stay public meanwhile.
            try:
                self.folders.rise(
                    workspace, folder, f"session {self.session_id} of {self.user_id}, whose folder holds private data,"
                )
                self._rise_read_folders(folder)
            except (PrivacyStoreError, OSError, ValueError) as exc:
                return merge(own, folder, PrivacyState.build(error=f"the folder's level could not be recorded: {exc}"))
        return merge(own, folder)

    def notice(self, state: PrivacyState | None = None) -> str:
        """The [SYSTEM] notice, naming the cause when another session sharing
        the folder made this one private (so nobody is surprised). ``state``:
        the level the caller just read (else read now)."""
        mark = (state if state is not None else self.state).mark
        text = SYSTEM_NOTICE if self.unisolated is None else unisolated_notice(self.unisolated)
        if mark is not None and mark.source == "workspace" and mark.reason:
            return f"{text}\nCause: {mark.reason}."
        return text

    @property
    def network_allowed(self) -> bool:
        return self.state.network_mode == NetworkMode.FULL

    def private_sources(self) -> list[Path]:
        """The configured datasets' sources, each recorded (again: it refreshes
        the entry) in the host-wide list of dataset sources, which the
        workspace policy hides from every sandbox whose workspace holds one,
        and as a private place in the folder levels (:func:`record_source`).
        The caller's own list is hidden even where recording failed."""
        from ..privacy.dataset_registry import register

        if self.mounts:
            levels = WorkspaceLevels.beside(self.data.store)
            for mount in self.mounts.values():
                register(mount.source)
                record_source(levels, mount)
        return [m.source for m in self.mounts.values()]

    def exposed_sources_notice(self) -> str | None:
        """:func:`exposed_sources_warning` for this session's datasets and the
        folders its sandboxes mount (the workspace and :attr:`read_folders`);
        logged as a warning the first time this process finds it."""
        folders = [*([self.workspace] if self.workspace is not None else []), *self.read_folders]
        text = exposed_sources_warning([m.source for m in self.mounts.values()], folders)
        if text is not None and text not in _said_exposed:
            _said_exposed.add(text)
            logging.getLogger("sandbox_kernel.engine").warning("%s", text)
        return text

    def bind_mounts(self) -> list[BindMount]:
        return [BindMount(m.source, f"{PRIVATE_ROOT}/{m.name}", readonly=True) for m in self.mounts.values()]

    def mark(self, level: str, reason: str, source: str) -> PrivacyState:
        with READ_LOCK:
            self._memo = None
            return self.data.mark_private(Sensitivity.parse(level), source=source, reason=reason)

    def handle_request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """A cell asked to raise the ratchet; answer JSON for the worker."""
        with READ_LOCK:
            return self._handle_request(payload)

    def _handle_request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        self._memo = None
        try:
            kind = payload.get("kind")
            if kind == "dataset":
                name = payload.get("name")
                if not isinstance(name, str):
                    raise ValueError(f"dataset name must be a string, not {type(name).__name__}")
                level = Sensitivity.parse(payload.get("sensitivity", "CONFIDENTIAL"))
                capped = self._cell_cap_level
                if capped is not None and level <= capped:
                    # recorded already (a mark at least this high): no store
                    # read or write for a loop of datasets past the cap
                    return {"ok": True, "level": capped.name}
                now = self.recent_state()
                named = sum(1 for d in now.datasets if d.source == "cell")
                if named >= MAX_CELL_DATASETS and name not in {d.name for d in now.datasets}:
                    state = self.data.mark_private(
                        level, source="cell", reason=f"more than {MAX_CELL_DATASETS} datasets named by cells"
                    )
                    self._cell_cap_level = max(level, capped) if capped is not None else level
                    reply = {"ok": True, "level": max(state.sensitivity, self.state.sensitivity).name}
                    if not self._said_cell_cap:  # (once: a loop would print it at every dataset)
                        self._said_cell_cap = True
                        reply["warning"] = (
                            f"dataset {name[:100]!r} and the datasets cells name after it raise the session's "
                            f"level but are not listed: a session lists at most {MAX_CELL_DATASETS} datasets "
                            "named by cells"
                        )
                    return reply
                state = self.data.add_private_dataset(name, level, source="cell")
            elif kind == "mark":
                level = Sensitivity.parse(str(payload.get("sensitivity", "CONFIDENTIAL")))
                marked = self._cell_marked
                if marked is not None and level <= marked:
                    return {"ok": True, "level": marked.name}  # a mark this high is recorded: no store I/O
                state = self.mark(level.name, text_of(payload.get("reason", ""), 1000), "cell")
                self._cell_marked = max(level, marked) if marked is not None else level
            elif kind == "mount":
                name = payload.get("name")
                mount = self.mounts.get(name) if isinstance(name, str) else None
                if mount is None:
                    known = ", ".join(sorted(self.mounts)) or "none"
                    raise ValueError(f"no private dataset named {name!r} is configured (configured: {known})")
                state = self.data.add_private_dataset(mount.name, mount.sensitivity, source="mount")
            else:
                raise ValueError(f"unknown ratchet request {kind!r}")
        except PrivacyStoreError as exc:
            # Not written (a read-only or full store), but in force in this
            # process, which keeps it: the session is private (fail closed), and
            # the cell is told that other processes may not know.
            self._memo = None
            return {"ok": True, "level": self.state.sensitivity.name, "warning": str(exc)}
        except (ValueError, TypeError) as exc:
            # cut: it quotes what the cell sent (a 48 MB name came back whole)
            return {"ok": False, "error": str(exc)[:MAX_ERROR_TEXT]}
        return {"ok": True, "level": max(state.sensitivity, self.state.sensitivity).name}
