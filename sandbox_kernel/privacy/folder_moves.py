"""A folder's level goes where its files go.

The ratchet records a private session's workspace under the folder's path
(:mod:`.workspace_levels`), so the record stayed behind when the folder moved:
a private session's "Untitled Folder", renamed "analysis" in JupyterLab's file
browser, was public again, and the next notebook opened in it had network with
the private session's files beside it. Moving a private file into a public
folder did the same for that file. So, before the host moves or copies
anything for a user (the Lab server's contents API, :mod:`sandbox_kernel.lab_folder_moves`):

- **A folder that moves takes its levels along.** Each record of the folder and
  of the folders inside it is made again at the new place, and the folder gets
  the level of the private folder it leaves (its files were written there),
  before the move: a crash in between leaves a record too many, never one
  too few.
- **Private data is not moved or copied into a folder of a lower level**
  otherwise: a file moved out of a private folder, and a copy of a file or
  folder holding private data. A file has no level of its own, and raising the
  destination would cut the network of every notebook there, for good, over a
  drag; the refusal says how to do it on purpose. A copy's new name is chosen
  by the contents manager after this check, so its records could not be made
  first.
- **No folder leaves the workspace of a sandbox with network**: a cell may
  keep a descriptor open on it and reach it at its new place, where a private
  session may later write. The workspace itself (or a folder holding it) may
  move: the sandbox's mount follows it, and so does its session
  (:mod:`.live_folder`), but not into a private folder, whose level it would
  read only at its next poll. Live sandboxes are found in the holders'
  reports (:mod:`.enforcement`).
- **A folder holding private data does not land where a sandbox with network
  works** (in the place it goes to, or around it): the records made at the new
  place raise that sandbox's session, but it reads them only at its next poll,
  after the files arrived. Folders that hold such a sandbox's workspace rise
  too, as for any private folder put inside them.
- **A store that cannot be read refuses** the move (fails closed) and names it.

Every store of the host counts: the default one and those recorded in the
registry (:mod:`.store_registry`), as every sandbox start reads them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

from .enforcement import networked_workspaces
from .sensitivity import Sensitivity
from .state import PrivacyState
from .store import PrivacyStore, default_store
from .store_registry import registered_stores
from .workspace_levels import WorkspaceLevels, folder_of

#: how a refusal names a path (the Lab server shows paths relative to its root)
Shown = Callable[[Path], str]


class MoveRefused(Exception):
    """The move or copy is refused: it would put private data within reach of a
    sandbox with network, or a record it depends on cannot be read (the message says which)."""


class TargetTaken(MoveRefused):
    """A folder's move onto a name that is taken (its levels cannot be recorded there)."""


@dataclass(frozen=True)
class _Level:
    level: Sensitivity
    folder: Path | None = None  # the folder whose record sets it
    reason: str = ""


@dataclass(frozen=True)
class _Plan:
    """What one store says about the data at a source."""

    levels: WorkspaceLevels
    around: _Level  # the highest private folder the source lies in
    inside: tuple[tuple[PurePath, _Level], ...]  # records of the source folder and the folders in it
    #: the record of the private folders anywhere inside a source folder: it
    #: counts even where the walk of :func:`_inside` does not find them (a
    #: sandbox moved one into a new folder of its own, which has no record)
    below: _Level = _Level(Sensitivity.PUBLIC)

    @property
    def highest(self) -> _Level:
        return max([self.around, self.below, *(level for _, level in self.inside)], key=lambda x: x.level)


def every_store() -> list[Path]:
    """The root of every ratchet store of this host."""
    return list(dict.fromkeys([default_store().root, *registered_stores()]))


def _levels(stores: Iterable[Path]) -> list[tuple[Path, WorkspaceLevels]]:
    return [(Path(root), WorkspaceLevels.beside(PrivacyStore(root))) for root in stores]


def _read(levels: WorkspaceLevels, state: PrivacyState, folder: Path, shown: Shown) -> _Level:
    if state.error is not None:
        raise MoveRefused(
            f"the ratchet's record of {shown(folder)} in {levels.store.root} cannot be read ({state.error}), "
            "so nothing was moved or copied"
        )
    reason = state.mark.reason if state.mark is not None else ""
    return _Level(state.sensitivity, folder, reason)


