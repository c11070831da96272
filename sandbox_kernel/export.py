"""``sandbox-kernel export``: nbconvert for notebooks a sandbox wrote.

Why: ``jupyter nbconvert`` on the host trusts the file it converts. ``--to
script`` imports a dotted ``language_info.nbconvert_exporter`` and calls it, or
makes whatever installed exporter a plain one names; ``--to html`` and
``--to slides`` write the notebook's scripts, remote images and refreshes into
a page the user then opens from disk. This command converts as the Lab
server does (:mod:`sandbox_kernel.lab_exports`,
:mod:`sandbox_kernel.lab_html_exports`): the same refusals, the same confined
page. The user's nbconvert configuration (``jupyter_nbconvert_config.py`` in
the Jupyter config dirs: a MathJax address, a template) applies as it does to
``jupyter nbconvert``.

A sandbox cannot make a link (seccomp) but can rename one the workspace
holds (the user's ``data -> /mnt/data``): renamed to the notebook's name, the
command read the host file it names and wrote its page into the workspace;
swapped with a folder of the path while the conversion ran, the output went
through it and replaced a host file outside the workspace (an attack review).
So below the current directory (the whole path when it lies elsewhere: its
folder is opened once) every name is opened without following a link, the
notebook and its output are read and written through that one descriptor of
their folder, and the output is a new file renamed into place: a link at its
name is replaced, never written through.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from . import no_follow
from .terminal_text import terminal_safe_output

#: the formats this command makes, by nbconvert's exporter name
FORMATS = ("html", "slides", "script")


class ExportError(Exception):
    """What was wrong with the notebook or the request, in words for the user."""


def _config() -> Any:
    """The user's nbconvert configuration, from the Jupyter config dirs (never
    the notebook's folder), read as the kernel reads its own (app.py): by
    traitlets' ``Application.load_config_file``, ``.py`` and ``.json``, the
    first dir winning."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config import Application

    reader = Application()
    reader.load_config_file("jupyter_nbconvert_config", path=jupyter_config_path())
    return reader.config


def export(path: Path, fmt: str, config: Any = None) -> tuple[str, str]:
    """The notebook at ``path`` in format ``fmt``, and the file extension to
    write it with. Raises :class:`ExportError` naming what is wrong."""
    try:
        folder, name = _open_folder(path)
    except OSError as exc:
        raise ExportError(f"{path}: {exc.strerror or exc}") from None
    try:
        return convert(_read(folder, name, path)[0], path, fmt, config)
    finally:
        os.close(folder)


def convert(notebook: Any, path: Path, fmt: str, config: Any = None) -> tuple[str, str]:
    """``notebook`` (read from ``path``) in format ``fmt``, as the Lab server
    converts it, and the extension to write it with."""
    import nbformat
    from nbconvert.exporters import get_exporter

    from .lab_exports import exporter_problem, keep_templates_out_of_the_working_directory
    from .lab_html_exports import confined_class

    keep_templates_out_of_the_working_directory()  # (before nbconvert makes an exporter: it reads conf.json)

    if fmt not in FORMATS:
        raise ExportError(f"--to {fmt!r} is not one of {', '.join(FORMATS)}")
    try:  # nbformat's reader only warns; the exporter would raise from deep inside
        nbformat.validate(notebook)
    except nbformat.ValidationError as exc:
        where = "".join(f"[{part!r}]" for part in exc.absolute_path)
        # (what the schema quotes of the file is the sandbox's: no terminal sequence)
        message = terminal_safe_output(" ".join(str(exc.message).split())[:300], keep_colours=False)
        raise ExportError(f"{path} is not a valid notebook: {message} (at {where or 'its top level'})") from None
    problem = exporter_problem(notebook, fmt)
    if problem:
        raise ExportError(f"{path}: {problem}")
    exporter = confined_class(get_exporter(fmt))(config=config if config is not None else _config())  # type: ignore[no-untyped-call]
    resources = {"metadata": {"name": path.stem, "path": str(path.parent)}}
    body, resources = exporter.from_notebook_node(notebook, resources=resources)
    return str(body), str(resources.get("output_extension") or exporter.file_extension)


