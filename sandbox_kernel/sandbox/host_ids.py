"""The host uid a sandbox runs as, and the access it is granted.

A kernel started as root (common in containers) used to give its sandboxes
host root's file access: bwrap maps the sandbox's uid 1000 to the uid that
started it, so a 0600 root-owned file inside a read-only mount was readable
from a cell, and every file a cell wrote was owned by root. When the kernel
runs as root, the sandbox therefore runs as an unprivileged host uid
(``SANDBOX_UID``, 65534 "nobody" by default; ``SandboxKernel.sandbox_uid``
sets another). Host files are then accessed as that uid: what "others" may
not read stays unreadable.

What the sandbox must reach is granted with POSIX ACL entries for exactly that
uid, merged into whatever ACL a path already has (nothing is taken away from
anyone, nobody else gains anything):

- the directories leading to a mount's source get ``--x`` (traverse, not list)
  where "others" could not traverse them (e.g. ``/root`` when Python lives in
  ``/root/.pyenv``);
- a read-write mount's source (the workspace, the checkpoint folder) gets
  ``rwx`` plus the same as its default ACL, so files created later, by either
  side, stay shared. Files that existed before keep their permissions: the
  sandbox can read what "others" may read, and write what it created.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

#: the host uid/gid of sandboxes started by root, unless configured otherwise
SANDBOX_UID = 65534
SANDBOX_GID = 65534

_ACL_ACCESS = "system.posix_acl_access"
_ACL_DEFAULT = "system.posix_acl_default"
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF


class AccessGrantError(OSError):
    """The sandbox's uid could not be given access to something it must reach."""


def run_as_for(configured: int | None) -> tuple[int, int] | None:
    """(uid, gid) the sandbox runs as on the host, or None for "as this process".

    ``configured`` is the user's setting: None (or negative) means automatic,
    i.e. :data:`SANDBOX_UID` when this process is root and unchanged
    otherwise (an unprivileged kernel cannot switch uids, and its sandbox
    already has no more than its own access). 0 is an explicit opt-out for root.
    """
    if os.geteuid() != 0:
        return None
    if configured is None or configured < 0:
        return (SANDBOX_UID, SANDBOX_GID)
    if configured == 0:
        return None
    return (configured, configured)


def _parse(blob: bytes) -> list[tuple[int, int, int]]:
    if len(blob) < 4 or struct.unpack_from("<I", blob)[0] != 2 or (len(blob) - 4) % 8:
        raise ValueError("unknown ACL format")
    return [struct.unpack_from("<HHI", blob, off) for off in range(4, len(blob), 8)]


def _from_mode(mode: int) -> list[tuple[int, int, int]]:
    return [
        (_USER_OBJ, (mode >> 6) & 7, _UNDEFINED),
        (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED),
        (_OTHER, mode & 7, _UNDEFINED),
    ]


def _with_user(entries: list[tuple[int, int, int]], uid: int, perm: int) -> list[tuple[int, int, int]]:
    """``entries`` plus ``perm`` for ``uid`` (never fewer rights than before),
    with the mask recomputed to cover every group-class entry."""
    current = {ident: p for tag, p, ident in entries if tag == _USER}
    current[uid] = current.get(uid, 0) | perm
    base = [e for e in entries if e[0] not in (_USER, _MASK)]
    users = [(_USER, p, ident) for ident, p in sorted(current.items())]
    group_class = [p for tag, p, _ in base if tag in (_GROUP_OBJ, _GROUP)] + [p for _, p, _ in users]
    mask = 0
    for p in group_class:
        mask |= p
    merged = base + users + [(_MASK, mask, _UNDEFINED)]
    order = {_USER_OBJ: 0, _USER: 1, _GROUP_OBJ: 2, _GROUP: 3, _MASK: 4, _OTHER: 5}
    merged.sort(key=lambda e: (order[e[0]], e[2]))
    return merged


def _blob(entries: list[tuple[int, int, int]]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _add_entry(fd: int, st: os.stat_result, name: str, uid: int, perm: int) -> None:
    """Merge ``perm`` for ``uid`` into the ACL ``name`` of ``fd`` (starting from
    the mode bits when it has none)."""
    try:
        entries = _parse(os.getxattr(fd, name))
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, getattr(errno, "ENOATTR", errno.ENODATA)):
            raise
        entries = _from_mode(st.st_mode)
    os.setxattr(fd, name, _blob(_with_user(entries, uid, perm)))


