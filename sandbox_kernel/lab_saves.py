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
the workspace: a copy's read follows no link either. Deleting (to the
trash, or a folder for good) and making the checkpoints folder follow none
too, and the restore of a ``.~<name>`` backup when a notebook is unreadable
(a rename by path, of a file only a sandbox can have written) is off. Other
reads and browsing through links stay as they are: they show the user what
the user linked, and give the sandbox nothing.

A sandbox also chooses a file's size: a sparse file of gigabytes costs it no
disk, and jupyter_server read it whole into memory when the user opened it
(or Lab reopened its tab) and wrote every zero when it copied it. Files larger
than :attr:`SandboxContents.max_open_bytes` are not opened (a 403 saying why;
downloads are streamed and stay as they are), copies keep holes as holes
(:func:`sandbox_kernel.no_follow.copy_data`), and a folder copy stops at
``FileContentsManager.max_copy_folder_size_mb`` as it runs. Notebooks of
more than :attr:`SandboxContents.max_notebook_cells` are not opened either
(nbformat validates cell by cell while the server waits).

Contents managers that keep no files on the host (no ``_get_os_path``) are
left alone: nothing they store is mounted into a sandbox.

The same extension keeps saves from signing a notebook that carries saved
widget state (:mod:`sandbox_kernel.lab_signatures`): a signature is what lets
Lab build that state, and a save signed a sandbox's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import functools
import inspect
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from typing import IO, Any

from tornado.web import HTTPError
from traitlets import Bool, Integer
from traitlets.config import Configurable

from . import lab_signatures, no_follow

#: 100 MiB: a CSV or a notebook with many images opens; the server's peak stays near 1.5 GiB
DEFAULT_MAX_OPEN_BYTES = 100 * 2**20
#: a folder of 20,000 files lists in a few seconds (Lab's own file browser is slow past that)
DEFAULT_MAX_LISTED_ENTRIES = 20_000
#: a notebook of 20,000 cells opens in about a second (Lab itself is slow long before)
DEFAULT_MAX_NOTEBOOK_CELLS = 20_000

#: set while the contents manager reads a notebook: its text is counted
_READING_NOTEBOOK: contextvars.ContextVar[bool] = contextvars.ContextVar("reading_notebook", default=False)


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
        listing = _LISTING.get() if name == "listdir" else None
        if listing is not None:
            # read here, where the listing's context is (the async manager
            # lists in an executor thread, which does not carry it)
            return functools.partial(_bounded_listdir, listing)
        return getattr(self._real, name)


#: the folder being listed for a model of its content (its API path) and the
#: most entries it may have (``SandboxContents.max_listed_entries``)
_LISTING: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "sandbox_kernel_lab_listing", default=None
)


def _bounded_listdir(listing: tuple[str, int], os_path: str) -> list[str]:
    """``os.listdir`` of the folder being listed, refused past its limit as
    it reads. The count before the listing (:func:`_counted`) reads the
    folder once and jupyter_server lists it again: a sandbox watching the
    folder (inotify) swapped a folder of 100,000 entries in between (an
    attack review: listed whole, 21 s and 48 MiB of the server). This read is
    the listing's own."""
    path, limit = listing
    names: list[str] = []
    with os.scandir(os_path) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > limit:
                raise _too_many_entries(path, f"more than {limit:,}", limit)
    return names


def _move(root: str, source: str, destination: str, *args: Any, **kwargs: Any) -> str:
    with _refused_as_403():
        no_follow.rename(root, os.fspath(source), os.fspath(destination))
    return os.fspath(destination)


def _copytree(root: str, source: str, destination: str, *args: Any, max_bytes: int = 0, **kwargs: Any) -> str:
    with _refused_as_403():
        no_follow.copy_tree(root, os.fspath(source), os.fspath(destination), max_bytes)
    return os.fspath(destination)


def _mkdir(root: str, path: str, mode: int = 0o777, *args: Any, **kwargs: Any) -> None:
    with _refused_as_403():
        no_follow.make_folder(root, os.fspath(path), mode)


def _unlink(root: str, path: str, *args: Any, **kwargs: Any) -> None:
    with _refused_as_403():
        no_follow.remove(root, os.fspath(path))


def _rmtree(root: str, path: str, *args: Any, **kwargs: Any) -> None:
    with _refused_as_403():
        no_follow.remove_tree(root, os.fspath(path))


