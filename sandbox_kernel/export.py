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

The output is written next to the notebook, as nbconvert does, but through a
new file renamed into place: a link a sandbox left at the output's name is
replaced, never written through.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

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
    import nbformat
    from nbconvert.exporters import get_exporter

    from .lab_exports import exporter_problem, keep_templates_out_of_the_working_directory
    from .lab_html_exports import confined_class

    keep_templates_out_of_the_working_directory()  # (before nbconvert makes an exporter: it reads conf.json)

    if fmt not in FORMATS:
        raise ExportError(f"--to {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ExportError(f"{path} is a folder, not a notebook") from None
    except Exception as exc:  # nbformat's reader raises what json and its validator raise
        raise ExportError(f"{path} is not a notebook nbformat can read ({type(exc).__name__}: {exc})") from None
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


def write_beside(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a new file renamed into place: what
    was at ``path`` (a link a sandbox left there, say) is replaced, not followed."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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
        text, extension = export(args.notebook, args.to)
    except ExportError as exc:
        print(f"sandbox-kernel export: {exc}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.output) if args.output else args.notebook.with_name(args.notebook.stem + extension)
    if target.resolve() == args.notebook.resolve():
        print(f"sandbox-kernel export: {target} is the notebook itself; choose another --output", file=sys.stderr)
        return 1
    try:
        write_beside(target, text)
    except OSError as exc:
        print(f"sandbox-kernel export: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}")
    return 0


__all__ = ["FORMATS", "ExportError", "export", "main", "write_beside"]
