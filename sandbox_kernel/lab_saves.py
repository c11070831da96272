"""Jupyter server extension: JupyterLab's saves and checkpoints follow no link a sandbox could have moved.

jupyter_server writes a saved notebook or file through a link at its name,
copies the old content to ``.~<name>`` through a link there, and writes and
reads checkpoints through a link at ``.ipynb_checkpoints`` or at the file's
name. A sandbox can move a link the user left in its workspace to any of
those names (:mod:`sandbox_kernel.no_follow` says how, and what it won).

This extension puts :mod:`sandbox_kernel.no_follow`'s writes in place of the
contents manager's and its checkpoints' (the methods every save, upload,
new file and checkpoint goes through): a save replaces the file by a new one
(so ``.~<name>`` is no longer made, and ``use_atomic_writing=False`` no
longer writes in place), and a path through a link below the server's root
is refused with a 403 that names the link, which Lab shows.

The file browser's other operations write too, and an attack review made
each of them cross a link the sandbox had moved: a move or rename
(``shutil.move``) put a file, or a private session's folder, into a linked
host folder (and raced a rename within one folder); a new folder was made
there (``os.mkdir``); duplicating a folder (``shutil.copytree``) copied
linked host files into the workspace and wrote through a linked
destination; renaming a notebook moved its checkpoint, the sandbox's bytes,
into a host folder; a checkpoint's delete unlinked through a link. Those
calls of jupyter_server's contents and checkpoint modules are their
no-link equivalents here (:func:`install_calls`: the modules' ``shutil`` and
``os`` names, for the server's root). Duplicating a file read the source
through a link at its name, copying a host file the sandbox cannot see into
the workspace: a copy's read follows no link either. Other reads and
browsing through links stay as they are: they show the user what the user
linked, and give the sandbox nothing.

Contents managers that keep no files on the host (no ``_get_os_path``) are
left alone: nothing they store is mounted into a sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import functools
import inspect
import io
import os
import shutil
from collections.abc import Callable, Iterator
from typing import IO, Any

from tornado.web import HTTPError

from . import no_follow


@contextlib.contextmanager
def _refused_as_403() -> Iterator[None]:
    try:
        yield
    except no_follow.Refused as exc:
        raise HTTPError(exc.status, str(exc)) from None


#: set while the contents manager copies a file: its read of the source follows no link
_COPYING: contextvars.ContextVar[bool] = contextvars.ContextVar("sandbox_kernel_lab_copying", default=False)


class _Calls:
    """One of jupyter_server's module names (``os``, ``shutil``) with the
    calls that write replaced by no-link ones below ``root``; everything
    else is the real module's."""

    def __init__(self, real: Any, root: str, replaced: dict[str, Callable[..., Any]]) -> None:
        self._real, self._root, self._replaced = real, root, replaced

    def __getattr__(self, name: str) -> Any:
        if name in self._replaced:
            return functools.partial(self._replaced[name], self._root)
        return getattr(self._real, name)


def _move(root: str, source: str, destination: str, *args: Any, **kwargs: Any) -> str:
    with _refused_as_403():
        no_follow.rename(root, os.fspath(source), os.fspath(destination))
    return os.fspath(destination)


def _copytree(root: str, source: str, destination: str, *args: Any, **kwargs: Any) -> str:
    with _refused_as_403():
        no_follow.copy_tree(root, os.fspath(source), os.fspath(destination))
    return os.fspath(destination)


def _mkdir(root: str, path: str, mode: int = 0o777, *args: Any, **kwargs: Any) -> None:
    with _refused_as_403():
        no_follow.make_folder(root, os.fspath(path), mode)


def _unlink(root: str, path: str, *args: Any, **kwargs: Any) -> None:
    with _refused_as_403():
        no_follow.remove(root, os.fspath(path))


def install_calls(root: str) -> None:
    """Make jupyter_server's file contents and checkpoint modules move,
    copy folders, make folders and unlink through no link below ``root``
    (their calls name the modules ``shutil`` and ``os``)."""
    from jupyter_server.services.contents import filecheckpoints, filemanager

    for module in (filemanager, filecheckpoints):
        module.shutil = _Calls(shutil, root, {"move": _move, "copytree": _copytree})  # type: ignore[attr-defined]
        module.os = _Calls(os, root, {"mkdir": _mkdir, "unlink": _unlink})  # type: ignore[attr-defined]


