"""Writing a host file below a folder a sandbox can rearrange, through no link.

Why: a sandbox cannot create a symbolic link (seccomp), but it can give one
that is already in its workspace a new name (``rename``, ``link``): the
user's own ``data -> /mnt/data`` or ``notes.md -> ~/Dropbox/notes.md``,
whose targets are not mounted in the sandbox. Renamed to ``.~nb.ipynb``,
jupyter_server's next save of ``nb.ipynb`` copied the notebook's bytes (the
sandbox's choice) through the link into the host file it names; renamed to
``nb.ipynb``, the save wrote the notebook there; renamed to
``.ipynb_checkpoints``, checkpoints were written into the linked folder, and
a checkpoint of a linked notebook copied the host file into the workspace,
where the sandbox reads it (guarantee 10).

So every folder below ``root`` is opened relative to the one above it with
``O_NOFOLLOW``, and the file is written as a new one renamed over its name:
a link found anywhere below ``root`` is refused (:class:`LinkRefused`), and a
link renamed into place while the write runs is replaced, not followed. No
check precedes the write that a sandbox could race: the opens are the check.
Folders above ``root`` (the server's root reached through a link) are the
user's choice and are followed.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import functools
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """What the server must not do to a path below the root; ``status`` is its HTTP answer."""

    status = 403


class LinkRefused(Refused):
    """A write (or a copy's read) that would go through a symbolic link below the root."""

    def __init__(self, link: str) -> None:
        self.link = link
        super().__init__(
            f"{link} is a symbolic link: the server writes nothing through a link inside the folders it serves, "
            "since a sandbox can give a link there a new name. Open the file at the place the link points to."
        )


class NotAFile(Refused):
    """A file expected where something else is (a folder a sandbox put there)."""

    status = 400

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is not a file")


class Exists(Refused):
    """A move or copy onto a name that is taken."""

    status = 409

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} already exists")


class Changed(Refused):
    """The entry a guard judged is no longer the one at its name, or its
    folder moved (a sandbox renamed something meanwhile)."""

    status = 409

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} changed while the server was checking it (something renamed it meanwhile), so nothing "
            "was moved or copied. Look at the folder again, and retry."
        )


@dataclass(frozen=True)
class Judged:
    """What a guard judged before a move or copy: the entry then at ``path``
    (its device and inode, whether a folder) in the folder whose real path
    was ``folder``, and for a move the real path of the destination's folder
    (else empty).

    Why: the guard decides by levels kept per path, and a sandbox renames
    entries of its workspace at will; while :data:`JUDGED` holds this,
    :func:`rename`, :func:`reading` and :func:`copy_tree` act on ``path``
    only if they find the very entry judged where it was, and a move found
    to have taken another one (a swap between their look and the move) is
    put back."""

    path: str
    identity: tuple[int, int]
    folder: str
    is_folder: bool
    destination_folder: str = ""


#: the judgement of the move or copy running in this context (set by the guard)
JUDGED: contextvars.ContextVar[Judged | None] = contextvars.ContextVar("sandbox_kernel_judged", default=None)


def judge(root: str, path: str, destination: str | None = None) -> Judged:
    """Look at ``path`` (and the folder of ``destination``) through no link
    below ``root``: FileNotFoundError when nothing is there."""
    with _in_folder(root, path) as (folder, name):
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        where = _real_path(folder)
    target = ""
    if destination is not None:
        with _in_folder(root, destination) as (folder, _):
            target = _real_path(folder)
    return Judged(os.path.abspath(path), (info.st_dev, info.st_ino), where, stat.S_ISDIR(info.st_mode), target)


def real_folder(root: str, path: str) -> str:
    """The real path of the folder ``path``, reached through no link below ``root``."""
    with _folder_itself(root, path) as itself:
        return _real_path(itself)


def _real_path(folder: int) -> str:
    return os.readlink(f"/proc/self/fd/{folder}")