def _send2trash(root: str, path: str) -> None:
    with _refused_as_403():
        no_follow.trash(root, os.fspath(path))


def _ensure_dir_exists(root: str, path: str, mode: int = 0o777) -> None:
    with _refused_as_403():
        no_follow.make_folders(root, os.fspath(path), mode)


def install_calls(root: str, max_copy_bytes: int = 0) -> None:
    """Make jupyter_server's file contents and checkpoint modules move,
    copy folders, make folders, delete and trash through no link below
    ``root`` (their calls name the modules ``shutil`` and ``os``, and the
    functions ``send2trash`` and ``ensure_dir_exists``). ``max_copy_bytes``
    (0: none) bounds a folder copy as it runs (jupyter_server's own check,
    with ``du``, lets a folder through when ``du`` fails)."""
    from jupyter_server.services.contents import filecheckpoints, fileio, filemanager

    copytree = functools.partial(_copytree, max_bytes=max_copy_bytes)
    for module in (filemanager, filecheckpoints):
        module.shutil = _Calls(shutil, root, {"move": _move, "copytree": copytree, "rmtree": _rmtree})  # type: ignore[attr-defined]
        module.os = _Calls(os, root, {"mkdir": _mkdir, "unlink": _unlink})  # type: ignore[attr-defined]
    filemanager.send2trash = functools.partial(_send2trash, root)  # type: ignore[attr-defined]
    filecheckpoints.ensure_dir_exists = functools.partial(_ensure_dir_exists, root)  # type: ignore[attr-defined]
    fileio.replace_file = _no_recovery
    fileio.async_replace_file = _no_recovery_async


def _no_recovery(source: str, destination: str) -> None:
    """jupyter_server's only path-based renames left: an unreadable notebook
    opened with ``.~<name>`` beside it is renamed away and ``.~<name>``
    renamed in its place, by path. The saves here never make ``.~<name>``,
    so only a sandbox can have put it there: the notebook is reported
    unreadable instead."""
    raise HTTPError(
        400,
        f"Unreadable Notebook: {source} (its .~ backup is not restored: "
        "the server's saves make none, so a sandbox wrote it)",
    )


async def _no_recovery_async(source: str, destination: str) -> None:
    _no_recovery(source, destination)


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


class _Capped:
    """A file opened for reading that refuses to hand out more than
    ``limit`` bytes: the server reads a file whole into one JSON reply (a
    file of NULs costs it fifteen times its size), so a file a sandbox made
    large, or sparse (a terabyte costs the sandbox nothing), would exhaust
    the host's memory when the user opens it, or when Lab reopens its
    tabs. The size is checked when the file is opened and the reads are
    counted, so a file grown after the check is refused too."""

    def __init__(self, f: IO[Any], limit: int, path: str) -> None:
        self._f, self._limit, self._path, self._count = f, limit, path, 0
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise self._too_large(f"is {size:,} bytes")

    def _too_large(self, what: str) -> HTTPError:
        return HTTPError(
            403,
            f"{self._path} {what}: the server reads files of up to {self._limit:,} bytes whole, "
            "to open or copy them (SandboxContents.max_open_bytes). Download it instead "
            "(downloads are streamed), or raise the limit if you trust its content",
        )

    def read(self, size: int | None = -1) -> Any:
        room = self._limit + 1 - self._count
        data = self._f.read(room if size is None or size < 0 else min(size, room))
        self._count += len(data)
        if self._count > self._limit:
            raise self._too_large("has grown past the limit")
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _counted(path: str, os_path: str, limit: int) -> None:
    """Refuse to list a folder of more than ``limit`` entries: jupyter_server
    builds a model per entry, with a thread hop and a ``stat`` each, and a
    sandbox makes 200,000 empty files in 6 s (an attack review: one listing
    took 83 s and 755 MiB of the server, and Lab lists the folder it shows
    again and again)."""
    try:
        with os.scandir(os_path) as entries:
            count = sum(1 for _ in entries)
    except OSError:
        return  # jupyter_server answers for a folder it cannot list
    if count > limit:
        raise _too_many_entries(path, f"{count:,}", limit)


def _too_many_entries(path: str, count: str, limit: int) -> HTTPError:
    return HTTPError(
        403,
        f"{path or 'the root folder'} holds {count} entries: the file browser lists folders of up to "
        f"{limit:,} (SandboxContents.max_listed_entries). Look at it in a terminal, or raise the limit",
    )


