"""The host's list of ratchet stores other than the default one.

Why: the workspace policy hides from every sandbox the default data dir and
the store of the session's own process. A store elsewhere
(``--SandboxKernel.privacy_dir``, ``data_dir``, ``ToolsConfig.data_dir``) was
known only to the processes using it, so another kernel whose workspace
contained it mounted it read-write into its sandbox: its cells could read the
other sessions' records and delete their high-water markers, and those
sessions came back PUBLIC, with network, at their next start.

So every host process that prepares or writes a store other than the default
one records the store's path here first, and every sandbox start hides each
recorded store that exists (``engine/workspace_policy.py``). A store inside the
default data dir is recorded too (hidden with the data dir already): every
reader of a folder's level and of the holders to wait for finds the stores
through this list (``workspace_levels.read_all_folders``,
``enforcement.pending_holders``), and a store left out was a folder level
nobody read. Stores left there unrecorded by earlier versions are found once
per process by a shallow scan of the data dir (:func:`_register_unlisted`). The list lives in
the default data dir, which every sandbox of every kernel already hides, so no
sandbox can read, add or remove an entry::

    <default data dir>/stores/<first 32 hex digits of sha256(path)>

one file per store (0600, in a 0700 folder), holding the store's absolute path
and a newline, written atomically (temp file, fsync, rename). A store that is
gone is skipped when read, and ``sandbox-kernel doctor`` lists it. Its entry
is removed only once nothing of the store has existed for :data:`STALE_AFTER`
since it was last registered: every prepare or write of a store registers it
again, which refreshes an entry older than :data:`REFRESH_AFTER`, so a process
about to (re)create a store always has a fresh entry, and a removal cannot
race with it. Without removal, every store ever made (a test suite makes
hundreds in temporary folders) would be checked at every sandbox start.

Reading never raises: a bad entry (not a regular file, too large, not one
absolute path) is logged once, naming the file and what is wrong, and the
others still count.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import stat
import threading
import time
from pathlib import Path

log = logging.getLogger("sandbox_kernel.privacy")

#: the registry's folder inside the default data dir
REGISTRY = "stores"
#: how a data dir names its store (``<data dir>/privacy``, for kernels and tools
#: alike): such a store's parent is a data dir, with the sessions' checkpoints,
#: egress logs, package layers and agent notebooks and workspaces beside it
DATA_DIR_STORE = "privacy"
MAX_ENTRY_BYTES = 4096
#: seconds after its last registration an entry whose store is wholly gone is removed
STALE_AFTER = 3600.0
#: an entry older than this is touched when its store registers again (keeps it far from STALE_AFTER)
REFRESH_AFTER = 600.0

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

_said_lock = threading.Lock()
#: problems already logged by this process (each is said once, not at every sandbox start)
_said: set[str] = set()


def _say_once(level: int, message: str) -> None:
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    log.log(level, "%s", message)


def registry_dir() -> Path:
    """``<default data dir>/stores`` (read from the environment now)."""
    from .store import default_data_dir

    return default_data_dir() / REGISTRY


def entry_name(path: str) -> str:
    """The file that records the store at ``path`` (absolute, normalised)."""
    return hashlib.sha256(os.fsencode(path)).hexdigest()[:32]


def register(root: Path) -> None:
    """Record the store at ``root`` before it is created or written, unless it
    is the default store (``<default data dir>/privacy``, read by everyone).

    A store elsewhere inside the default data dir (``privacy_dir`` or a
    ``data_dir`` under it) is recorded too: every sandbox hides it already
    (with the whole data dir), but its folder levels and holders must be
    read by every reader of a folder's level (``workspace_levels.read_all_folders``,
    ``enforcement.pending_holders``), which find stores through this list.

    Never raises: a registry that cannot be written is logged (once) as an
    error, and the store is used all the same. Refusing the write would lose
    the rise the caller is recording, a worse failure than a store that
    sandboxes of other kernels do not know about.
    """
    path = os.path.abspath(os.fspath(root))
    folder = registry_dir()
    if os.path.realpath(path) == os.path.realpath(folder.parent / DATA_DIR_STORE):
        return
    record(
        folder,
        path,
        f"could not record the privacy store {path} in {folder} ({{reason}}): the sandboxes of other kernels "
        "and agent tools whose workspace contains it will not hide it",
    )


def record(folder: Path, path: str, failure: str) -> None:
    """Write (or refresh) the entry for the absolute ``path`` in the registry
    ``folder``. Never raises: ``failure`` (with ``{reason}``) is logged once."""
    content = os.fsencode(path) + b"\n"
    name = entry_name(path)
    try:
        if _read_entry(folder, name) == content and _age(folder / name) < REFRESH_AFTER:
            return
    except (OSError, ValueError):
        pass  # missing, bad or old: written again below (a new file: see _remove_if_stale)
    try:
        _write_entry(folder, name, content)
    except OSError as exc:
        _say_once(logging.ERROR, failure.format(reason=exc.strerror or exc))


def _age(entry: Path) -> float:
    """Seconds since ``entry`` was written (``OSError`` when it is gone)."""
    return time.time() - os.stat(entry, follow_symlinks=False).st_mtime


def _write_entry(folder: Path, name: str, content: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        if stat.S_IMODE(os.fstat(dir_fd).st_mode) != 0o700:
            os.fchmod(dir_fd, 0o700)
        from .store import replace_file

        replace_file(dir_fd, name, content)
    finally:
        os.close(dir_fd)


def _read_entry(folder: Path, name: str) -> bytes:
    """An entry's bytes; ``ValueError`` names what makes it unusable."""
    try:
        fd = os.open(folder / name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_size > MAX_ENTRY_BYTES:
            raise ValueError(f"is {st.st_size} bytes, over the {MAX_ENTRY_BYTES}-byte limit")
        return os.read(fd, MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)


#: a reading is kept only when the folder had not changed for this long (ns)
SETTLED_NS = 2_000_000_000
#: the last reading of each registry folder, keyed by the folder's identity and mtime
_read_cache: dict[str, tuple[tuple[str, int, int, int], list[tuple[str, Path]], list[str]]] = {}


def _entries(folder: Path | None = None) -> tuple[list[tuple[str, Path]], list[str]]:
    """Every usable entry (its file name and the store it records), and a
    sentence per entry that could not be used. Never raises.

    Read again only when the folder changed (an entry is only ever added,
    replaced or removed by a rename or unlink in it, which moves its mtime):
    every sandbox start reads the registry, and a machine that ran a test
    suite holds a hundred entries. ``folder``: another registry than the
    stores' (``privacy/dataset_registry.py``)."""
    if folder is None:
        folder = registry_dir()
    try:
        st = os.stat(folder)
        key = (str(folder), st.st_dev, st.st_ino, st.st_mtime_ns)
        cached = _read_cache.get(str(folder))
        if cached is not None and cached[0] == key:
            return list(cached[1]), list(cached[2])
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"the privacy store registry {folder} cannot be read ({exc.strerror or exc})"]
    entries, problems = _read_entries(folder, names)
    # Kept only once the folder has been still for a while: a change in the same
    # clock tick as the one read (mtimes are as coarse as a few ms) would
    # otherwise leave the mtime as it was, and a new store unhidden.
    if time.time_ns() - st.st_mtime_ns > SETTLED_NS:
        _read_cache[str(folder)] = (key, entries, problems)
    return list(entries), list(problems)