def _judged(path: str) -> Judged | None:
    judged = JUDGED.get()
    return judged if judged is not None and judged.path == os.path.abspath(path) else None


def _check_judged(judged: Judged | None, folder: int, info: os.stat_result, path: str) -> None:
    if judged is not None and ((info.st_dev, info.st_ino) != judged.identity or _real_path(folder) != judged.folder):
        raise Changed(path)


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_folder(root: str, path: str) -> tuple[int, str]:
    """A descriptor of ``path``'s folder, reached from ``root`` one name at a
    time without following a link, and ``path``'s last name. A path outside
    ``root`` (jupyter_server's checkpoints fall back to the system's temporary
    folder) is reached from its own folder: only its last name is not followed."""
    root, path = os.path.abspath(root), os.path.abspath(path)
    relative = os.path.relpath(path, root)
    if relative == os.curdir or relative.split(os.sep, 1)[0] == os.pardir:
        root, relative = os.path.dirname(path), os.path.basename(path)
    *folders, name = relative.split(os.sep)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, folder in enumerate(folders):
            below = _open_dir(fd, folder, os.path.join(root, *folders[: depth + 1]))
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd, name


@contextlib.contextmanager
def _in_folder(root: str, path: str) -> Iterator[tuple[int, str]]:
    """:func:`open_folder`, closed at the end of the block."""
    folder, name = open_folder(root, path)
    try:
        yield folder, name
    finally:
        os.close(folder)


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(
    root: str,
    path: str,
    text: bool = True,
    encoding: str = "utf-8",
    newline: str | None = "\n",
    like: os.stat_result | None = None,
) -> Iterator[IO[Any]]:
    """A new file whose content replaces ``path`` once the block ends without
    an error (written to disk first); on an error ``path`` is left as it was.
    The new file keeps the old one's permissions, or ``like``'s permissions
    and times. An existing link at ``path`` is refused rather than replaced
    by a file (it is the user's, or the user put it there)."""
    with _in_folder(root, path) as (folder, name):
        try:
            old: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISLNK(old.st_mode):
            raise LinkRefused(path)
        # a short hidden name: ".~" + a 255-byte name would be too long
        temporary = f".~{secrets.token_hex(6)}.tmp"
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder
        )
        try:
            mode = like or old
            if mode is not None:
                os.fchmod(fd, stat.S_IMODE(mode.st_mode))
            out: IO[Any] = os.fdopen(fd, "w", encoding=encoding, newline=newline) if text else os.fdopen(fd, "wb")
            with out:
                yield out
                out.flush()
                if like is not None:
                    os.utime(out.fileno(), ns=(like.st_atime_ns, like.st_mtime_ns))
                os.fsync(out.fileno())
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise


@contextlib.contextmanager
def reading(root: str, path: str) -> Iterator[IO[bytes]]:
    """``path``, a regular file, opened for reading through no link below ``root``."""
    judged = _judged(path)
    with _in_folder(root, path) as (folder, name):
        fd = _open_file(folder, name, path, os.O_RDONLY)
        try:
            _check_judged(judged, folder, os.fstat(fd), path)
        except BaseException:
            os.close(fd)
            raise
    with os.fdopen(fd, "rb") as source:
        yield source


def open_file(folder: int, name: str, path: str) -> IO[bytes]:
    """``name`` in ``folder`` (from :func:`open_folder`) opened for reading:
    a link there is refused, and it must be a regular file."""
    return os.fdopen(_open_file(folder, name, path, os.O_RDONLY), "rb")


