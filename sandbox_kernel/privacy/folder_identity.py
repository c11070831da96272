"""What identifies a folder across renames: its file handle, not its path.

Folder levels are kept under paths (:mod:`.workspace_levels`), and a rename in
JupyterLab carries them along (:mod:`.folder_moves`). A host shell's ``mv``
(a JupyterLab terminal's too) does not pass through the server: the private
folder arrives under a new name with no record, and the next notebook opened
in it would start with network beside its rows. So a private folder is also
recorded under its identity, which a rename keeps.

The identity is the kernel's file handle (``name_to_handle_at``, what NFS
servers give clients): the inode number *and* its generation on ext4, xfs,
btrfs and tmpfs, so a folder made later that reuses a deleted private
folder's inode number (ext4 does so at once) is not taken for it. Making a
handle needs no privilege (only opening one does). The device number keeps
two filesystems apart. Filesystems without handles fall back to the device
and inode numbers: a reused inode number then makes a new folder private
(fails closed, never open). Python has no binding for the call, hence
``ctypes``.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import struct
from typing import Any

_AT_EMPTY_PATH = 0x1000
#: room for the handle's bytes (MAX_HANDLE_SZ in the kernel's headers)
_MAX_HANDLE = 128
_NO_HANDLES = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EOVERFLOW, errno.EINVAL}

_name_to_handle_at: Any
try:
    _name_to_handle_at = ctypes.CDLL(None, use_errno=True).name_to_handle_at
except (AttributeError, OSError):  # a libc without it
    _name_to_handle_at = None


def _handle(fd: int) -> bytes | None:
    """The kernel's handle of an open folder (type and bytes), or None where
    the filesystem gives none."""
    if _name_to_handle_at is None:
        return None
    buf = ctypes.create_string_buffer(8 + _MAX_HANDLE)
    struct.pack_into("Ii", buf, 0, _MAX_HANDLE, 0)
    mount_id = ctypes.c_int()
    if _name_to_handle_at(fd, b"", buf, ctypes.byref(mount_id), _AT_EMPTY_PATH) != 0:
        code = ctypes.get_errno()
        if code in _NO_HANDLES:
            return None
        raise OSError(code, os.strerror(code))
    size, kind = struct.unpack_from("Ii", buf, 0)
    return struct.pack("i", kind) + buf.raw[8 : 8 + size]


def folder_identity(path: str | os.PathLike[str]) -> str | None:
    """A key naming the folder at ``path`` wherever it is renamed to on its
    filesystem, or None if there is no folder there. Symlinks are followed
    (levels are kept for resolved folders)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        try:
            handle = _handle(fd)
        except OSError:
            return None
    finally:
        os.close(fd)
    named = f"{st.st_dev}:".encode() + (f"inode:{st.st_ino}".encode() if handle is None else b"handle:" + handle)
    return "f-" + hashlib.sha256(named).hexdigest()[:40]


__all__ = ["folder_identity"]
