"""The privacy store: one JSON file per session on the host, and it only goes up.

Layout under the store's root (by default ``<data dir>/privacy``, outside every
sandbox mount; dirs 0700, files 0600)::

    <root>/<user_id>/<session_id>.json               the state (see schema.py)
    <root>/<user_id>/<session_id>.lock               flock'ed around every write
    <root>/<user_id>/<session_id>.json.corrupt-<ts>  a bad file, kept aside

A store outside the default data dir is recorded in the registry there before
it is first prepared or written (``store_registry.py``), so that every
sandbox, whichever kernel starts it, hides it.

Every write is a read-modify-write under an exclusive ``flock`` on the
session's lock file (so kernels in different processes never lose each
other's updates), merges what it adds with what is on disk (max of levels,
union of datasets: a stale writer cannot lower anything) and replaces the file
atomically (temp file, fsync, rename, fsync of the directory).

Reads fail closed: a file that cannot be read, is not valid, is a symlink, a
FIFO or anything but a regular file of ours, or is larger than 1 MiB makes the
session private at SECRET with ``error`` set. The next write moves such a file
aside to ``<session_id>.json.corrupt-<ts>`` and writes a fresh file that keeps
the session at SECRET (a ``mark`` records why) plus whatever is being added. A
file from a newer format version is never overwritten: writes are refused.

Each process also remembers the highest state it has seen or written per
session (its "floor"), and every read and write merges it in: deleting or
rewriting the file lower under a running kernel cannot lower what that
kernel reports, and its next write puts it back. A write that fails raises
``PrivacyStoreError`` but still raises that floor.

Reads are cheap to poll: a file whose (device, inode, size, mtime, ctime,
mode) is unchanged is not parsed again, once it is over a second old (file
times are coarse, so a younger one is always re-read).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from .identity import validate_id
from .records import Dataset, SessionMark, clean_reason
from .schema import FutureVersionError, SchemaError, decode, encode
from .sensitivity import Sensitivity
from .state import PrivacyState, merge

log = logging.getLogger("sandbox_kernel.privacy")

MAX_FILE_BYTES = 1 << 20
LOCK_TIMEOUT = 30.0
#: how long a read that finds a marker above the record waits for a rise in
#: progress (a rise holds the lock for two small writes) before failing closed
RISE_WAIT = 2.0
_SETTLE_NS = 1_000_000_000
DATA_DIR_ENV = "SANDBOX_KERNEL_DATA_DIR"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)

_Key = tuple[str, str, str]
_StatKey = tuple[int, int, int, int, int, int]

# Per process, keyed by (resolved root, user_id, session_id).
_memory_lock = threading.Lock()
_floors: dict[_Key, PrivacyState] = {}
# (stat of the file, its state, the floor merged in, the answer)
_cache: dict[_Key, tuple[_StatKey, PrivacyState, PrivacyState, PrivacyState]] = {}
_warned: dict[_Key, _StatKey | None] = {}


def _reinit_lock_after_fork() -> None:
    global _memory_lock
    _memory_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_lock_after_fork)


class PrivacyStoreError(OSError):
    """A change could not be recorded on disk (this process still keeps it)."""


#: what the default data dir is found from (jupyter_core's jupyter_data_dir and ours)
_DATA_DIR_FROM = (DATA_DIR_ENV, "JUPYTER_DATA_DIR", "JUPYTER_PLATFORM_DIRS", "XDG_DATA_HOME", "HOME")
#: the environment (of _DATA_DIR_FROM) -> the data dir it gave
_data_dirs: dict[tuple[str | None, ...], Path] = {}


def default_data_dir() -> Path:
    """``$SANDBOX_KERNEL_DATA_DIR``, else ``<jupyter data dir>/sandbox_kernel``.

    Read from the environment at every call, but found once per environment:
    every read of a folder's level comes here (four times a second per
    kernel), and finding the home folder resolves a path. Not kept when a
    variable is relative (the answer then follows the working folder)."""
    where = tuple(os.environ.get(name) for name in _DATA_DIR_FROM)
    known = _data_dirs.get(where)
    if known is not None:
        return known
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        found = Path(env).expanduser().absolute()
    else:
        from jupyter_core.paths import jupyter_data_dir

        found = Path(jupyter_data_dir()).absolute() / "sandbox_kernel"
    if all(value is None or value == "" or value.startswith(("/", "~")) for value in where[:2] + where[3:]):
        if len(_data_dirs) >= 64:
            _data_dirs.clear()
        _data_dirs[where] = found
    return found


def default_store() -> PrivacyStore:
    """The store under ``default_data_dir() / "privacy"`` (read from the environment now)."""
    return PrivacyStore(default_data_dir() / "privacy")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def replace_file(dir_fd: int, name: str, data: bytes) -> os.stat_result:
    """Replace ``name`` in the folder ``dir_fd`` with ``data``, atomically and
    durably (a 0600 temporary file made with O_EXCL and O_NOFOLLOW, written,
    fsynced and renamed over ``name``; then the folder fsynced): a crash leaves
    the old file or the new one, never a part, and a link planted at the
    temporary name is never followed. Returns the new file's stat."""
    tmp = f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _settled(key: _StatKey | None) -> bool:
    """Whether a file with this stat key may be cached: file timestamps are
    coarse (a few ms), so a file changed within the last second could be
    replaced by another with the same inode number, size and times. Uses the
    ctime, which (unlike the mtime) cannot be set back."""
    return key is not None and time.time_ns() - key[4] > _SETTLE_NS