def _cell_count(text: str | bytes, limit: int) -> int | None:
    """The number of cells of a notebook's text when it holds more than
    ``limit`` (None otherwise, or when it is no JSON: nbformat says so).

    Every cell is a JSON object, whose opening brace cannot be escaped: a
    text of at most ``limit`` braces is let through without being parsed
    twice, which is every ordinary notebook."""
    brace = "{" if isinstance(text, str) else b"{"
    if text.count(brace) <= limit:  # type: ignore[arg-type]
        return None
    try:
        nb = json.loads(text)
    except ValueError:
        return None
    if not isinstance(nb, dict):
        return None
    cells = nb.get("cells")
    count = len(cells) if isinstance(cells, list) else 0
    for sheet in nb.get("worksheets") or []:  # nbformat 3
        if isinstance(sheet, dict) and isinstance(sheet.get("cells"), list):
            count += len(sheet["cells"])
    return count if count > limit else None


def _too_many_cells(path: str, count: int, limit: int) -> HTTPError:
    return HTTPError(
        403,
        f"{path} holds {count:,} cells: the server opens notebooks of up to {limit:,} cells "
        "(SandboxContents.max_notebook_cells; parsing and validating each costs the server, "
        "for everyone, about a minute per million). Open it with the text editor, or raise "
        "the limit if you trust its content",
    )


def _counting_cells(cm: Any, owner: Any, limit: int) -> None:
    """Refuse a notebook of more than ``limit`` cells, counted on the very
    text ``owner`` (the contents manager or its checkpoints) is about to
    parse: nbformat validates a notebook cell by cell, and a sandbox's
    million-cell notebook (46 MB, under ``max_open_bytes``) took the server
    61 s and 1.5 GiB to open, stalling it for every user meanwhile."""
    read_notebook, read_file = owner._read_notebook, owner._read_file
    root = getattr(owner, "root_dir", None) or cm.root_dir

    def check(os_path: str, answer: Any) -> None:
        count = _cell_count(answer[0], limit)
        if count is not None:
            raise _too_many_cells(os.path.relpath(os_path, root), count, limit)

    if inspect.iscoroutinefunction(read_notebook):

        async def notebook_async(*args: Any, **kwargs: Any) -> Any:
            token = _READING_NOTEBOOK.set(True)
            try:
                return await read_notebook(*args, **kwargs)
            finally:
                _READING_NOTEBOOK.reset(token)

        async def file_async(os_path: str, *args: Any, **kwargs: Any) -> Any:
            answer = await read_file(os_path, *args, **kwargs)
            if _READING_NOTEBOOK.get():
                await asyncio.to_thread(check, os_path, answer)
            return answer

        owner._read_notebook, owner._read_file = notebook_async, file_async
    else:

        def notebook(*args: Any, **kwargs: Any) -> Any:
            token = _READING_NOTEBOOK.set(True)
            try:
                return read_notebook(*args, **kwargs)
            finally:
                _READING_NOTEBOOK.reset(token)

        def file(os_path: str, *args: Any, **kwargs: Any) -> Any:
            answer = read_file(os_path, *args, **kwargs)
            if _READING_NOTEBOOK.get():
                check(os_path, answer)
            return answer

        owner._read_notebook, owner._read_file = notebook, file


class SandboxContents(Configurable):
    """What the Lab server reads of the files in sandboxes' workspaces."""

    max_open_bytes = Integer(
        DEFAULT_MAX_OPEN_BYTES,
        config=True,
        help="""The largest file (or notebook) the contents API opens, in bytes; 0 for
        no limit. A sandbox can make a file of any size (a sparse file costs it no
        disk), and jupyter_server reads a file whole into memory to send it (up to
        fifteen times its size); a larger file gets a 403 saying so. Downloads
        (``/files/``) are streamed and not limited.""",
    )
    max_listed_entries = Integer(
        DEFAULT_MAX_LISTED_ENTRIES,
        config=True,
        help="""The most entries of a folder the file browser lists; 0 for no limit.
        A sandbox makes hundreds of thousands of files in seconds, and
        jupyter_server builds a model of each, for every listing; a larger folder
        gets a 403 saying so.""",
    )
    sign_saved_widget_state = Bool(
        False,
        config=True,
        help="""Whether a save may sign a notebook that carries saved widget state
        (``metadata.widgets``). Jupyter signs every notebook whose cells show no
        rich output, and opening a signed notebook builds its saved widgets, which
        can run script (anywidget) and render HTML outside the kernel's output
        policy; a sandbox can write such a notebook in its workspace, so by default
        no save signs one (``sandbox-kernel trust NOTEBOOK`` on the host does).""",
    )
    max_notebook_cells = Integer(
        DEFAULT_MAX_NOTEBOOK_CELLS,
        config=True,
        help="""The most cells of a notebook the contents API opens; 0 for no limit.
        The server parses and validates a notebook cell by cell before it answers,
        stalling meanwhile (a sandbox's million-cell notebook took a minute and
        1.5 GiB); a larger notebook gets a 403 saying so.""",
    )