def _atomic_writing(cm: Any) -> Callable[..., Any]:
    @contextlib.contextmanager
    def atomic_writing(os_path: str, text: bool = True, encoding: str = "utf-8", **kwargs: Any) -> Iterator[IO[Any]]:
        with (
            cm.perm_to_403(os_path),
            _refused_as_403(),
            no_follow.replacing(cm.root_dir, os_path, text, encoding, kwargs.get("newline", "\n")) as out,
        ):
            yield out

    return atomic_writing


def _decoded(os_path: str, content: str, format: str) -> bytes:
    """A chunk's bytes, as jupyter_server's ``_save_large_file`` decodes them."""
    if format not in {"text", "base64"}:
        raise HTTPError(400, "Must specify format of file contents as 'text' or 'base64'")
    try:
        return content.encode("utf8") if format == "text" else base64.b64decode(content.encode("ascii"))
    except Exception as exc:
        raise HTTPError(400, f"Encoding error saving {os_path}: {exc}") from exc


def guard(cm: Any) -> bool:
    """Put no-link writes in place of ``cm``'s (sync or async managers) and
    its checkpoints'; False when ``cm`` keeps no host files."""
    if not callable(getattr(cm, "_get_os_path", None)) or not callable(getattr(cm, "atomic_writing", None)):
        return False
    cm.atomic_writing = _atomic_writing(cm)
    asynchronous = inspect.iscoroutinefunction(getattr(cm, "_save_file", None))

    def append(os_path: str, content: str, format: str) -> None:
        data = _decoded(os_path, content, format)
        with cm.perm_to_403(os_path), _refused_as_403():
            no_follow.append(cm.root_dir, os_path, data)

    if callable(getattr(cm, "_save_large_file", None)):
        cm._save_large_file = _maybe_async(append, asynchronous)

    opening, copy_file = cm.open, cm.copy

    @contextlib.contextmanager
    def open_(os_path: str, *args: Any, **kwargs: Any) -> Iterator[IO[Any]]:
        if not _COPYING.get():
            with opening(os_path, *args, **kwargs) as f:
                yield f
            return
        mode = args[0] if args else kwargs.get("mode", "r")
        with cm.perm_to_403(os_path), _refused_as_403(), no_follow.reading(cm.root_dir, os_path) as raw:
            yield raw if "b" in mode else io.TextIOWrapper(raw, encoding=kwargs.get("encoding") or "utf-8")

    async def copy_async(from_path: str, to_path: str | None = None) -> Any:
        token = _COPYING.set(True)
        try:
            return await copy_file(from_path, to_path)
        finally:
            _COPYING.reset(token)

    def copy_sync(from_path: str, to_path: str | None = None) -> Any:
        token = _COPYING.set(True)
        try:
            return copy_file(from_path, to_path)
        finally:
            _COPYING.reset(token)

    cm.open = open_
    cm.copy = copy_async if inspect.iscoroutinefunction(copy_file) else copy_sync

    checkpoints = getattr(cm, "checkpoints", None)
    if checkpoints is not None and callable(getattr(checkpoints, "_copy", None)):
        root = getattr(checkpoints, "root_dir", None) or cm.root_dir

        def copy(source: str, destination: str) -> None:
            with checkpoints.perm_to_403(destination), _refused_as_403():
                no_follow.copy(root, source, destination)

        checkpoints._copy = _maybe_async(copy, inspect.iscoroutinefunction(checkpoints._copy))
    return True


def _maybe_async(function: Callable[..., None], asynchronous: bool) -> Callable[..., Any]:
    """``function``, or a coroutine function running it in a thread (file
    writes stay off the server's event loop, as jupyter_server's do)."""
    if not asynchronous:
        return function

    async def in_a_thread(*args: Any) -> None:
        await asyncio.to_thread(function, *args)

    return in_a_thread


def _load_jupyter_server_extension(serverapp: Any) -> None:
    if guard(serverapp.contents_manager):
        install_calls(serverapp.contents_manager.root_dir)
    else:
        serverapp.log.warning(
            "sandbox_kernel.lab_saves: %s keeps no host files; saves are not checked for links",
            type(serverapp.contents_manager).__name__,
        )


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_saves"}]


__all__ = ["guard", "install_calls"]