def _read_entries(folder: Path, names: list[str]) -> tuple[list[tuple[str, Path]], list[str]]:
    entries: list[tuple[str, Path]] = []
    problems: list[str] = []
    for name in names:
        if name.startswith("."):
            continue  # a write in progress (or its leftover)
        try:
            entries.append((name, _parse(_read_entry(folder, name))))
        except FileNotFoundError:
            continue  # removed meanwhile
        except (OSError, ValueError) as exc:
            reason = str(exc) if isinstance(exc, ValueError) else f"cannot be read ({exc.strerror or exc})"
            problems.append(f"registry entry {folder / name} {reason}; ignored")
    return entries, problems


def _parse(content: bytes) -> Path:
    """The store path an entry holds; ``ValueError`` says why it holds none."""
    if not content.endswith(b"\n") or content.count(b"\n") != 1:
        raise ValueError("does not hold one line")
    if b"\0" in content:
        raise ValueError("holds a NUL byte")
    path = os.fsdecode(content[:-1])
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise ValueError(f"holds {path!r}, not an absolute, normalised path")
    return Path(path)


def read_registry() -> tuple[list[Path], list[str]]:
    """Every recorded store, and a sentence per entry that could not be used.
    Never raises."""
    entries, problems = _entries()
    return [store for _, store in entries], problems


