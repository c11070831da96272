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
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .records import SessionMark, clean_reason
from .sensitivity import Sensitivity
from .state import PrivacyState, merge
from .store import PrivacyStore

EXACT = "exact"
BELOW = "below"
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

    @classmethod
    def beside(cls, sessions: PrivacyStore) -> WorkspaceLevels:
        """The folder levels kept next to ``sessions`` (``<store>/../workspace-levels``)."""
        return cls(Path(sessions.root).parent / FOLDER_LEVELS)

    def read(self, workspace: str | os.PathLike[str]) -> PrivacyState:
        """The least state every session with this workspace must have."""
        folder = folder_of(workspace)
        states = [self.store.read(BELOW, _key(folder))]
        for place in (folder, *folder.parents):
            states.append(self.store.read(EXACT, _key(place)))
        return merge(*states)

    def prepare(self, workspace: str | os.PathLike[str]) -> None:
        """Make the records a rise of ``workspace`` writes ready now (see
        :meth:`PrivacyStore.prepare`): the folder's own and every ancestor's."""
        folder = folder_of(workspace)
        self.store.prepare(EXACT, _key(folder))
        for place in folder.parents:
            self.store.prepare(BELOW, _key(place))

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
        folder at that level), unless its own record is that high already."""
        self._record(folder_of(workspace), level, reason)

    def _record(self, folder: Path, level: Sensitivity, reason: str) -> None:
        """:meth:`record` of a folder already resolved: a private session's
        every state read comes through :meth:`rise`, so it is resolved once."""
        if level == Sensitivity.PUBLIC or self.store.read(EXACT, _key(folder)).sensitivity >= level:
            return
        mark = SessionMark.create(level, "workspace", clean_reason(reason))
        self.store.mark(EXACT, _key(folder), mark)
        for place in folder.parents:
            self.store.mark(BELOW, _key(place), mark)

    def exact(self, folder: str | os.PathLike[str]) -> PrivacyState:
        """The record of ``folder`` itself: what a private session with it as
        its workspace left (its files may hold data of that level)."""
        return self.store.read(EXACT, _key(folder_of(folder)))

    def below(self, folder: str | os.PathLike[str]) -> PrivacyState:
        """The record of the private folders strictly inside ``folder``."""
        return self.store.read(BELOW, _key(folder_of(folder)))
