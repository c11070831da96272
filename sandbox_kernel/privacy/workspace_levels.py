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
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
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
_SAME = {EXACT: SAME_EXACT, BELOW: SAME_BELOW}
#: identities remembered per process (a stat tells whether one still holds)
_IDENTITIES_KEPT = 512
#: the folder levels' store, beside a session store (``<store>/../workspace-levels``)
FOLDER_LEVELS = "workspace-levels"


def _key(path: Path) -> str:
    return "w-" + hashlib.sha256(os.fsencode(str(path))).hexdigest()[:40]


def folder_of(workspace: str | os.PathLike[str]) -> Path:
    """The resolved path that identifies a folder (symlinks followed)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(workspace))))


class WorkspaceLevels:
    """Raise-only levels of folders, next to a session store."""

    def __init__(self, root: Path | str) -> None:
        self.store = PrivacyStore(Path(root))
        #: path -> (device, inode, ctime, identity): a handle is four system
        #: calls, a stat one, and reads come four times a second per session
        self._identities: dict[Path, tuple[int, int, int, str | None]] = {}

    @classmethod
    def beside(cls, sessions: PrivacyStore) -> WorkspaceLevels:
        """The folder levels kept next to ``sessions`` (``<store>/../workspace-levels``)."""
        return cls(Path(sessions.root).parent / FOLDER_LEVELS)

    def identity(self, folder: Path) -> str | None:
        """The identity of the (resolved) folder at ``folder`` now, or None if
        there is none. Kept while a ``stat`` finds the same inode with the
        same change time: a folder made anew gets a new one even where it
        reuses a removed folder's inode number (ext4 does so at once)."""
        try:
            st = os.stat(folder)
        except OSError:
            return None
        seen = (st.st_dev, st.st_ino, st.st_ctime_ns)
        known = self._identities.get(folder)
        if known is not None and known[:3] == seen:
            return known[3]
        found = folder_identity(folder)
        if len(self._identities) >= _IDENTITIES_KEPT:
            self._identities.clear()
        self._identities[folder] = (*seen, found)
        return found

    def read(self, workspace: str | os.PathLike[str]) -> PrivacyState:
        """The least state every session with this workspace must have."""
        folder = folder_of(workspace)
        states = [self._below(folder)]
        for place in (folder, *folder.parents):
            states.append(self._exact(place))
        return merge(*states)

    def prepare(self, workspace: str | os.PathLike[str]) -> None:
        """Make the records a rise of ``workspace`` writes ready now (see
        :meth:`PrivacyStore.prepare`): the folder's own and every ancestor's."""
        folder = folder_of(workspace)
        for kind, place in [(EXACT, folder)] + [(BELOW, above) for above in folder.parents]:
            self.store.prepare(kind, _key(place))
            same = self.identity(place)
            if same is not None:
                self.store.prepare(_SAME[kind], same)

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

    def _record(self, folder: Path, level: Sensitivity, reason: str) -> None:
        """:meth:`record` of a folder already resolved: a private session's
        every state read comes through :meth:`rise`, so it is resolved once.
        The identities are recorded first: a crash between the two leaves a
        folder that a rename cannot make public, rather than the reverse."""
        if level == Sensitivity.PUBLIC:
            return
        same = self.identity(folder)
        identity_low = same is not None and self.store.read(SAME_EXACT, same).sensitivity < level
        if not identity_low and self.store.read(EXACT, _key(folder)).sensitivity >= level:
            return
        mark = SessionMark.create(level, "workspace", clean_reason(reason))
        records: list[tuple[str, str | None]] = [(SAME_EXACT, same)] if identity_low else []
        records += [(SAME_BELOW, self.identity(place)) for place in folder.parents]
        records += [(EXACT, _key(folder))] + [(BELOW, _key(place)) for place in folder.parents]
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
            if kind == EXACT:
                self._record(folder, level, f"{why}; that folder was moved to {folder} outside JupyterLab")
            else:
                reason = f"{why}; that folder was moved into {folder} outside JupyterLab"
                self._mark_below(folder, SessionMark.create(level, "workspace", clean_reason(reason)))
        except (OSError, ValueError):
            pass  # not recorded under the path: the identity still holds the level
        return merge(by_path, by_identity)

    def _mark_below(self, folder: Path, mark: SessionMark) -> None:
        """``folder`` and its ancestors hold a private folder (found inside
        ``folder`` by its identity)."""
        self._mark_all([(BELOW, _key(place)) for place in (folder, *folder.parents)], mark)
