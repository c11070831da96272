"""The level of a FOLDER: private data in one session's workspace reaches every
sandbox that can read that folder.

The ratchet is per session, but a workspace is per folder: notebook A (private)
may write rows into its folder, and notebook B in the same folder (public, with
network) would read them. The rule: **a folder's level is the highest level of
any session whose sandbox mounts it, and every session whose workspace
overlaps a private one rises with it**. Overlap both ways counts:

- ``exact(W)``: a session with workspace ``W`` turned private. Every session
  whose workspace is ``W`` or lies inside ``W`` can read what it wrote.
- ``below(A)`` for every strict ancestor ``A`` of ``W``: a session whose
  workspace is ``A`` contains ``W`` and can read it too. Siblings of ``W``
  are not affected.

A session with workspace ``V`` is therefore at least
``max(exact(X) for X in V and its ancestors, below(V))``: one small file read
per ancestor, cached by ``stat`` like every store read. Records are kept in a
:class:`PrivacyStore` of their own (same atomic, raise-only, fail-closed files)
beside the sessions' store, keyed by a hash of the folder's resolved path.

Each record is made twice: under the folder's path, and under its identity
(:mod:`.folder_identity`), which a rename keeps. A private folder renamed by
a host shell (``mv``, where JupyterLab's checks cannot see it) is found again
by its identity, from its new path and from every folder inside it; the read
that finds it records it under its new path too, so the folders now around it
rise as well (``below``), from then on.

**A folder a sandbox worked in holds what it left.** A sandbox whose
workspace ``A`` holds ``W`` and a sibling ``S`` can, while everything is still
public, tie the two: a hard link to one file from both, a unix socket that a
sandbox in ``S`` listens on moved into ``W``, a file a process in ``S`` keeps
open renamed into ``W``. Nothing of that shows in a path, and it outlives the
sandbox: when ``W`` turned private later, the private cell's ``results.csv``
was read from ``S`` by a sandbox with network (an attack review, with real
kernels). So every folder a sandbox mounts writable is recorded as
*reached* (:meth:`WorkspaceLevels.note_reached`, before it starts), and a rise
of ``W`` records each reached strict ancestor at ``W``'s level too
(``exact``): every folder in it rises, as if a session had worked there
after the rise. Under the home rule a sandbox of the home writes only in its
top-level entries (each its own mount, where no link or rename crosses), so
those are what it reaches, not the home.

**Every store counts.** Two processes on one folder may keep their sessions in
different stores (``--SandboxKernel.privacy_dir``, another ``data_dir``,
``ToolsConfig.data_dir``), each with its folder levels beside it. A folder's
level is therefore the highest recorded beside ANY store of the host
(:func:`read_everywhere`): the default store's and every store in the
registry (:mod:`.store_registry`). A store whose records cannot be read
fails closed, as the session's own does; so does a registry that cannot be
listed.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from .folder_identity import folder_identity
from .records import SessionMark, clean_reason
from .sensitivity import Sensitivity
from .state import PrivacyState, merge
from .store import PrivacyStore, PrivacyStoreError

EXACT = "exact"
BELOW = "below"
#: the same records under the folders' identities (renames keep them)
SAME_EXACT = "exact-identity"
SAME_BELOW = "below-identity"
#: a private session's sandbox mounts the folder read-only: what a sandbox
#: working in it leaves there (a unix socket it listens on) reaches that
#: session, so the sessions WRITING in it rise, not those reading it
READ_EXACT = "read-exact"
READ_BELOW = "read-below"
SAME_READ_EXACT = "read-exact-identity"
SAME_READ_BELOW = "read-below-identity"
_SAME = {EXACT: SAME_EXACT, BELOW: SAME_BELOW, READ_EXACT: SAME_READ_EXACT, READ_BELOW: SAME_READ_BELOW}
#: the kind recorded for the ancestors of a folder recorded as ``key``
_BELOW_OF = {EXACT: BELOW, READ_EXACT: READ_BELOW}
#: folders a sandbox mounted writable (by path, and by identity)
REACHED = "reached"
SAME_REACHED = "reached-identity"
#: the level a reached record is kept at (the store keeps levels; any above
#: PUBLIC reads as reached, and an unreadable record fails closed as reached)
_REACHED_MARK_LEVEL = Sensitivity.INTERNAL
#: identities remembered per process (a stat tells whether one still holds)
_IDENTITIES_KEPT = 512
#: the folder levels' store, beside a session store (``<store>/../workspace-levels``)
FOLDER_LEVELS = "workspace-levels"


def _key(path: Path) -> str:
    return "w-" + hashlib.sha256(os.fsencode(str(path))).hexdigest()[:40]


def folder_of(workspace: str | os.PathLike[str]) -> Path:
    """The resolved path that identifies a folder (symlinks followed)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(workspace))))