def _open_file(folder: int, name: str, path: str, flags: int) -> int:
    """``name`` in ``folder`` opened (not followed: a link is refused), which must be a regular file."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        if exc.errno == errno.EISDIR:
            raise NotAFile(path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def rename(root: str, source: str, destination: str) -> None:
    """Move ``source`` to ``destination`` (a name that must be free), both
    reached through no link below ``root``; what is at either name is moved
    or refused, never followed (``renameat2`` with ``RENAME_NOREPLACE``)."""
    judged = _judged(source)
    with _in_folder(root, source) as (old_folder, old_name), _in_folder(root, destination) as (new_folder, new_name):
        if judged is None:
            _renameat2(old_folder, old_name, new_folder, new_name, destination)
            return

        def as_judged(folder: int, name: str) -> bool:
            try:
                _check_judged(judged, old_folder, os.stat(name, dir_fd=folder, follow_symlinks=False), source)
            except (Changed, FileNotFoundError):
                return False
            return _real_path(new_folder) == judged.destination_folder

        if not as_judged(old_folder, old_name):
            raise Changed(source)
        _renameat2(old_folder, old_name, new_folder, new_name, destination)
        if not as_judged(new_folder, new_name):
            # swapped between the look and the move: what moved goes back
            _put_back(new_folder, new_name, old_folder, old_name, source)
            raise Changed(source)


def _put_back(folder: int, name: str, old_folder: int, old_name: str, source: str) -> None:
    """Move ``name`` back to ``old_name`` (or, taken meanwhile, to a new
    hidden name beside it); gone meanwhile (a sandbox there moved it), it
    stays where that sandbox put it: the caller refuses either way."""
    try:
        try:
            _renameat2(folder, name, old_folder, old_name, source)
        except Exists:
            _renameat2(folder, name, old_folder, f".~moved-back-{secrets.token_hex(6)}", source)
    except OSError:
        pass


_RENAME_NOREPLACE = 1


def _renameat2(old_folder: int, old_name: str, new_folder: int, new_name: str, destination: str) -> None:
    libc = _libc()
    done = libc.renameat2(old_folder, os.fsencode(old_name), new_folder, os.fsencode(new_name), _RENAME_NOREPLACE)
    if done != 0:
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise Exists(destination)
        raise OSError(code, os.strerror(code), destination)


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def make_folder(root: str, path: str, mode: int = 0o777) -> None:
    """``mkdir`` of ``path``, reached through no link below ``root``."""
    with _in_folder(root, path) as (folder, name):
        os.mkdir(name, mode, dir_fd=folder)


def remove(root: str, path: str) -> None:
    """``unlink`` of ``path`` (a link there is removed itself), reached through no link below ``root``."""
    with _in_folder(root, path) as (folder, name):
        os.unlink(name, dir_fd=folder)


def make_folders(root: str, path: str, mode: int = 0o777) -> None:
    """``os.makedirs(path, mode, exist_ok=True)`` through no link below
    ``root``: each folder is made if missing and opened without following.
    A path outside ``root`` (checkpoints kept elsewhere) is made as usual."""
    root, path = os.path.abspath(root), os.path.abspath(path)
    relative = os.path.relpath(path, root)
    if relative == os.curdir:
        return
    names = relative.split(os.sep)
    if names[0] == os.pardir:
        os.makedirs(path, mode, exist_ok=True)
        return
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(names):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
            below = _open_dir(fd, name, os.path.join(root, *names[: depth + 1]))
            os.close(fd)
            fd = below
    finally:
        os.close(fd)


def remove_tree(root: str, path: str) -> None:
    """``shutil.rmtree`` of the folder ``path``, by descriptor, through no
    link below ``root``: a link inside is removed itself, and a folder
    swapped for a link meanwhile is refused (what was removed stays removed).
    Iterative (:func:`_remove_dir`): a sandbox's folder chain thousands deep
    is removed like a flat one."""
    with _in_folder(root, path) as (folder, name):
        _remove_dir(folder, name, path)


@dataclass
class Removal:
    """What :func:`_remove_dir` did not remove (when told not to stop at the first error)."""

    #: entries left (could not be removed, on another file system, or past the limit)
    left: int = 0
    #: the first few reasons, for a log line
    reasons: list[str] = field(default_factory=list)
    #: the walk stopped before the end (the limit, or a folder moved meanwhile)
    stopped: bool = False

    def note(self, path: str, why: object) -> None:
        self.left += 1
        if len(self.reasons) < 5:
            shown = path if len(path) <= 200 else f"{path[:90]}...{path[-90:]}"  # a chain thousands deep
            self.reasons.append(f"{shown}: {why}")


@dataclass
class _Level:
    name: str
    path: str
    identity: tuple[int, int]
    #: entries of this folder left in place
    skipped: set[str] = field(default_factory=set)
    #: entries still to look at (listed when the walk first enters the folder)
    pending: list[str] | None = None


def _listing(fd: int, budget: int) -> list[str]:
    """The names in the folder ``fd``, to be taken from the end; at most one
    more than ``budget`` (negative: no limit)."""
    names: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            names.append(entry.name)
            if 0 <= budget < len(names):
                break
    names.reverse()
    return names


def _remove_dir(
    parent: int,
    name: str,
    path: str,
    *,
    strict: bool = True,
    limit: int = 0,
    one_device: bool = False,
) -> Removal:
    """Remove the folder ``name`` of ``parent`` and all it holds, never
    following a link (a link is removed itself), one folder open at a time.

    Why iterative: a sandbox makes a folder chain thousands deep in no time;
    a walk recursing once per level (``shutil.rmtree``, the walk this
    replaced) raised RecursionError there, which ``ignore_errors`` does not
    catch, and one descriptor held per level would run out of descriptors.
    Going down opens the child with ``O_NOFOLLOW``; going up opens ``..``
    and checks it is the very folder left (device and inode): a folder moved
    meanwhile stops the walk rather than removing elsewhere.

    ``strict``: the first error is raised (what was removed stays removed).
    Otherwise nothing is raised for the entries: what could not be removed is
    counted in the returned :class:`Removal`; ``limit`` (0: none) bounds the
    entries looked at, and ``one_device`` leaves folders of other file
    systems (mount points) alone."""
    done = Removal()
    budget = limit or -1
    fd = _open_dir(parent, name, path)
    stack: list[_Level] = []
    try:
        info = os.fstat(fd)
        device = info.st_dev
        _own_writable(fd, info)
        stack.append(_Level(name, path, (info.st_dev, info.st_ino)))
        while True:
            level = stack[-1]
            if level.pending is None:
                # listed once (a folder of many sub-folders is not listed
                # again after each: that was quadratic), at most what the
                # limit lets be looked at
                level.pending = _listing(fd, budget)
            below: int | None = None
            while level.pending:
                if budget == 0:
                    done.stopped = True
                    done.note(level.path, f"more than {limit:,} entries looked at: the rest was left")
                    break
                budget -= 1
                entry_name = level.pending.pop()
                entry_path = os.path.join(level.path, entry_name)
                try:
                    kind = os.stat(entry_name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISDIR(kind.st_mode):
                        os.unlink(entry_name, dir_fd=fd)
                        continue
                    if one_device and kind.st_dev != device:
                        raise OSError(errno.EXDEV, "another file system is mounted there")
                    below = _open_child(fd, entry_name, entry_path, kind)
                except FileNotFoundError:
                    continue  # gone meanwhile
                except (OSError, Refused) as exc:
                    if strict:
                        raise
                    level.skipped.add(entry_name)
                    done.note(entry_path, exc)
                    continue
                break
            if below is not None:
                os.close(fd)
                fd = below
                info = os.fstat(fd)
                _own_writable(fd, info)
                stack.append(_Level(entry_name, entry_path, (info.st_dev, info.st_ino)))
                continue
            if done.stopped:
                return done
            if len(stack) == 1:
                break
            up = os.open("..", _FOLDER, dir_fd=fd)
            upper = os.fstat(up)
            os.close(fd)
            fd = up
            finished = stack.pop()
            if (upper.st_dev, upper.st_ino) != stack[-1].identity:
                if strict:
                    raise OSError(errno.ESTALE, "a folder was moved while it was being removed", finished.path)
                done.stopped = True
                done.note(finished.path, "its folder was moved meanwhile: the walk stopped")
                return done
            try:
                os.rmdir(finished.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if strict:
                    raise
                stack[-1].skipped.add(finished.name)
                if not finished.skipped:  # else counted below already
                    done.note(finished.path, exc)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as exc:
        if strict:
            raise
        if not stack or not stack[0].skipped:
            done.note(path, exc)
    return done


def _open_child(folder: int, name: str, path: str, info: os.stat_result) -> int:
    """:func:`_open_dir`; a folder of this user it may not read (a cell's
    ``chmod 000``) is made readable first, through a descriptor of the
    folder itself (``O_PATH``: nothing followed)."""
    if info.st_uid == os.geteuid() and info.st_mode & 0o500 != 0o500:
        with contextlib.suppress(OSError):
            itself = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)
            try:
                os.chmod(f"/proc/self/fd/{itself}", stat.S_IMODE(info.st_mode) | 0o700)
            finally:
                os.close(itself)
    return _open_dir(folder, name, path)


def _own_writable(fd: int, info: os.stat_result) -> None:
    """A folder of this user that this user cannot empty (a cell's ``chmod
    500``) is made writable first, as ``rm -rf`` would need."""
    if info.st_uid == os.geteuid() and info.st_mode & 0o300 != 0o300:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(info.st_mode) | 0o700)


def trash(root: str, path: str) -> None:
    """Move ``path`` into the FreeDesktop.org trash that ``send2trash`` picks
    (the home trash on the home's file system, else the volume's
    ``.Trash-<uid>``), with its ``.trashinfo``, as send2trash does, but by
    descriptor: ``path`` is reached through no link below ``root``, and the
    trash's folders through none either when they are below ``root`` (a
    volume's trash in the workspace). send2trash itself renames by path, so a
    sandbox swapping a folder of ``path`` for the user's link meanwhile
    would have the user's host file trashed instead."""
    from send2trash import plat_other as freedesktop

    with _in_folder(root, path) as (folder, name):
        entry = os.stat(name, dir_fd=folder, follow_symlinks=False)
        where = os.fsencode(_real_path(folder))
        if entry.st_dev == freedesktop.get_dev(os.path.realpath(os.path.expanduser(b"~"))):
            topdir, trash_dir = freedesktop.XDG_DATA_HOME, freedesktop.HOMETRASH_B
        else:
            topdir = freedesktop.find_mount_point(where)
            trash_dir = freedesktop.find_ext_volume_trash(topdir)
        files, info = (os.fsdecode(os.path.join(trash_dir, part)) for part in (b"files", b"info"))
        make_folders(root, files, 0o700)
        make_folders(root, info, 0o700)
        with _folder_itself(root, files) as files_fd, _folder_itself(root, info) as info_fd:
            base, extension = os.path.splitext(name)
            counter, kept = 0, name
            while _exists(kept, files_fd) or _exists(kept + ".trashinfo", info_fd):
                counter += 1
                kept = f"{base} {counter}{extension}"
            record = os.open(
                kept + ".trashinfo",
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=info_fd,
            )
            with os.fdopen(record, "w", encoding="utf-8") as out:
                out.write(freedesktop.info_for(os.path.join(where, os.fsencode(name)), topdir))
            try:
                _renameat2(folder, name, files_fd, kept, path)
            except BaseException:
                os.unlink(kept + ".trashinfo", dir_fd=info_fd)
                raise


