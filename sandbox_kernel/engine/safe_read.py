"""Reading files a sandbox could have written: no symlinks, no FIFOs, bounded."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class UnsafeFileError(OSError):
    pass


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """Open without following symlinks and without blocking on FIFOs; refuse
    anything that is not a regular file or is larger than ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symlink
            raise UnsafeFileError(f"{path} is a symlink; refusing to read it") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path} is not a regular file; refusing to read it")
        if info.st_size > max_bytes:
            raise UnsafeFileError(f"{path} is {info.st_size} bytes, over the {max_bytes}-byte limit")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise UnsafeFileError(f"{path} grew over the {max_bytes}-byte limit")
        return data
    finally:
        os.close(fd)


def read_json(path: Path, max_bytes: int = 1 << 20) -> Any:
    return json.loads(read_bytes(path, max_bytes))
