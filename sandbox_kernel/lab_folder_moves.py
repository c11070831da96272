"""Jupyter server extension: moves and copies in JupyterLab keep the ratchet's folder levels.

A rename or a drag in the file browser, and cut, copy, paste and duplicate,
reach the server as ``rename_file`` and ``copy`` calls of its contents
manager. Each is checked first by :mod:`sandbox_kernel.privacy.folder_moves`:
a folder takes its levels along, and private data does not go into a folder
of a lower level (the request fails with 403 and a message that Lab shows).

Contents managers that keep no files on the host (no ``_get_os_path``) are
left alone: nothing they store is mounted into a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tornado.web import HTTPError

from . import no_follow
from .privacy.folder_moves import MoveRefused, TargetTaken, guard_copy, guard_move


def _shown(root: str) -> Callable[[Path], str]:
    """Paths as the file browser names them (relative to the server's root)."""
    base = os.path.realpath(root)

    def shown(path: Path) -> str:
        relative = os.path.relpath(path, base)
        return repr(relative if not relative.startswith("..") else str(path))

    return shown


def _copy_destination(cm: Any, source: no_follow.Judged, to_path: str | None) -> str:
    """The real path of the folder a copy lands in, as the contents manager
    decides it (the folder of the ``source`` judged without a ``to_path``,
    ``to_path`` when it is a folder, else the folder of ``to_path``), reached
    through no link below the root: the copy's write follows none either."""
    root = cm.root_dir
    if to_path is None:
        return source.folder
    target = cm._get_os_path(to_path.strip("/"))
    try:
        return no_follow.real_folder(root, target)
    except (NotADirectoryError, FileNotFoundError):  # a file's new name: its folder
        return no_follow.real_folder(root, os.path.dirname(target))


def _refused(exc: Exception) -> HTTPError:
    if isinstance(exc, TargetTaken):
        return HTTPError(409, str(exc))
    if isinstance(exc, no_follow.Refused):
        return HTTPError(exc.status, str(exc))
    if isinstance(exc, FileNotFoundError):
        return HTTPError(404, f"File or directory does not exist: {exc.filename or ''}")
    return HTTPError(403, str(exc))


def guard(cm: Any) -> bool:
    """Wrap ``cm``'s ``rename_file`` and ``copy`` (sync or async managers);
    False when ``cm`` keeps no host files.

    The guard judges the entry it finds at the source (through no link
    below the root, by its real place) and the move or copy runs only on
    that entry (:data:`sandbox_kernel.no_follow.JUDGED`): a sandbox renaming
    entries meanwhile gets a 409, not an unchecked move."""
    if not callable(getattr(cm, "_get_os_path", None)):
        return False
    shown = _shown(cm.root_dir)
    rename_file, copy = cm.rename_file, cm.copy

    def check_rename(old_path: str, new_path: str) -> no_follow.Judged:
        old, new = cm._get_os_path(old_path.strip("/")), cm._get_os_path(new_path.strip("/"))
        try:
            judged = no_follow.judge(cm.root_dir, old, new)
            guard_move(
                os.path.join(judged.folder, os.path.basename(old)),
                os.path.join(judged.destination_folder, os.path.basename(new)),
                shown=shown,
                is_folder=judged.is_folder,
            )
        except (MoveRefused, no_follow.Refused, OSError) as exc:
            raise _refused(exc) from None
        return judged

    def check_copy(from_path: str, to_path: str | None) -> no_follow.Judged:
        source = cm._get_os_path(from_path.strip("/"))
        try:
            judged = no_follow.judge(cm.root_dir, source)
            guard_copy(
                os.path.join(judged.folder, os.path.basename(source)),
                _copy_destination(cm, judged, to_path),
                shown=shown,
                is_folder=judged.is_folder,
            )
        except (MoveRefused, no_follow.Refused, OSError) as exc:
            raise _refused(exc) from None
        return judged

    if inspect.iscoroutinefunction(rename_file):
        # the checks read the ratchet's records and list folders: off the server's event loop
        @functools.wraps(rename_file)
        async def guarded_rename(old_path: str, new_path: str) -> Any:
            with _judged(await asyncio.to_thread(check_rename, old_path, new_path)):
                return await rename_file(old_path, new_path)

        @functools.wraps(copy)
        async def guarded_copy(from_path: str, to_path: str | None = None) -> Any:
            with _judged(await asyncio.to_thread(check_copy, from_path, to_path)):
                return await copy(from_path, to_path)

    else:

        @functools.wraps(rename_file)
        def guarded_rename(old_path: str, new_path: str) -> Any:
            with _judged(check_rename(old_path, new_path)):
                return rename_file(old_path, new_path)

        @functools.wraps(copy)
        def guarded_copy(from_path: str, to_path: str | None = None) -> Any:
            with _judged(check_copy(from_path, to_path)):
                return copy(from_path, to_path)

    cm.rename_file, cm.copy = guarded_rename, guarded_copy
    return True


@contextlib.contextmanager
def _judged(judged: no_follow.Judged) -> Iterator[None]:
    """The move or copy in the block acts only on the entry ``judged``."""
    token = no_follow.JUDGED.set(judged)
    try:
        yield
    finally:
        no_follow.JUDGED.reset(token)


def _load_jupyter_server_extension(serverapp: Any) -> None:
    if not guard(serverapp.contents_manager):
        serverapp.log.info(
            "sandbox_kernel.lab_folder_moves: %s keeps no host files; moves are not checked",
            type(serverapp.contents_manager).__name__,
        )


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_folder_moves"}]


__all__ = ["guard"]