def guard(
    cm: Any,
    max_open_bytes: int = DEFAULT_MAX_OPEN_BYTES,
    max_listed_entries: int = DEFAULT_MAX_LISTED_ENTRIES,
    max_notebook_cells: int = DEFAULT_MAX_NOTEBOOK_CELLS,
) -> bool:
    """Put no-link writes in place of ``cm``'s (sync or async managers) and
    its checkpoints', and refuse to open files larger than ``max_open_bytes``,
    notebooks of more than ``max_notebook_cells`` and to list folders of more
    than ``max_listed_entries`` (0: any); False when ``cm`` keeps no host files."""
    if not callable(getattr(cm, "_get_os_path", None)) or not callable(getattr(cm, "atomic_writing", None)):
        return False
    if max_notebook_cells:
        for owner in (cm, getattr(cm, "checkpoints", None)):
            if callable(getattr(owner, "_read_notebook", None)) and callable(getattr(owner, "_read_file", None)):
                _counting_cells(cm, owner, max_notebook_cells)
    dir_model = getattr(cm, "_dir_model", None)
    if max_listed_entries and callable(dir_model):
        if inspect.iscoroutinefunction(dir_model):

            async def listed_async(path: str, content: bool = True) -> Any:
                if not content:
                    return await dir_model(path, content=content)
                await asyncio.to_thread(_counted, path, cm._get_os_path(path), max_listed_entries)
                token = _LISTING.set((path, max_listed_entries))
                try:
                    return await dir_model(path, content=content)
                finally:
                    _LISTING.reset(token)

            cm._dir_model = listed_async
        else:

            def listed(path: str, content: bool = True) -> Any:
                if not content:
                    return dir_model(path, content=content)
                _counted(path, cm._get_os_path(path), max_listed_entries)
                token = _LISTING.set((path, max_listed_entries))
                try:
                    return dir_model(path, content=content)
                finally:
                    _LISTING.reset(token)

            cm._dir_model = listed
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
        mode = args[0] if args else kwargs.get("mode", "r")
        with contextlib.ExitStack() as stack:
            if _COPYING.get():
                stack.enter_context(cm.perm_to_403(os_path))
                stack.enter_context(_refused_as_403())
                raw = stack.enter_context(no_follow.reading(cm.root_dir, os_path))
                f: Any = raw if "b" in mode else io.TextIOWrapper(raw, encoding=kwargs.get("encoding") or "utf-8")
            else:
                f = stack.enter_context(opening(os_path, *args, **kwargs))
            if max_open_bytes and not set(mode) & set("wax+"):
                f = _Capped(f, max_open_bytes, os.path.relpath(os_path, cm.root_dir))
            yield f

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
    settings = SandboxContents(parent=serverapp)
    cm = serverapp.contents_manager
    if callable(getattr(cm, "check_and_sign", None)):
        lab_signatures.use_canonical_signatures(cm)
        lab_signatures.withhold_untrusted_widget_state(cm)
        if not settings.sign_saved_widget_state:
            lab_signatures.sign_no_widget_state(cm, serverapp.log)
    if guard(cm, settings.max_open_bytes, settings.max_listed_entries, settings.max_notebook_cells):
        install_calls(cm.root_dir, int(getattr(cm, "max_copy_folder_size_mb", 0) or 0) * 2**20)
    else:
        serverapp.log.warning(
            "sandbox_kernel.lab_saves: %s keeps no host files; saves are not checked for links",
            type(serverapp.contents_manager).__name__,
        )


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_saves"}]


__all__ = ["DEFAULT_MAX_LISTED_ENTRIES", "DEFAULT_MAX_OPEN_BYTES", "SandboxContents", "guard", "install_calls"]