@contextlib.contextmanager
def _folder_itself(root: str, path: str) -> Iterator[int]:
    """A descriptor of the folder ``path``, reached through no link below ``root``."""
    with _in_folder(root, path) as (folder, name), _closing(_open_dir(folder, name, path)) as fd:
        yield fd


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


class TooLarge(Refused):
    """A folder copy past its limit (what was copied is removed)."""

    status = 400

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(
            f"{path} takes more than {limit:,} bytes of disk, the most a folder copy may "
            "(FileContentsManager.max_copy_folder_size_mb): nothing was copied"
        )


def copy_tree(root: str, source: str, destination: str, max_bytes: int = 0) -> None:
    """Copy the folder ``source`` to the new folder ``destination`` with its
    files' permissions and times, through no link below ``root``: a link
    inside it is refused (the copy stops, and what was copied is removed).

    ``max_bytes`` (0: none) bounds the disk its files take (what ``du``
    counts), as it is copied: jupyter_server measures the folder with ``du``
    first, and takes a ``du`` that fails (a subfolder a sandbox made
    unreadable) for an empty folder. Past it, the copy is removed."""
    judged = _judged(source)
    with _in_folder(root, source) as (source_folder, source_name):
        top = _open_dir(source_folder, source_name, source)
        try:
            _check_judged(judged, source_folder, os.fstat(top), source)
        except BaseException:
            os.close(top)
            raise
    budget = [max_bytes or -1]
    with _closing(top), _in_folder(root, destination) as (target_folder, target_name):
        os.mkdir(target_name, stat.S_IMODE(os.fstat(top).st_mode) | 0o700, dir_fd=target_folder)
        try:
            _fill_dir(top, source, target_folder, target_name, destination, budget, 0)
        except BaseException as exc:
            with contextlib.suppress(OSError, Refused):  # the partial copy
                _remove_dir(target_folder, target_name, destination)
            if isinstance(exc, _OverBudget):
                raise TooLarge(source, max_bytes) from None
            raise