def _around(levels: WorkspaceLevels, folder: Path, shown: Shown, by_path: bool = False) -> _Level:
    """The highest record of ``folder`` and the folders holding it: every
    session that can read a file in ``folder`` is at least that private.
    ``by_path``: the records kept under the paths only, which no swap of
    names can raise (a lower bound, for refusals of a place less private)."""
    best = _Level(Sensitivity.PUBLIC)
    for place in (folder, *folder.parents):
        found = _read(levels, levels.recorded(place) if by_path else levels.exact(place), place, shown)
        if found.level > best.level:
            best = found
    return best


def _inside(levels: WorkspaceLevels, root: Path, shown: Shown) -> tuple[tuple[PurePath, _Level], ...]:
    """The records of ``root`` and of the folders in it. Only branches whose
    "below" record says they hold a private folder are listed, so a large tree
    without one costs two reads."""
    found: list[tuple[PurePath, _Level]] = []
    todo = [PurePath()]
    while todo:
        relative = todo.pop()
        here = root / relative
        own = _read(levels, levels.exact(here), here, shown)
        if own.level > Sensitivity.PUBLIC:
            found.append((relative, own))
        if _read(levels, levels.below(here), here, shown).level == Sensitivity.PUBLIC:
            continue
        try:
            with os.scandir(here) as entries:
                todo += [relative / e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            raise MoveRefused(
                f"{shown(here)} holds a private folder and cannot be listed to carry its level ({exc.strerror}), "
                "so nothing was moved or copied"
            ) from None
    return tuple(found)


def _place(path: str | os.PathLike[str]) -> Path:
    """``path`` with its folder resolved and its own name kept: a link is
    moved as a link, not as the folder it names."""
    path = Path(os.path.abspath(os.fspath(path)))
    return folder_of(path.parent) / path.name


def _is_folder(path: Path, shown: Shown) -> bool:
    """True for a folder, False for a file or a link: a link is judged as a
    file (it moves itself, not what it names), since a sandbox may put a file
    or a folder at its name before the move runs. Nothing there is refused:
    a guard that passed over an absent name would let whatever a sandbox
    puts there a moment later go unchecked."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError as exc:
        raise MoveRefused(
            f"{shown(path)} cannot be looked at ({exc.strerror}), so nothing was moved or copied"
        ) from None


def _where(
    source: str | os.PathLike[str],
    other: str | os.PathLike[str],
    is_folder: bool | None,
    shown: Shown,
    resolve: Callable[[str | os.PathLike[str]], Path],
) -> tuple[Path, Path, bool]:
    """The source's place, the other path's (resolved by ``resolve``) and
    whether the source is a folder; given ``is_folder``, the paths are real
    ones the caller found through no link, and are taken as they are."""
    if is_folder is None:
        place = _place(source)
        return place, resolve(other), _is_folder(place, shown)
    return Path(os.path.abspath(source)), Path(os.path.abspath(other)), is_folder


def _plans(source: Path, stores: Iterable[Path], folder: bool, shown: Shown) -> list[_Plan]:
    return [
        _Plan(
            levels,
            _around(levels, source.parent, shown),
            _inside(levels, source, shown) if folder else (),
            _read(levels, levels.below(source), source, shown) if folder else _Level(Sensitivity.PUBLIC),
        )
        for _, levels in _levels(stores)
    ]


def _networked_holders(stores: Iterable[Path]) -> list[tuple[Path, int]]:
    """Every live sandbox with network: its workspace, its kernel's pid."""
    return [(Path(workspace), pid) for root in stores for workspace, pid in networked_workspaces(Path(root))]


def _holder_around(source: Path, holders: list[tuple[Path, int]]) -> tuple[Path, int] | None:
    """The sandbox with network (of ``holders``) whose workspace holds
    ``source``: a cell there may keep it open and reach it wherever it goes."""
    return next(((w, pid) for w, pid in holders if w != source and source.is_relative_to(w)), None)


def _live_sandbox(
    source: Path, target: Path, holders: list[tuple[Path, int]], stores: Iterable[Path], shown: Shown
) -> str | None:
    """Why ``source`` (a folder) must not move while a sandbox with network
    (one of ``holders``) works in it, around it or inside it; None if it may."""
    if (around := _holder_around(source, holders)) is not None:
        workspace, pid = around
        return (
            f"Not moved: {shown(source)} is inside the folder of a sandbox with network (kernel process "
            f"{pid}, working in {shown(workspace)}), and a cell there may keep it open and reach it at its "
            "new place. Shut that notebook's kernel down first, then move the folder."
        )
    inside = [(workspace, pid) for workspace, pid in holders if workspace.is_relative_to(source)]
    if not inside:
        return None
    # The sandbox follows its folder (privacy/live_folder.py), but reads the
    # level of the new place only at its next poll.
    for _, levels in _levels(stores):
        there = _around(levels, target.parent, shown)
        if there.level > Sensitivity.PUBLIC:
            workspace, pid = inside[0]
            return (
                f"Not moved: a sandbox with network (kernel process {pid}) works in {shown(workspace)}, and "
                f"{shown(target.parent)} is {there.level.name}: it would work beside private data until its "
                "network is cut. Shut that notebook's kernel down first, then move the folder."
            )
    return None


def _held_file(source: Path, target: Path, holders: list[tuple[Path, int]], shown: Shown) -> str | None:
    """Why the file ``source`` must not go into the private folder of
    ``target`` while a sandbox with network works where it is: a cell may keep
    it open and read what a private session writes into it there."""
    if (around := _holder_around(source, holders)) is None:
        return None
    workspace, pid = around
    return (
        f"Not moved: {shown(source)} is in the folder of a sandbox with network (kernel process {pid}, "
        f"working in {shown(workspace)}), and {shown(target.parent)} is private: a cell there may keep the "
        "file open and read what a private session writes into it. Shut that notebook's kernel down "
        "first, or copy the file."
    )


def _other_names(source: Path, target: Path, shown: Shown) -> str | None:
    """Why the file ``source`` must not go into the more private folder of
    ``target``: it has other names (hard links, which a sandbox may make), and
    what a private session writes into it there would be readable through
    them where it is now."""
    try:
        info = os.lstat(source)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink <= 1:
        return None
    return (
        f"Not moved: {shown(source)} has {info.st_nlink - 1} other name(s) (hard links), and "
        f"{shown(target.parent)} is more private than where it is: what a private session writes into it "
        "there would be readable through those names. Copy the file instead (a copy is a new file)."
    )


#: entries of a folder looked at for hard links before it goes into a more
#: private one (a move of a larger one is refused: it cannot be checked)
MAX_CHECKED_ENTRIES = 100_000


def _linked_inside(source: Path, target: Path, shown: Shown) -> str | None:
    """Why the folder ``source`` must not go into the more private folder of
    ``target``: files in it have other names (:func:`_other_names`), or it is
    too large to look."""
    linked: list[str] = []
    seen = 0
    folders = [source]
    while folders and len(linked) < 3:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            return _unchecked(folder, source, target, exc, shown)
        for entry in entries:
            seen += 1
            if seen > MAX_CHECKED_ENTRIES:
                return (
                    f"Not moved: {shown(source)} holds more than {MAX_CHECKED_ENTRIES} entries and "
                    f"{shown(target.parent)} is more private than where it is: its files could not all be "
                    "checked for other names (hard links). Move it with a host shell if you mean to."
                )
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_nlink > 1:
                    linked.append(shown(Path(entry.path)))
            except OSError as exc:
                return _unchecked(Path(entry.path), source, target, exc, shown)
    if not linked:
        return None
    return (
        f"Not moved: {shown(source)} holds files with other names (hard links: {', '.join(linked[:3])}), and "
        f"{shown(target.parent)} is more private than where it is: what a private session writes into them "
        "there would be readable through those names. Copy the folder instead (copies are new files)."
    )


def _unchecked(path: Path, source: Path, target: Path, exc: OSError, shown: Shown) -> str:
    """Why a folder that cannot be looked through must not go into a more
    private one: a sandbox can make a folder it holds a hard link in
    unreadable (mode 0o300 keeps it usable by known names)."""
    return (
        f"Not moved: {shown(path)} cannot be looked at ({exc.strerror}), and {shown(target.parent)} is more "
        f"private than where {shown(source)} is: its files could not all be checked for other names (hard "
        "links). Make it readable, or copy the folder instead (copies are new files)."
    )


_IMPERATIVE = {"moved": "Move", "copied": "Copy"}


def _refusal(verb: str, source: Path, data: _Level, destination: Path, there: Sensitivity, shown: Shown) -> str:
    where = f" (written in {shown(data.folder)})" if data.folder is not None and data.folder != source else ""
    return (
        f"Not {verb}: {shown(source)} holds data of a {data.level.name} session{where}, and "
        f"{shown(destination)} is {there.name}: a notebook working there, with network, could send it out. "
        f"{_IMPERATIVE[verb]} it into a folder that is {data.level.name} already, or with a host shell if you "
        "mean to make it public."
    )


def guard_move(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    stores: Iterable[Path] | None = None,
    shown: Shown = str,
    is_folder: bool | None = None,
) -> None:
    """Call before moving ``source`` to ``target`` (which must not exist yet):
    raises :class:`MoveRefused` for a file that must stay where it is, and
    records a folder's levels at ``target``. ``stores``: the ratchet stores'
    roots (default: :func:`every_store`).

    ``is_folder``: what the caller found at ``source``, through no link, and
    will move only if it finds it again (the Lab server's moves,
    :mod:`sandbox_kernel.no_follow`); ``source`` and ``target`` are then the
    real paths it found, not resolved again (a sandbox may put a link at
    their place meanwhile, which would send every check elsewhere), and a
    place is judged less private by the records under its path alone."""
    real = is_folder is not None
    source, target, kind = _where(source, target, is_folder, shown, _place)
    if source == target:
        return  # nothing to carry
    # A taken name is refused by the contents manager itself, but only at its
    # own later look: a sandbox flipping the name between the two looks must
    # not skip the refusals, so they run whatever this look finds.
    stores = list(stores) if stores is not None else every_store()
    if not kind:
        for plan in _plans(source, stores, kind, shown):
            there = _around(plan.levels, target.parent, shown)
            low = _around(plan.levels, target.parent, shown, by_path=real)
            if plan.around.level > low.level:
                raise MoveRefused(_refusal("moved", source, plan.around, target.parent, low.level, shown))
            if there.level > plan.around.level and (linked := _other_names(source, target, shown)):
                raise MoveRefused(linked)
            # the holders' reports are read only for a file going into a private folder
            if there.level > Sensitivity.PUBLIC and (
                live := _held_file(source, target, _networked_holders(stores), shown)
            ):
                raise MoveRefused(live)
        return
    holders = _networked_holders(stores)
    if (live := _live_sandbox(source, target, holders, stores, shown)) is not None:
        raise MoveRefused(live)
    plans = _plans(source, stores, kind, shown)
    for plan in plans:
        if _around(plan.levels, target.parent, shown).level > plan.around.level and (
            linked := _linked_inside(source, target, shown)
        ):
            raise MoveRefused(linked)
    data = max((plan.highest for plan in plans), key=lambda x: x.level, default=_Level(Sensitivity.PUBLIC))
    for workspace, pid in holders if data.level > Sensitivity.PUBLIC else []:
        if target.is_relative_to(workspace):
            # its network would be cut only after the files arrived (the rise is read at its next poll)
            raise MoveRefused(
                f"Not moved: {shown(source)} holds data of a {data.level.name} session, and a sandbox with "
                f"network (kernel process {pid}) works in {shown(workspace)}, where it would land: that sandbox "
                "could read it before its network is cut. Shut that notebook's kernel down first, or move the "
                "folder elsewhere."
            )
    if os.path.lexists(target):
        # taken: the manager would refuse the move, and nothing may be
        # recorded there; refused here, so that a name freed by a sandbox
        # before the move runs does not let the folder go unrecorded
        raise TargetTaken(f"Not moved: {shown(target)} already exists")
    for plan in plans:
        record = plan.levels.record_resolved if real else plan.levels.record
        if plan.around.level > Sensitivity.PUBLIC:
            record(
                target,
                plan.around.level,
                f"{target} was moved out of {plan.around.folder}: {plan.around.reason}",
            )
        for relative, level in plan.inside:
            place = target / relative
            record(place, level.level, f"{place} was moved here from {level.folder}: {level.reason}")


def guard_copy(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    stores: Iterable[Path] | None = None,
    shown: Shown = str,
    is_folder: bool | None = None,
) -> None:
    """Call before copying ``source`` into the folder ``destination``: raises
    :class:`MoveRefused` when the copy would hold data more private than
    every session that can read it there (``is_folder`` as for :func:`guard_move`:
    given, ``source`` and ``destination`` are real paths, not resolved again)."""
    real = is_folder is not None
    source, destination, kind = _where(source, destination, is_folder, shown, folder_of)
    for plan in _plans(source, list(stores) if stores is not None else every_store(), kind, shown):
        data = plan.highest
        there = _around(plan.levels, destination, shown, by_path=real).level
        if data.level > there:
            raise MoveRefused(_refusal("copied", source, data, destination, there, shown))


__all__ = ["MoveRefused", "TargetTaken", "every_store", "guard_copy", "guard_move"]
