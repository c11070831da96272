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
is refused with a 403 that names the link, which Lab shows. Reading and
browsing through links stay as they are: they show the user what the user
linked, and give the sandbox nothing.

Contents managers that keep no files on the host (no ``_get_os_path``) are
left alone: nothing they store is mounted into a sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import IO, Any

from tornado.web import HTTPError

from . import no_follow


@contextlib.contextmanager
def _refused_as_403() -> Iterator[None]:
    try:
        yield
    except no_follow.LinkRefused as exc:
        raise HTTPError(403, str(exc)) from None


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
    if not guard(serverapp.contents_manager):
        serverapp.log.warning(
            "sandbox_kernel.lab_saves: %s keeps no host files; saves are not checked for links",
            type(serverapp.contents_manager).__name__,
        )


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_saves"}]


__all__ = ["guard"]