class _OverBudget(Exception):
    pass


#: how many folders deep a folder copy goes: each level holds two open
#: folders and two stack frames, so a deeper tree (a sandbox can make one
#: 3,000 deep in a second) ended in a RecursionError, an HTTP 500
MAX_COPY_DEPTH = 128


class TooDeep(Refused):
    """A folder copy deeper than MAX_COPY_DEPTH (what was copied is removed)."""

    status = 400

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} holds folders more than {MAX_COPY_DEPTH} deep, deeper than a folder copy goes: nothing was copied"
        )


def _open_dir(folder: int, name: str, path: str) -> int:
    try:
        return os.open(name, _FOLDER, dir_fd=folder)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR} and _is_link(name, folder):
            raise LinkRefused(path) from None
        raise


def _copy_dir(source: int, source_path: str, parent: int, name: str, path: str, budget: list[int], depth: int) -> None:
    """``budget``: the bytes of disk its files may still take (negative: no
    limit); ``depth``: how far below the copied folder this one is."""
    if depth > MAX_COPY_DEPTH:
        raise TooDeep(source_path)
    os.mkdir(name, stat.S_IMODE(os.fstat(source).st_mode) | 0o700, dir_fd=parent)
    _fill_dir(source, source_path, parent, name, path, budget, depth)