def _without_error(state: PrivacyState) -> PrivacyState:
    if state.error is None:
        return state
    return PrivacyState.build(
        datasets=state.datasets, mark=state.mark, floor=state.sensitivity, omitted_datasets=state.omitted_datasets
    )


def _failure_state(message: str) -> PrivacyState:
    mark = SessionMark.create(Sensitivity.SECRET, "api", clean_reason(message))
    return PrivacyState.build(mark=mark, error=message)


class _Problem(Exception):
    """The session file exists but cannot be used; ``future`` = newer format."""

    def __init__(self, message: str, future: bool = False) -> None:
        super().__init__(message)
        self.future = future


def _slot(marker: Path) -> str:
    """The empty file that becomes ``marker`` by a rename (``PrivacyStore.prepare``)."""
    return str(marker.parent / f".{marker.name}.slot")


def _highwater_root(root: Path) -> Path:
    """Where the append-only high-water marks live: beside the store, not in it,
    so losing the store's folder does not take them along."""
    return root.parent / f"{root.name}-highwater"


@functools.lru_cache(maxsize=4096)
def _session_paths(root: Path, user_id: str, session_id: str) -> tuple[Path, tuple[tuple[Sensitivity, str], ...]]:
    """A session's file and its high-water markers, highest level first.

    Every read of the ratchet (one per ancestor of the workspace, each cell)
    needs them, and building them with pathlib cost more than the reads' own
    stat() calls. Invalid ids raise, and a raise is not cached."""
    validate_id(user_id, "user_id")
    validate_id(session_id, "session_id")
    marks = _highwater_root(root) / user_id
    levels = sorted((level for level in Sensitivity if level > Sensitivity.PUBLIC), reverse=True)
    return root / user_id / f"{session_id}.json", tuple(
        (level, str(marks / f"{session_id}@{level.name}")) for level in levels
    )