def store_places(root: Path) -> tuple[Path, ...]:
    """Everything the host writes for the store at ``root`` (paths as the
    store uses them, not resolved): the store, its high-water marks, its
    holders' reports, and the folder levels kept beside it with their marks."""
    from .enforcement import enforced_root
    from .store import _highwater_root
    from .workspace_levels import FOLDER_LEVELS

    # path arithmetic only: an entry is never resolved here (a symlink loop in
    # a registered path must not make a sandbox start raise)
    folders = root.parent / FOLDER_LEVELS
    return (root, _highwater_root(root), enforced_root(root), folders, _highwater_root(folders))


def data_dir_of(root: Path) -> Path | None:
    """The data dir a store at ``root`` belongs to (its parent, hidden as a
    whole), when it is a data dir's store; None for a store configured on its
    own (``privacy_dir``), whose folder may be any folder of the user."""
    return root.parent if root.name == DATA_DIR_STORE else None


def store_exists(root: Path) -> bool:
    """Whether anything of the store at ``root`` is on disk (its folder, a
    marker, the folder levels kept beside it); a link counts too."""
    return any(os.path.lexists(p) for p in store_places(root))


#: how deep below the default data dir :func:`_register_unlisted` looks for a
#: store's folder (``<D>/a/b/privacy``, or any store whose folder levels are
#: at ``<D>/a/b/workspace-levels``)
SCAN_DEPTH = 2
#: a data dir's agent workspaces (sandboxes write there): never scanned
WORKSPACES = "workspaces"
#: folders :func:`_register_unlisted` lists at most (once per process)
SCAN_LIMIT = 4000
#: the environments (of _DATA_DIR_FROM) whose data dir this process has looked through already
_scanned: set[str] = set()


def _register_unlisted() -> None:
    """Register the stores kept inside the default data dir that are not
    listed: versions before this one skipped every store in the default data
    dir, so a store there (``privacy_dir=<D>/x/privacy``) that no process
    opened since holds folder levels nobody else read. Once per process and
    data dir; looks ``SCAN_DEPTH`` folders deep and lists at most
    ``SCAN_LIMIT`` folders, following no link nor entering a ``workspaces``
    folder (sandboxes write there). A store is known by what the
    host writes beside it: ``<name>-highwater``, ``<name>-enforced``, or folder
    levels (``workspace-levels``, whose store name is then unknown: recorded
    as ``privacy``, which is all a reader of the levels needs). Never raises."""
    # what the default data dir is found from (read at every call: cheaper
    # than finding it, and every reader of a folder's level comes here)
    from .store import _DATA_DIR_FROM

    where = "\0".join(os.environ.get(name, "") for name in _DATA_DIR_FROM)
    if where in _scanned:
        return
    from .workspace_levels import FOLDER_LEVELS

    data = os.path.realpath(registry_dir().parent)
    with _said_lock:
        if where in _scanned:
            return
        _scanned.add(where)
    levels = {FOLDER_LEVELS, f"{FOLDER_LEVELS}-highwater"}
    todo, listed = [(data, 0)], 0
    while todo and listed < SCAN_LIMIT:
        place, depth = todo.pop()
        listed += 1
        try:
            with os.scandir(place) as it:
                children = [(c.name, c.is_dir(follow_symlinks=False)) for c in it]
        except OSError:
            continue
        names = {name for name, _ in children}
        roots = {
            name[: -len(suffix)] for name in names for suffix in ("-highwater", "-enforced") if name.endswith(suffix)
        }
        roots.discard(FOLDER_LEVELS)
        roots.discard("")
        if not roots and names & levels:
            roots = {DATA_DIR_STORE}
        for name in sorted(roots):
            register(Path(place) / name)
        if depth < SCAN_DEPTH:
            # not into a data dir's workspaces: sandboxes write there, and a
            # store they made up would hide or raise what they chose
            skip = {REGISTRY, WORKSPACES}
            todo += [(os.path.join(place, name), depth + 1) for name, is_dir in children if is_dir and name not in skip]


