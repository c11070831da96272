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
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from typing import IO, Any

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefused(Exception):
    """A write that would go through a symbolic link below the root."""

    def __init__(self, link: str) -> None:
        self.link = link
        super().__init__(
            f"{link} is a symbolic link: the server writes nothing through a link inside the folders it serves, "
            "since a sandbox can give a link there a new name. Open the file at the place the link points to."
        )


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
            try:
                below = os.open(folder, _FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno in {errno.ELOOP, errno.ENOTDIR} and _is_link(folder, fd):
                    raise LinkRefused(os.path.join(root, *folders[: depth + 1])) from None
                raise
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd, name


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
    folder, name = open_folder(root, path)
    try:
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
    finally:
        os.close(folder)


@contextlib.contextmanager
def reading(root: str, path: str) -> Iterator[IO[bytes]]:
    """``path`` opened for reading, reached through no link below ``root``."""
    folder, name = open_folder(root, path)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkRefused(path) from None
            raise
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as source:
        yield source


def copy(root: str, source: str, destination: str) -> None:
    """Copy a file with its permissions and times (``shutil.copy2``), through no link below ``root``."""
    with (
        reading(root, source) as inp,
        replacing(root, destination, text=False, like=os.fstat(inp.fileno())) as out,
    ):
        shutil.copyfileobj(inp, out)


def append(root: str, path: str, data: bytes) -> None:
    """Append ``data`` to the file at ``path``, reached through no link below ``root``."""
    folder, name = open_folder(root, path)
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkRefused(path) from None
            raise
    finally:
        os.close(folder)
    with os.fdopen(fd, "ab") as out:
        out.write(data)


__all__ = ["LinkRefused", "append", "copy", "open_folder", "reading", "replacing"]
