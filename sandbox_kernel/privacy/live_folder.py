"""A session's workspace where it is now, not where it was when the session began.

A sandbox's bind mount holds the folder itself, not its path: moved on the
host (a shell's ``mv``; JupyterLab refuses such moves, see
:mod:`.folder_moves`), the folder stays the sandbox's ``/workspace``. Its
ratchet level is kept under folder paths (:mod:`.workspace_levels`), so a
session that went on reading and recording at the old path would miss the
level of the place the folder went to (a private folder around it) and leave
its own rise where the folder no longer is. The session therefore holds the
folder open (``O_PATH``: no read access, nothing a sandbox can reach) and asks
the kernel for its path at each read: one ``readlink`` of ``/proc/self/fd``.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path


class LiveFolder:
    """A folder followed across renames; its configured path once it is removed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.configured = Path(path)
        self._fd: int | None = None
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return  # not there (yet): followed by its path only
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    @property
    def path(self) -> Path:
        """Where the folder is now (its configured path if it was removed, or
        could not be opened)."""
        fd = self._fd
        if fd is None:
            return self.configured
        try:
            if os.fstat(fd).st_nlink == 0:
                return self.configured  # removed: a folder made again at the path is the session's
            live = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return self.configured
        return Path(live) if live.startswith("/") else self.configured


__all__ = ["LiveFolder"]