#: path -> (device, inode, ctime, identity), shared by every store's levels (a
#: folder's identity is the same whichever store asks): a handle is four
#: system calls, a stat one, and reads come four times a second per session
_identities: dict[Path, tuple[int, int, int, str | None]] = {}


def identity_of(folder: Path) -> str | None:
    """The identity of the (resolved) folder at ``folder`` now, or None if
    there is none. Kept while a ``stat`` finds the same inode with the same
    change time: a folder made anew gets a new one even where it reuses a
    removed folder's inode number (ext4 does so at once)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    seen = (st.st_dev, st.st_ino, st.st_ctime_ns)
    known = _identities.get(folder)
    if known is not None and known[:3] == seen:
        return known[3]
    found = folder_identity(folder)
    if len(_identities) >= _IDENTITIES_KEPT:
        _identities.clear()
    _identities[folder] = (*seen, found)
    return found


class WorkspaceLevels:
    """Raise-only levels of folders, next to a session store."""

    def __init__(self, root: Path | str) -> None:
        self.store = PrivacyStore(Path(root))

    @classmethod
    def beside(cls, sessions: PrivacyStore) -> WorkspaceLevels:
        """The folder levels kept next to ``sessions`` (``<store>/../workspace-levels``)."""
        return cls(Path(sessions.root).parent / FOLDER_LEVELS)

    def identity(self, folder: Path) -> str | None:
        """The identity of the (resolved) folder at ``folder`` now, or None if
        there is none (:func:`identity_of`)."""
        return identity_of(folder)

    def read(self, workspace: str | os.PathLike[str]) -> PrivacyState:
        """The least state every session with this workspace must have."""
        folder = folder_of(workspace)
        states = [self._below(folder)]
        for place in (folder, *folder.parents):
            states.append(self._exact(place))
        return merge(*states)

    def read_written(self, workspace: str | os.PathLike[str]) -> PrivacyState:
        """The least state of every session whose sandbox WRITES in
        ``workspace``, from the private sessions that mount a folder
        overlapping it read-only (:meth:`rise_read`): a cell there may listen
        on a unix socket in that folder, which a private cell connects to.
        The sessions only reading the folder are not raised by it."""
        folder = folder_of(workspace)
        states = [self._both(folder, READ_BELOW)]
        for place in (folder, *folder.parents):
            states.append(self._both(place, READ_EXACT))
        return merge(*states)

    def prepare(self, workspace: str | os.PathLike[str], exact: str = EXACT) -> None:
        """Make the records a rise of ``workspace`` writes ready now (see
        :meth:`PrivacyStore.prepare`): the folder's own and every ancestor's
        (``exact``: :data:`READ_EXACT` for a folder read-only mounted,
        :meth:`rise_read`)."""
        folder = folder_of(workspace)
        for kind, place in [(exact, folder)] + [(_BELOW_OF[exact], above) for above in folder.parents]:
            self.store.prepare(kind, _key(place))
            same = self.identity(place)
            if same is not None:
                self.store.prepare(_SAME[kind], same)

    def prepare_reached(self, folders: Iterable[Path]) -> None:
        """Make the records :meth:`note_reached` writes for ``folders`` ready now
        (a sandbox may fill the disk before the next one starts)."""
        for folder in folders:
            self.store.prepare(REACHED, _key(folder))
            same = self.identity(folder)
            if same is not None:
                self.store.prepare(SAME_REACHED, same)

    def note_reached(self, folders: Iterable[Path], who: str) -> None:
        """Record that a sandbox of ``who`` mounts each of ``folders`` (resolved
        paths) writable: what it leaves there (a link, a socket, an open file
        moved) may tie the folders inside together, so a later rise of one of
        them raises the folder (see the module's doc). Raises
        :class:`PrivacyStoreError` when a record cannot be written: the caller
        must not start the sandbox then."""
        for folder in folders:
            missing = self._reached_missing(folder)
            if not missing:
                continue
            mark = SessionMark.create(
                _REACHED_MARK_LEVEL, "workspace", clean_reason(f"a sandbox of {who} worked in {folder}")
            )
            self._mark_all(missing, mark)

    def _reached_missing(self, folder: Path) -> list[tuple[str, str | None]]:
        """The reached records of ``folder`` this store lacks, the identity's
        first. Each is looked at on its own: a folder made anew at a path
        recorded before has a new identity, and with the path's record alone
        a host ``mv`` of it later left the reached rule behind (an attack
        review: a link its sandbox left then carried private rows to a
        sibling with network). An unreadable record is not written again:
        every read of it fails closed already."""
        missing: list[tuple[str, str | None]] = []
        same = self.identity(folder)
        if same is not None and self._unmarked(self.store.read(SAME_REACHED, same)):
            missing.append((SAME_REACHED, same))
        if self._unmarked(self.store.read(REACHED, _key(folder))):
            missing.append((REACHED, _key(folder)))
        return missing

    @staticmethod
    def _unmarked(state: PrivacyState) -> bool:
        return state.error is None and state.sensitivity == Sensitivity.PUBLIC

    def _reached_here(self, folder: Path) -> bool:
        """Whether this store holds ``folder`` as reached (an unreadable record
        counts: fail closed)."""
        by_path = self.store.read(REACHED, _key(folder))
        if by_path.error is not None or by_path.sensitivity > Sensitivity.PUBLIC:
            return True
        same = self.identity(folder)
        if same is None:
            return False
        by_identity = self.store.read(SAME_REACHED, same)
        return by_identity.error is not None or by_identity.sensitivity > Sensitivity.PUBLIC

    def rise(self, workspace: str | os.PathLike[str], state: PrivacyState, who: str) -> None:
        """Record that a session with ``workspace`` reached ``state``'s level
        (no-op for a public state, and once the records are that high)."""
        if not state.has_private_data:
            return
        folder = folder_of(workspace)
        self._record(
            folder,
            state.sensitivity,
            f"{who} became {state.sensitivity.name} with this folder ({folder}) as its workspace",
        )

    def rise_read(self, folder: str | os.PathLike[str], state: PrivacyState, who: str) -> None:
        """Record that a sandbox of ``who``, at ``state``'s level, mounts
        ``folder`` read-only. A read-only mount keeps a cell from writing
        there, not from connecting to a unix socket that a sandbox working in
        the folder listens on (an attack review): every session writing in
        it (:meth:`read_written`) rises, not the other readers (a shared
        reference dataset, the host's Python in a test image)."""
        if not state.has_private_data:
            return
        place = folder_of(folder)
        self._record(
            place,
            state.sensitivity,
            f"{who} became {state.sensitivity.name} and mounts this folder ({place}) read-only: a sandbox working "
            "there could take its data through a socket",
            exact=READ_EXACT,
        )

    def record_read(self, folder: str | os.PathLike[str], level: Sensitivity, reason: str) -> None:
        """:meth:`rise_read` at ``level``, with the caller's reason."""
        self._record(folder_of(folder), level, reason, exact=READ_EXACT)

    def record(self, workspace: str | os.PathLike[str], level: Sensitivity, reason: str) -> None:
        """Record ``workspace`` at ``level`` (and its ancestors as holding a
        folder at that level), unless its own records are that high already."""
        self._record(folder_of(workspace), level, reason)

    def record_resolved(self, folder: Path, level: Sensitivity, reason: str) -> None:
        """:meth:`record` of a path the caller found through no link: not
        resolved again, since a link a sandbox put at its place meanwhile
        would send the record elsewhere."""
        self._record(folder, level, reason)

    def recorded(self, folder: Path) -> PrivacyState:
        """The record kept under the path ``folder`` (found through no link),
        without its identity's: for a check that must not look at the folder,
        where a sandbox may be swapping names. It can only be lower than
        :meth:`exact`."""
        return self.store.read(EXACT, _key(folder))

    def _record(self, folder: Path, level: Sensitivity, reason: str, exact: str = EXACT) -> None:
        """:meth:`record` of a folder already resolved: a private session's
        every state read comes through :meth:`rise`, so it is resolved once.
        The identities are recorded first: a crash between the two leaves a
        folder that a rename cannot make public, rather than the reverse.
        ``exact``: :data:`READ_EXACT` records a folder a private session
        reads (:meth:`rise_read`), and its ancestors as :data:`READ_BELOW`."""
        if level == Sensitivity.PUBLIC:
            return
        below = _BELOW_OF[exact]
        same = self.identity(folder)
        # a read that failed closed (SECRET, with an error) is not a record at
        # that level: it is written again (an unreadable record, a lost one)
        by_identity = self.store.read(_SAME[exact], same) if same is not None else None
        identity_low = by_identity is not None and (by_identity.error is not None or by_identity.sensitivity < level)
        by_path = self.store.read(exact, _key(folder))
        if not identity_low and by_path.error is None and by_path.sensitivity >= level:
            return
        mark = SessionMark.create(level, "workspace", clean_reason(reason))
        records: list[tuple[str, str | None]] = [(_SAME[exact], same)] if identity_low else []
        records += [(_SAME[below], self.identity(place)) for place in folder.parents]
        records += [(exact, _key(folder))] + [(below, _key(place)) for place in folder.parents]
        # a folder around this one that a sandbox worked in may hold links,
        # sockets or moved files into it: it rises too, and what is in it
        # (for a folder read-only mounted: what works in it)
        tied = reached_ancestors(folder, self)
        if tied:
            tied_records: list[tuple[str, str | None]] = []
            for place in tied:
                tied_records += [(_SAME[exact], self.identity(place)), (exact, _key(place))]
            tied_mark = SessionMark.create(
                level,
                "workspace",
                clean_reason(
                    f"{reason}; a sandbox worked in {tied[0]}, which holds that folder, before: what it left there "
                    "may tie the folder's other subfolders to it"
                ),
            )
            # the folders around first: a crash between the two leaves them higher, not lower
            self._mark_all(tied_records, tied_mark)
        self._mark_all(records, mark)

    def _mark_all(self, records: Sequence[tuple[str, str | None]], mark: SessionMark) -> None:
        """Mark every record, even when one cannot be written (a full disk
        still leaves each its prepared high-water slot); the first failure is
        raised after the rest were tried."""
        failed: PrivacyStoreError | None = None
        for kind, key in records:
            if key is None:
                continue
            try:
                self.store.mark(kind, key, mark)
            except PrivacyStoreError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def exact(self, folder: str | os.PathLike[str]) -> PrivacyState:
        """The records of ``folder`` itself: what a private session with it as
        its workspace left (its files may hold data of that level), wherever
        the folder was then."""
        return self._exact(folder_of(folder))

    def below(self, folder: str | os.PathLike[str]) -> PrivacyState:
        """The records of the private folders strictly inside ``folder``."""
        return self._below(folder_of(folder))

    def _exact(self, folder: Path) -> PrivacyState:
        return self._both(folder, EXACT)

    def _below(self, folder: Path) -> PrivacyState:
        return self._both(folder, BELOW)

    def _both(self, folder: Path, kind: str) -> PrivacyState:
        """The path's record and the identity's, merged. An identity higher
        than its path was renamed here outside JupyterLab: recorded under the
        path now, with its ancestors, so the folders around its new place
        rise too (best effort: the merged state holds either way)."""
        by_path = self.store.read(kind, _key(folder))
        same = self.identity(folder)
        if same is None:
            return by_path
        by_identity = self.store.read(_SAME[kind], same)
        if by_identity.sensitivity <= by_path.sensitivity:
            return merge(by_path, by_identity) if by_identity.error else by_path
        why = by_identity.mark.reason if by_identity.mark is not None else by_identity.sensitivity.name
        level = by_identity.sensitivity
        try:
            # the first cause first: the widget shows the start of a reason
            if kind in _BELOW_OF:
                self._record(folder, level, f"{why}; that folder was moved to {folder} outside JupyterLab", kind)
            else:
                reason = f"{why}; that folder was moved into {folder} outside JupyterLab"
                self._mark_below(folder, SessionMark.create(level, "workspace", clean_reason(reason)), kind)
        except (OSError, ValueError):
            pass  # not recorded under the path: the identity still holds the level
        return merge(by_path, by_identity)

    def _mark_below(self, folder: Path, mark: SessionMark, kind: str = BELOW) -> None:
        """``folder`` and its ancestors hold a private folder (found inside
        ``folder`` by its identity)."""
        self._mark_all([(kind, _key(place)) for place in (folder, *folder.parents)], mark)


#: the folder levels of every store this process has read, kept so that their
#: identity caches (and the stores' stat caches) last from one read to the next
_kept: dict[Path, WorkspaceLevels] = {}
_kept_lock = threading.Lock()


def levels_at(root: Path) -> WorkspaceLevels:
    """The (kept) folder levels whose own store is at ``root``
    (``<store>/../workspace-levels``)."""
    with _kept_lock:
        found = _kept.get(root)
        if found is None:
            if len(_kept) >= _IDENTITIES_KEPT:
                _kept.clear()
            found = _kept[root] = WorkspaceLevels(root)
        return found


#: (own root, every store's root) -> the folder-levels roots but own's
_places: dict[tuple[Path | None, tuple[Path, ...]], list[Path]] = {}


def _candidates(own: WorkspaceLevels | None) -> tuple[list[Path], str | None]:
    """The folder-levels roots beside every store of the host but ``own``'s
    (the default store's, then each registered store's), whether or not they
    exist, and a sentence when the store registry cannot be read."""
    from .store_registry import all_store_roots

    roots, problem = all_store_roots()
    mine = Path(own.store.root) if own is not None else None
    key = (mine, tuple(roots))
    found = _places.get(key)
    if found is None:
        seen = {mine} if mine is not None else set()
        found = []
        for root in roots:
            place = Path(root).parent / FOLDER_LEVELS
            if place not in seen:
                seen.add(place)
                found.append(place)
        if len(_places) >= _OTHERS_KEPT:
            _places.clear()
        _places[key] = found
    return list(found), problem


def reached_ancestors(folder: Path, own: WorkspaceLevels | None = None) -> list[Path]:
    """The strict ancestors of ``folder`` (resolved) that a sandbox mounted
    writable (:meth:`WorkspaceLevels.note_reached`), by the records beside any
    store of the host, nearest first. An unreadable record counts as reached
    (fail closed). A store registry that cannot be read leaves out the stores
    it would list: meanwhile every folder's level reads SECRET anyway
    (:func:`read_all_folders`), and raising every ancestor (up to ``/``) for
    good would make every folder of the host private."""
    places, _ = _candidates(own)
    levels = _existing_levels(own, places)
    return [place for place in folder.parents if any(one._reached_here(place) for one in levels)]


def _existing_levels(own: WorkspaceLevels | None, places: Sequence[Path]) -> list[WorkspaceLevels]:
    """``own`` and the folder levels at ``places`` that exist: a store's
    levels count when their folder or its high-water marks exist (without
    either, every read of them is PUBLIC)."""
    from .store import _highwater_root

    levels = [own] if own is not None else []
    levels += [
        levels_at(place) for place in places if os.path.lexists(place) or os.path.lexists(_highwater_root(place))
    ]
    return levels


def read_everywhere(workspace: str | os.PathLike[str], own: WorkspaceLevels | None = None) -> PrivacyState:
    """The least state of every session whose sandbox can read ``workspace``
    (:meth:`WorkspaceLevels.read`) over the folder levels beside every store
    of the host (the default store's and each registered store's). Fails closed: an unreadable record
    in any of them, or an unreadable registry, makes the answer SECRET."""
    return read_all_folders([workspace], own)


#: a reading of the stores' levels is reused only when everything it looked
#: at is older than this (timestamps are coarse: a change within the same tick
#: as the reading would otherwise go unseen), as the stores' own caches do
_SETTLE_NS = 2_000_000_000
#: (folders, written folders, stores) -> (what the reading looked at, its
#: state): see read_all_folders
_readings: dict[
    tuple[tuple[Path, ...], tuple[Path, ...], tuple[Path, ...]], tuple[tuple[object, ...], PrivacyState]
] = {}
_OTHERS_KEPT = 256


#: the record folders of a store (under its root and its high-water root)
_KINDS = (EXACT, BELOW, SAME_EXACT, SAME_BELOW, READ_EXACT, READ_BELOW, SAME_READ_EXACT, SAME_READ_BELOW)
#: folder-levels root -> for it and its high-water root, the root and its
#: record folders (as strings: a fingerprint takes ten per store, four times a
#: second, and building paths cost more than the lstat calls)
_watched: dict[Path, tuple[tuple[str, ...], ...]] = {}


def _record_folders(root: Path) -> tuple[tuple[str, ...], ...]:
    found = _watched.get(root)
    if found is None:
        from .store import _highwater_root

        found = tuple(
            (str(base), *(os.path.join(base, kind) for kind in _KINDS)) for base in (root, _highwater_root(root))
        )
        if len(_watched) >= _OTHERS_KEPT:
            _watched.clear()
        _watched[root] = found
    return found


def _fingerprint(folders: Sequence[Path], places: Sequence[Path]) -> tuple[object, ...] | None:
    """What a reading of the folder levels at ``places`` for ``folders``
    depends on: the identity of each folder and ancestor (what the records
    are keyed by besides the path: :func:`identity_of`, one ``stat`` each
    while a folder is unchanged), and each store's record folders (every
    record and marker is made, replaced or removed by a rename or unlink in
    one of them, which moves its mtime; a store not made yet is one missing
    folder). Not the folders' own times: a workspace changes whenever a cell
    writes a file there, and the reading would never be reused. None when a
    store changed too recently to be trusted, or cannot be looked at: read
    again then."""
    parts: list[object] = [identity_of(place) for folder in folders for place in (folder, *folder.parents)]
    oldest_allowed = time.time_ns() - _SETTLE_NS
    try:
        for root in places:
            for base in _record_folders(root):
                top = _settled(base[0], oldest_allowed)
                parts.append(top)
                if top is None:
                    continue  # nothing can be inside a store not made
                for place in _present_kinds(base, top):
                    parts.append(_settled(place, oldest_allowed))
    except _Unsettled:
        return None
    except OSError:
        return None
    return tuple(parts)


class _Unsettled(Exception):
    """A record folder changed within the last ``_SETTLE_NS``."""


def _settled(place: str, oldest_allowed: int) -> tuple[int, int, int, int] | None:
    """``place``'s (device, inode, mtime, ctime), None when it is missing;
    raises :class:`_Unsettled` when it changed too recently to be trusted."""
    try:
        st = os.lstat(place)
    except FileNotFoundError:
        return None
    if st.st_ctime_ns >= oldest_allowed:
        raise _Unsettled(place)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


#: a store's root (as a string) -> (its stat when looked at, its record
#: folders that existed then)
_present: dict[str, tuple[tuple[int, int, int, int], tuple[str, ...]]] = {}


def _present_kinds(base: tuple[str, ...], top: tuple[int, int, int, int]) -> tuple[str, ...]:
    """The record folders of ``base`` that exist: listed again only when the
    root changed (a folder made or removed in it moves its mtime). Most
    stores hold a few of the eight kinds, and a fingerprint looks at every
    registered store four times a second: on a machine with 34 stores, the
    read-only kinds (this stop's) had made each reading 0.5 ms dearer."""
    known = _present.get(base[0])
    if known is not None and known[0] == top:
        return known[1]
    kinds = tuple(place for place in base[1:] if os.path.lexists(place))
    if len(_present) >= _OTHERS_KEPT:
        _present.clear()
    _present[base[0]] = (top, kinds)
    return kinds


def read_all_folders(
    folders: Iterable[str | os.PathLike[str]],
    own: WorkspaceLevels | None = None,
    written: Iterable[str | os.PathLike[str]] = (),
) -> PrivacyState:
    """:func:`read_everywhere` of several folders (a container's workspace and
    its read-only mounts) at once: the highest of them. ``written``: the
    folders among them the sandbox writes in (its workspace), which a private
    session reading them raises too (:meth:`WorkspaceLevels.read_written`).

    A reading of every store (``own``, the caller's, among them) is reused
    while nothing it looked at changed (see :func:`_fingerprint`: about ten
    ``lstat`` per store and one ``stat`` per folder and ancestor, instead of a
    few reads per ancestor and store: sessions read four times a second); a
    reading that failed closed is never reused."""

    resolved = tuple(folder_of(folder) for folder in folders)
    writes = tuple(folder_of(folder) for folder in written)
    places, problem = _candidates(own)
    watched = [Path(own.store.root), *places] if own is not None else places
    key = (resolved, writes, tuple(watched))
    seen = _fingerprint(resolved + writes, watched)
    cached = _readings.get(key)
    if seen is not None and cached is not None and cached[0] == seen:
        found = cached[1]
    else:
        levels = _existing_levels(own, places)
        found = merge(
            PrivacyState.public(),
            *(one.read(folder) for folder in resolved for one in levels),
            *(one.read_written(folder) for folder in writes for one in levels),
        )
        if seen is not None and found.error is None and seen == _fingerprint(resolved + writes, watched):
            if len(_readings) >= _OTHERS_KEPT:
                _readings.clear()
            _readings[key] = (seen, found)
    if problem is None:
        return found
    return merge(found, PrivacyState.build(error=f"{problem}; folder levels kept beside other stores are unknown"))