def registered_stores() -> list[Path]:
    """The recorded stores of which something exists on disk. Bad entries are
    logged (once per problem and process) and skipped; never raises."""
    _register_unlisted()
    entries, problems = _entries()
    for problem in problems:
        _say_once(logging.WARNING, problem)
    live = []
    for name, root in entries:
        if store_exists(root):
            live.append(root)
        else:
            _remove_if_stale(registry_dir() / name)
    return live


def all_store_roots() -> tuple[list[Path], str | None]:
    """The default store's root and every registered store's (whether or not
    anything of it exists: the caller checks what it needs), and a sentence
    when the registry's folder exists but cannot be read, so that a reader
    that must see every store's records can fail closed. Bad entries are
    logged once and skipped (as :func:`registered_stores`); removes nothing,
    so it is cheap enough for every read of a folder's level (one ``stat``
    and one ``listdir`` while the registry is unchanged)."""
    from .store import default_data_dir

    _register_unlisted()
    problem = None
    entries, problems = _entries()
    for message in problems:
        _say_once(logging.WARNING, message)
    if problems and problems[0].startswith("the privacy store registry "):
        problem = problems[0]  # its folder could not be read or listed (see _entries)
    # default_store().root, without resolving it (PrivacyStore does) at every read
    return list(dict.fromkeys([default_data_dir() / "privacy", *(root for _, root in entries)])), problem


def _remove_if_stale(entry: Path) -> None:
    """Remove the entry of a store wholly gone if it was last written over
    STALE_AFTER ago.

    A process about to make the store registers first, and registering
    rewrites an entry older than REFRESH_AFTER (a new file, fresh). The entry
    is moved aside, and its age read again there: if that is the fresh one
    (written between this reader's check and the move), it is put back;
    otherwise it is removed, and a registration after the move has written
    a new entry under the name. So no store being made loses its entry."""
    aside = entry.with_name(f".{entry.name}.stale-{secrets.token_hex(4)}")
    try:
        if _age(entry) <= STALE_AFTER:
            return
        os.rename(entry, aside)
    except OSError:
        return  # removed or rewritten meanwhile: skipped all the same
    try:
        if _age(aside) <= STALE_AFTER:
            try:
                os.link(aside, entry)  # back, unless a newer entry took the name meanwhile
            except FileExistsError:
                pass
        else:
            log.debug("removed the registry entry %s: its store has been gone for over %d s", entry, STALE_AFTER)
    except OSError:
        pass
    finally:
        try:
            os.unlink(aside)
        except OSError:
            pass


__all__ = [
    "DATA_DIR_STORE",
    "REGISTRY",
    "all_store_roots",
    "data_dir_of",
    "entry_name",
    "read_registry",
    "register",
    "registered_stores",
    "registry_dir",
    "store_places",
]