class PrivacyStore:
    """Per-session privacy files under ``root``. Raise-only: nothing here lowers.

    Safe to share between threads; several processes may use the same root.
    """

    __slots__ = ("_resolved", "_root")
    _root: Path
    _resolved: str

    def __init__(self, root: Path | str) -> None:
        root = Path(root).expanduser().absolute()
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_resolved", str(root.resolve()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"PrivacyStore is read-only: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"PrivacyStore is read-only: cannot delete {name!r}")

    def __repr__(self) -> str:
        return f"PrivacyStore({str(self._root)!r})"

    @property
    def root(self) -> Path:
        return self._root

    # ----------------------------------------------------------- high-water marks

    @property
    def highwater_root(self) -> Path:
        return _highwater_root(self._root)

    def _highwater_path(self, user_id: str, session_id: str, level: Sensitivity) -> Path:
        """The marker of a level above PUBLIC (ids are validated)."""
        return Path(dict(_session_paths(self._root, user_id, session_id)[1])[level])

    def _record_highwater(self, user_id: str, session_id: str, level: Sensitivity) -> None:
        """Leave an empty marker per level reached; never removed, never lowered.
        A slot :meth:`prepare` made becomes the marker by a rename, which needs
        no new inode or block: a full disk cannot stop it."""
        if level <= Sensitivity.PUBLIC:
            return
        path = self._highwater_path(user_id, session_id, level)
        if path.exists():
            return
        try:
            os.rename(_slot(path), path)
            return
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        os.close(fd)

    def prepare(self, user_id: str, session_id: str) -> None:
        """Make now, before any sandbox of the session runs, every file a rise
        needs a new inode for: the store's folders, the session's lock, and a
        slot per level for its high-water marker. A sandbox can fill the disk
        the store is on (its workspace and checkpoints are often there); a
        rise then could write neither its record nor its marker, kept the
        level only in the process, and a restart found the session PUBLIC.
        With the slots, the marker is still made, and every later read fails
        closed at that level."""
        with self._locked(user_id, session_id):
            pass
        for _level, marker in _session_paths(self._root, user_id, session_id)[1]:
            path = Path(marker)
            if os.path.lexists(path):
                continue
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(_slot(path), os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
            os.close(fd)

    def highwater(self, user_id: str, session_id: str) -> Sensitivity:
        """The highest level this session is known to have reached (PUBLIC if none)."""
        for level, marker in _session_paths(self._root, user_id, session_id)[1]:
            if os.path.lexists(marker):
                return level
        return Sensitivity.PUBLIC

    def path_for(self, user_id: str, session_id: str) -> Path:
        """The session's file (ids are validated)."""
        return _session_paths(self._root, user_id, session_id)[0]

    # ----------------------------------------------------------------- reading

    def read(self, user_id: str, session_id: str) -> PrivacyState:
        """The session's state; never raises for a bad file (fails closed instead).

        Cheap to poll: while the file is unchanged (same inode, size, mtime and
        ctime) and this process learnt nothing new, the last answer is reused.
        """
        state = self._read(user_id, session_id)
        known = self.highwater(user_id, session_id)
        if known > state.sensitivity:
            # A rise leaves its marker before its record, under the lock: a
            # read between the two waits for the lock and looks again, not to
            # take another session's rise in progress for a lowered record.
            with contextlib.suppress(PrivacyStoreError, OSError), self._locked(user_id, session_id, RISE_WAIT):
                state = self._read(user_id, session_id)
                known = self.highwater(user_id, session_id)
        if known > state.sensitivity:
            path = self.path_for(user_id, session_id)
            message = (
                f"privacy store file {path} is missing or lower ({state.sensitivity.name}) than the level the "
                f"session is known to have reached ({known.name}); the session is treated as private at SECRET"
            )
            log.error("%s", message)
            return merge(state, _failure_state(message))
        return state

    def _read(self, user_id: str, session_id: str) -> PrivacyState:
        path = self.path_for(user_id, session_id)
        key = (self._resolved, user_id, session_id)
        try:
            before: _StatKey | None = _stat_key(os.lstat(path))
        except FileNotFoundError:
            with _memory_lock:
                floor = _floors.get(key)
            if floor is None:
                return PrivacyState.public()
            self._warn_if_lower(path, PrivacyState.public(), floor, key, None)
            return floor
        except OSError:  # e.g. the user "directory" is a file: the full read says why
            before = None
        with _memory_lock:
            entry = _cache.get(key)
            floor = _floors.get(key)
        if before is not None and entry is not None and entry[0] == before:
            if entry[2] is floor:
                return entry[3]  # unchanged file, nothing new learnt
            disk = entry[1]
        else:
            disk = self._read_disk(user_id, session_id, path)
            try:
                after: _StatKey | None = _stat_key(os.lstat(path))
            except OSError:
                after = None
            if after != before or not _settled(before):
                before = None  # changed while being read, or too recently: do not cache
        if floor is not None:
            self._warn_if_lower(path, disk, floor, key, before)
        clean = _without_error(disk)
        with _memory_lock:
            floor = _floors.get(key)  # again: another thread may have raised it
            if floor is None:
                floor = clean
            elif not floor.covers(clean):
                floor = merge(floor, clean)
            _floors[key] = floor
            result = disk if disk.covers(floor) else merge(disk, floor)
            if before is not None:
                _cache[key] = (before, disk, floor, result)
        return result

    def _warn_if_lower(
        self, path: Path, disk: PrivacyState, floor: PrivacyState, key: _Key, stat_key: _StatKey | None
    ) -> None:
        if disk.error is not None or disk.covers(floor):
            return
        with _memory_lock:
            if key in _warned and _warned[key] == stat_key:
                return  # said once for this version of the file
            _warned[key] = stat_key
        log.warning(
            "privacy file %s holds less than this process has already seen "
            "(%s on disk, %s known); keeping the higher state, the next write restores it",
            path,
            disk.sensitivity.name,
            floor.sensitivity.name,
        )

    def _fail(self, path: Path, problem: str) -> PrivacyState:
        message = f"privacy store file {path} {problem}; the session is treated as private at SECRET"
        log.error("%s", message)
        return _failure_state(message)

    def _read_disk(self, user_id: str, session_id: str, path: Path) -> PrivacyState:
        try:
            root_fd = os.open(self._root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        except FileNotFoundError:
            return PrivacyState.public()
        except OSError as exc:
            return self._fail(
                path, f"cannot be reached: the store directory {self._root} cannot be opened ({exc.strerror})"
            )
        try:
            try:
                user_fd = self._open_user_dir(root_fd, user_id)
            except FileNotFoundError:
                return PrivacyState.public()
            except _Problem as exc:
                return self._fail(path, str(exc))
            try:
                state, _ = self._load(user_fd, user_id, session_id)
            except _Problem as exc:
                return self._fail(path, str(exc))
            finally:
                os.close(user_fd)
        finally:
            os.close(root_fd)
        return state if state is not None else PrivacyState.public()

    def _open_user_dir(self, root_fd: int, user_id: str) -> int:
        try:
            return os.open(user_id, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=root_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _Problem(
                    f"cannot be reached: {self._root / user_id} is not a plain directory (a symlink or a file)"
                ) from None
            raise _Problem(f"cannot be reached: {self._root / user_id} cannot be opened ({exc.strerror})") from None

    def _load(
        self,
        dir_fd: int,
        user_id: str,
        session_id: str,
        known: tuple[_StatKey, PrivacyState] | None = None,
    ) -> tuple[PrivacyState | None, _StatKey | None]:
        """The file's state and stat key; (None, None) when it does not exist;
        ``_Problem`` when it is bad. ``known`` is reused if the file is unchanged."""
        name = f"{session_id}.json"
        try:
            fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Problem("is a symlink; it must be a regular file") from None
            raise _Problem(f"cannot be opened ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Problem(f"is {_kind(st.st_mode)}, not a regular file")
            if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
                raise _Problem(f"is owned by uid {st.st_uid}, not by this user")
            if st.st_size > MAX_FILE_BYTES:
                raise _Problem(f"is {st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
            if known is not None and known[0] == _stat_key(st):
                return known[1], known[0]
            chunks, total = [], 0
            while total <= MAX_FILE_BYTES:
                chunk = os.read(fd, MAX_FILE_BYTES + 1 - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise _Problem(f"grew over the {MAX_FILE_BYTES}-byte limit while being read")
        except OSError as exc:
            raise _Problem(f"cannot be read ({exc.strerror})") from None
        finally:
            os.close(fd)
        try:
            return decode(b"".join(chunks), user_id, session_id), _stat_key(st)
        except FutureVersionError as exc:
            raise _Problem(str(exc), future=True) from None
        except SchemaError as exc:
            raise _Problem(str(exc)) from None

    # ----------------------------------------------------------------- writing

    def add_dataset(self, user_id: str, session_id: str, dataset: Dataset) -> PrivacyState:
        """Record ``dataset`` (raising its level if it is already there)."""
        if not isinstance(dataset, Dataset):
            raise ValueError(f"dataset must be a Dataset record, got {type(dataset).__name__}")
        return self._update(user_id, session_id, PrivacyState.build(datasets=[dataset]))

    def mark(self, user_id: str, session_id: str, mark: SessionMark) -> PrivacyState:
        """Mark the whole session private (the higher of this and any earlier mark is kept)."""
        if not isinstance(mark, SessionMark):
            raise ValueError(f"mark must be a SessionMark record, got {type(mark).__name__}")
        return self._update(user_id, session_id, PrivacyState.build(mark=mark))

    def merge(self, user_id: str, session_id: str, state: PrivacyState) -> PrivacyState:
        """Merge ``state`` into the stored one. This can only raise it: a lower
        or empty state changes nothing."""
        if not isinstance(state, PrivacyState):
            raise ValueError(f"state must be a PrivacyState, got {type(state).__name__}")
        return self._update(user_id, session_id, _without_error(state))

    def _update(self, user_id: str, session_id: str, addition: PrivacyState) -> PrivacyState:
        path = self.path_for(user_id, session_id)
        key = (self._resolved, user_id, session_id)
        pending = addition  # what must not be lost, even if the write fails
        try:
            with self._locked(user_id, session_id) as user_fd:
                with _memory_lock:
                    floor = _floors.get(key, PrivacyState.public())
                name = f"{session_id}.json"
                try:
                    with _memory_lock:
                        entry = _cache.get(key)
                    known = (entry[0], entry[1]) if entry and entry[1].error is None else None
                    disk, stat_key = self._load(user_fd, user_id, session_id, known)
                except _Problem as exc:
                    if exc.future:
                        message = (
                            f"privacy store file {path} {exc}; refusing to overwrite it "
                            "(the session is treated as private at SECRET)"
                        )
                        pending = merge(pending, _failure_state(message))
                        raise PrivacyStoreError(message) from None
                    disk = None
                    aside = f"{name}.corrupt-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}"
                    message = f"privacy store file {path} {exc}; kept aside as {aside}"
                    pending = merge(
                        pending,
                        PrivacyState.build(mark=SessionMark.create(Sensitivity.SECRET, "api", clean_reason(message))),
                    )
                    self._keep_aside(user_fd, name, aside, path, str(exc))
                    log.error("%s; the session stays private at SECRET", message)
                current = disk if disk is not None else PrivacyState.public()
                new = _without_error(merge(current, floor, pending))
                self._record_highwater(user_id, session_id, new.sensitivity)  # before the record itself
                if disk is None or new != disk:
                    stat_key = self._write(user_fd, name, encode(new, user_id, session_id))
        except PrivacyStoreError:
            self._remember(key, pending)
            raise
        except OSError as exc:
            self._remember(key, pending)
            raise PrivacyStoreError(
                f"could not record the privacy change in {path}: {exc.strerror or exc}; "
                "this process keeps it, other processes may not see it"
            ) from exc
        return self._remember(key, new, stat_key)

    @staticmethod
    def _keep_aside(dir_fd: int, name: str, aside: str, path: Path, problem: str) -> None:
        """Keep a bad file as ``aside``. A hard link (of the symlink itself, if it
        is one) leaves ``name`` in place until the atomic replace, so no reader
        ever finds the session file missing; a directory can only be renamed."""
        try:
            os.link(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            return
        except OSError:
            pass
        try:
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as err:
            raise PrivacyStoreError(
                f"privacy store file {path} {problem}, and it could not be moved aside "
                f"({err.strerror}); nothing was written (the session is treated as "
                "private at SECRET)"
            ) from None

    @staticmethod
    def _remember(key: _Key, state: PrivacyState, stat_key: _StatKey | None = None) -> PrivacyState:
        """Raise this process's floor; with ``stat_key``, ``state`` is what the
        file holds now, and the next poll need not read it again."""
        with _memory_lock:
            floor = _floors.get(key)
            if floor is None or not floor.covers(state):
                floor = state if floor is None or state.covers(floor) else merge(floor, state)
                _floors[key] = floor
            result = state if state.covers(floor) else merge(state, floor)
            if stat_key is None or not _settled(stat_key):
                _cache.pop(key, None)
            else:
                _cache[key] = (stat_key, state, floor, result)
            return result

    def _ensure_root(self) -> int:
        root = self._root
        # Before the folder exists: every sandbox started from now on hides it,
        # whichever kernel starts it (a store outside the default data dir is
        # otherwise known only to the processes configured with it).
        from .store_registry import register

        register(root)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise PrivacyStoreError(f"cannot create the privacy store directory {root}: {exc.strerror}") from None
        fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            self._tighten(fd, root)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _tighten(fd: int, where: Path) -> None:
        st = os.fstat(fd)
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise PrivacyStoreError(f"{where} is owned by uid {st.st_uid}, not by this user")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)

    @contextmanager
    def _locked(self, user_id: str, session_id: str, timeout: float = LOCK_TIMEOUT) -> Iterator[int]:
        """Hold the session's exclusive lock (waiting up to ``timeout`` s); yields the user directory's fd."""
        root_fd = self._ensure_root()
        user_fd = lock_fd = -1
        try:
            try:
                os.mkdir(user_id, 0o700, dir_fd=root_fd)
            except FileExistsError:
                pass
            try:
                user_fd = self._open_user_dir(root_fd, user_id)
            except _Problem as exc:
                raise PrivacyStoreError(f"privacy store file {self.path_for(user_id, session_id)} {exc}") from None
            self._tighten(user_fd, self._root / user_id)
            lock_name = f"{session_id}.lock"
            lock_path = self._root / user_id / lock_name
            try:
                lock_fd = os.open(
                    lock_name,
                    os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC,
                    0o600,
                    dir_fd=user_fd,
                )
            except OSError as exc:
                raise PrivacyStoreError(
                    f"cannot open the lock file {lock_path}: "
                    f"{'it is a symlink' if exc.errno == errno.ELOOP else exc.strerror}"
                ) from None
            if not stat.S_ISREG(os.fstat(lock_fd).st_mode):
                raise PrivacyStoreError(f"the lock file {lock_path} is not a regular file")
            deadline = time.monotonic() + timeout
            delay = 0.001
            while True:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise PrivacyStoreError(
                            f"timed out after {timeout:.0f} s waiting for the lock {lock_path}"
                        ) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            yield user_fd
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)  # also releases the flock
            if user_fd >= 0:
                os.close(user_fd)
            os.close(root_fd)

    @staticmethod
    def _write(dir_fd: int, name: str, data: bytes) -> _StatKey:
        """Replace ``name`` atomically and durably; returns its new stat key."""
        if len(data) > MAX_FILE_BYTES:  # cannot happen within MAX_DATASETS; never write what we'd refuse
            raise PrivacyStoreError(f"the privacy state is {len(data)} bytes, over the limit")
        return _stat_key(replace_file(dir_fd, name, data))