def _fill_dir(source: int, source_path: str, parent: int, name: str, path: str, budget: list[int], depth: int) -> None:
    """Copy what the folder ``source`` holds into the new folder ``name`` of ``parent``."""
    info = os.fstat(source)
    with _closing(_open_dir(parent, name, path)) as target:
        for entry in sorted(os.listdir(source)):
            entry_path, target_path = os.path.join(source_path, entry), os.path.join(path, entry)
            kind = os.stat(entry, dir_fd=source, follow_symlinks=False).st_mode
            if stat.S_ISDIR(kind):
                with _closing(_open_dir(source, entry, entry_path)) as below:
                    _copy_dir(below, entry_path, target, entry, target_path, budget, depth + 1)
            elif stat.S_ISREG(kind):
                _copy_file(source, entry, entry_path, target, entry, budget)
            else:  # a link, or a node a host program would follow
                raise LinkRefused(entry_path) if stat.S_ISLNK(kind) else NotAFile(entry_path)
        os.chmod(target, stat.S_IMODE(info.st_mode))


def _copy_file(source: int, name: str, path: str, target: int, new_name: str, budget: list[int]) -> None:
    fd = _open_file(source, name, path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as inp:
        info = os.fstat(inp.fileno())
        prepaid = info.st_blocks * 512
        written = [0]

        def charge(length: int) -> None:
            """What the copy writes past what its source took when opened:
            a writer punching holes behind the copy and writing ahead of it
            kept the source small while the copy grew (an attack review)."""
            written[0] += length
            if budget[0] >= 0 and written[0] > prepaid:
                budget[0] -= min(length, written[0] - prepaid)
                if budget[0] < 0:
                    raise _OverBudget

        if budget[0] >= 0:
            budget[0] -= prepaid
            if budget[0] < 0:
                raise _OverBudget
        out_fd = os.open(
            new_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target
        )
        with os.fdopen(out_fd, "wb") as out:
            copy_data(inp.fileno(), out.fileno(), charge)
            os.fchmod(out.fileno(), stat.S_IMODE(info.st_mode))
            os.utime(out.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))