def _open_folder(path: Path) -> tuple[int, str]:
    """A descriptor of ``path``'s folder and its last name, reached without
    following a link below the current directory (the user's place: the
    links above it are the user's), or only the last name's when ``path``
    lies elsewhere. Raises :class:`ExportError` for a link, OSError else."""
    here, absolute = os.getcwd(), os.path.abspath(path)
    root = here if os.path.commonpath([here, absolute]) == here else os.path.dirname(absolute)
    try:
        return no_follow.open_folder(root, absolute)
    except no_follow.LinkRefused as exc:
        raise ExportError(f"{exc.link} is a link: not followed below the current directory ({_LINKS})") from None
    except no_follow.Refused as exc:
        raise ExportError(str(exc)) from None


#: why a link is refused, in the user's words
_LINKS = "a sandbox can rename a link its workspace holds; give the path its link leads to"


def _read(folder: int, name: str, path: Path) -> tuple[Any, os.stat_result]:
    """The notebook ``name`` in ``folder``, as nbformat 4, and what it is
    (its inode: an output must not replace it); a link there is refused."""
    import nbformat

    try:
        source = no_follow.open_file(folder, name, str(path))
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except no_follow.LinkRefused:
        raise ExportError(f"{path} is a link: not followed ({_LINKS})") from None
    except no_follow.NotAFile:
        raise ExportError(f"{path} is a folder, not a notebook") from None
    except OSError as exc:
        raise ExportError(f"{path}: {exc.strerror or exc}") from None
    with source:
        try:
            return nbformat.read(source, as_version=4), os.fstat(source.fileno())  # type: ignore[no-untyped-call]
        except Exception as exc:  # nbformat's reader raises what json and its validator raise
            raise ExportError(f"{path} is not a notebook nbformat can read ({type(exc).__name__}: {exc})") from None


def _replace_in(folder: int, name: str, text: str) -> None:
    """``text`` as a new file in ``folder``, renamed over ``name``."""
    temporary = f".{name[:200]}.{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder)
        raise


def _same_file(folder: int, name: str, other: os.stat_result) -> bool:
    try:
        here = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (other.st_dev, other.st_ino)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel export",
        description="Convert a notebook a sandbox wrote, as the Lab server does: an HTML page or slides that "
        "run only their template's scripts and load nothing of the notebook's, a script that imports "
        "nothing the notebook names.",
    )
    parser.add_argument("notebook", type=Path, help="the .ipynb file")
    parser.add_argument("--to", default="html", choices=FORMATS, help="the format (default: html)")
    parser.add_argument(
        "--output",
        "-o",
        help="where to write it (default: beside the notebook, with the format's extension; - for stdout)",
    )
    args = parser.parse_args(argv)
    try:
        written = _export_to(args.notebook, args.to, args.output)
    except ExportError as exc:
        print(f"sandbox-kernel export: {exc}", file=sys.stderr)
        return 1
    if written is not None:
        print(f"wrote {written}")
    return 0


def _export_to(notebook: Path, fmt: str, output: str | None) -> Path | None:
    """Convert ``notebook`` and write it (to ``output``, or beside it through
    the folder it was read from); the path written, None for stdout."""
    try:
        folder, name = _open_folder(notebook)
    except OSError as exc:
        raise ExportError(f"{notebook}: {exc.strerror or exc}") from None
    try:
        notebook_node, read = _read(folder, name, notebook)
        text, extension = convert(notebook_node, notebook, fmt)
        if output == "-":
            sys.stdout.write(text)
            return None
        target = Path(output) if output else notebook.with_name(Path(name).stem + extension)
        try:
            out_folder, out_name = _open_folder(target) if output else (os.dup(folder), target.name)
        except OSError as exc:
            raise ExportError(f"cannot write {target}: {exc.strerror or exc}") from None
        try:
            if _same_file(out_folder, out_name, read):
                raise ExportError(f"{target} is the notebook itself; choose another --output")
            _replace_in(out_folder, out_name, text)
        except OSError as exc:
            raise ExportError(f"cannot write {target}: {exc.strerror or exc}") from None
        finally:
            os.close(out_folder)
        return target
    finally:
        os.close(folder)


__all__ = ["FORMATS", "ExportError", "convert", "export", "main"]
