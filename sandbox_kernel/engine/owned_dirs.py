"""Temporary folders named after the process that made them, so the next one
can remove those of processes that died without cleaning up (SIGKILL, OOM).

A folder ``<prefix><pid>-<random>`` is removed by a later process only when
it is a real directory (not a symlink), owned by the same uid, and no process
``pid`` is alive: another user's folders, and live kernels', are never touched.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from .. import no_follow

log = logging.getLogger("sandbox_kernel.owned_dirs")

#: the most entries :func:`remove_tree` looks at in one call (what lies
#: beyond is left, logged, and met again by the next collection)
REMOVE_LIMIT = 1_000_000
#: where host-owned runtime folders are made besides :func:`tempfile.gettempdir`
#: (each session's egress proxy socket folder, ``sk-egress-*``)
EGRESS_BASE = "/tmp"


def make(prefix: str, base: str | None = None) -> Path:
    """A new private folder (0700) named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


def bases() -> tuple[Path, ...]:
    """The folders in which host-owned runtime folders are made (a workspace
    may not be or contain one: engine/workspace_policy.py)."""
    return tuple(dict.fromkeys(Path(os.path.realpath(p)) for p in (EGRESS_BASE, tempfile.gettempdir())))


def remove_tree(path: str | os.PathLike[str], *, limit: int = REMOVE_LIMIT) -> bool:
    """Remove the folder ``path`` and all it holds; True when it is gone.

    For the host's own folders that a sandbox wrote into (state, runtime,
    package layers): never raises, never follows a link (a link inside is
    removed itself; a link AT ``path`` is left), never crosses into another
    file system, walks one folder at a time (no recursion: a chain thousands
    deep made ``shutil.rmtree(..., ignore_errors=True)`` raise RecursionError,
    which stopped every later kernel from starting), and looks at no more
    than ``limit`` entries. What it leaves is logged."""
    where = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(where)
    if not name:
        log.error("not removing %s: not a folder below another", where)
        return False
    try:
        parent = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("could not remove %s: %s", where, exc)
        return False
    try:
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(info.st_mode):
            log.warning("not removing %s: not a folder (a link or file is left as it is)", where)
            return False
        done = no_follow._remove_dir(parent, name, where, strict=False, limit=limit, one_device=True)
    except Exception as exc:  # never raises: a caller is shutting down or starting
        log.warning("could not remove %s: %s", where, exc)
        return False
    finally:
        os.close(parent)
    if done.left or done.stopped:
        log.warning(
            "removing %s left %d entr%s%s: %s",
            where,
            done.left,
            "y" if done.left == 1 else "ies",
            " (stopped before the end)" if done.stopped else "",
            "; ".join(done.reasons),
        )
        return False
    return True


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
        if remove_tree(entry.path):
            removed += 1
    return removed


__all__ = ["bases", "collect_stale", "make", "remove_tree"]