def copy(root: str, source: str, destination: str) -> None:
    """Copy a file with its permissions and times (``shutil.copy2``), through no link below ``root``."""
    with (
        reading(root, source) as inp,
        replacing(root, destination, text=False, like=os.fstat(inp.fileno())) as out,
    ):
        copy_data(inp.fileno(), out.fileno())


#: how much of a file :func:`copy_data` reads at a time
_CHUNK = 1 << 20


def copy_data(source: int, target: int, charge: Callable[[int], None] | None = None) -> None:
    """Copy the open file ``source`` into the empty file ``target``, holes
    as holes, up to the size ``source`` had when the copy began.

    Why: a sandbox makes a terabyte file in no time and no disk by seeking
    past its end; a plain copy (``shutil.copyfileobj``, ``copy2``) writes
    every zero, so duplicating its folder or checkpointing it in Lab would
    fill the host's disk. Only the data extents are copied here
    (``SEEK_DATA``/``SEEK_HOLE``), so a copy costs the disk its source
    costs; a file the sandbox grows meanwhile is copied to its first size.
    ``charge`` is told each chunk's length before it is written (it raises
    to stop the copy)."""
    size = os.fstat(source).st_size
    offset = 0
    while offset < size:
        try:
            start = os.lseek(source, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nothing but a hole up to the end
                raise
            break
        offset = min(os.lseek(source, start, os.SEEK_HOLE), size)
        while start < offset:
            chunk = os.pread(source, min(_CHUNK, offset - start), start)
            if not chunk:  # the file shrank meanwhile
                offset = size
                break
            if charge is not None:
                charge(len(chunk))
            written = 0
            while written < len(chunk):
                written += os.pwrite(target, chunk[written:], start + written)
            start += len(chunk)
    os.ftruncate(target, size)


def append(root: str, path: str, data: bytes) -> None:
    """Append ``data`` to the file at ``path``, reached through no link below ``root``."""
    with _in_folder(root, path) as (folder, name):
        fd = _open_file(folder, name, path, os.O_WRONLY | os.O_APPEND)
    with os.fdopen(fd, "ab") as out:
        out.write(data)


__all__ = [
    "JUDGED",
    "Changed",
    "Exists",
    "Judged",
    "LinkRefused",
    "NotAFile",
    "Refused",
    "TooDeep",
    "TooLarge",
    "append",
    "copy",
    "copy_data",
    "copy_tree",
    "judge",
    "make_folder",
    "make_folders",
    "open_folder",
    "reading",
    "real_folder",
    "remove",
    "remove_tree",
    "rename",
    "replacing",
    "trash",
]