def _grant_fd(fd: int, st: os.stat_result, uid: int, perm: int, default: bool) -> None:
    _add_entry(fd, st, _ACL_ACCESS, uid, perm)
    if default and stat.S_ISDIR(st.st_mode):
        _add_entry(fd, st, _ACL_DEFAULT, uid, perm)


def _may(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether plain mode bits already give ``uid`` the rights ``want``
    (an existing ACL can only have been set by someone on purpose; when the
    bits say no, an entry is added rather than reasoning about it)."""
    if st.st_uid == uid:
        bits = (st.st_mode >> 6) & 7
    elif st.st_gid == gid:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return bits & want == want


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def grant(path: Path, uid: int, gid: int, *, write: bool) -> None:
    """Let ``uid`` reach ``path`` (traverse every parent) and use it: read, or
    read and write (plus a default ACL) when ``write``. Each directory is
    opened without following symlinks, and the ACL set on that descriptor,
    so a path swapped underneath cannot redirect the grant."""
    # The links of the path as the user configured it are followed once, here
    # (a venv or workspace behind a linked folder: opening the link as a
    # folder below failed with ENOTDIR and every sandbox start failed); a
    # link met on the walk was put there since, and is refused.
    configured = Path(os.path.abspath(path))
    path = Path(os.path.realpath(configured))
    parts = path.parts
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
            try:
                nfd = os.open(name, flags | os.O_NONBLOCK, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, fd):
                    raise AccessGrantError(
                        exc.errno,
                        f"cannot give the sandbox's uid {uid} access to {configured}: {Path(*parts[: i + 1])} "
                        "became a symbolic link while it was being granted",
                    ) from exc
                raise
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            want = (7 if write else (5 if stat.S_ISDIR(st.st_mode) else 4)) if last else 1
            # No cache across calls: a deleted folder's inode comes back for a new one.
            if not _may(st, uid, gid, want) or (last and write):
                try:
                    _grant_fd(fd, st, uid, want, default=last and write)
                except (OSError, ValueError) as exc:
                    raise AccessGrantError(
                        getattr(exc, "errno", None) or errno.EPERM,
                        f"cannot give the sandbox's uid {uid} access to {Path(*parts[: i + 1])} "
                        f"(needed for {path}): setting a POSIX ACL failed ({exc}). Use a filesystem with ACL "
                        "support, make the path readable by others, or set SandboxKernel.sandbox_uid",
                    ) from exc
    finally:
        if fd >= 0:
            os.close(fd)


#: entries of a workspace shared at most per sandbox start (a bigger folder is
#: shared as far as this goes, and the rest keeps its permissions, logged)
SHARE_TREE_LIMIT = 20_000


def share_tree(root: Path, uid: int, gid: int, limit: int = SHARE_TREE_LIMIT) -> int:
    """Give ``uid`` read-write access to what already exists in a workspace, so
    a root kernel's notebook can still overwrite the data files root made.

    Only what "others" may already read is shared: a file root keeps to
    itself (0600) stays unreadable, whatever its name. The name cannot
    decide it: the sandbox may rename any entry of a folder it can write,
    and a 0600 ``.env`` renamed ``env`` was shared at the next start.
    Dot-entries are left alone too (the places host programs trust live
    there, and the workspace policy masks them anyway), symlinks are never
    followed, and only regular files and directories are touched. Returns
    how many entries were looked at; stops after ``limit``."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in [*dirnames, *filenames]:
            if name.startswith("."):
                continue
            seen += 1
            if seen > limit:
                return seen
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                is_dir = stat.S_ISDIR(st.st_mode)
                if not (is_dir or stat.S_ISREG(st.st_mode)) or not st.st_mode & stat.S_IROTH:
                    continue
                want = 7 if is_dir else 6
                if not _may(st, uid, gid, want):
                    try:
                        _grant_fd(fd, st, uid, want, default=is_dir)
                    except (OSError, ValueError):
                        continue
            finally:
                os.close(fd)
    return seen
