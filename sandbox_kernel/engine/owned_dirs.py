"""Temporary folders named after the process that made them, so the next one
can remove those of processes that died without cleaning up (SIGKILL, OOM).

A folder ``<prefix><pid>-<random>`` is removed by a later process only when
it is a real directory (not a symlink), owned by the same uid, and no process
``pid`` is alive: another user's folders, and live kernels', are never touched.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def make(prefix: str, base: str | None = None) -> Path:
    """A new private folder (0700) named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collect_stale(prefix: str, base: str | None = None) -> int:
    """Remove the folders of dead processes; how many were removed."""
    root = Path(base or tempfile.gettempdir())
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


__all__ = ["collect_stale", "make"]
