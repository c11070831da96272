"""Exporting a notebook a sandbox wrote imports nothing the notebook names.

Why: "Save and Export Notebook As → Executable Script" (``/nbconvert/script/…``)
runs nbconvert's ``ScriptExporter`` in the Jupyter server, which reads the
notebook's ``metadata.language_info.nbconvert_exporter`` and, when that is not
an installed exporter's name but a dotted one, imports it as a Python path and
calls what it finds (``nbconvert.exporters.base.get_exporter``). A cell can
write that field into a notebook of its workspace: exporting the notebook
then makes the host's server import a module of the sandbox's choosing (any
installed one; measured: ``this.x`` printed the Zen of Python into the
server's log, and modules such as ``antigravity`` or ``idlelib.idle`` act when
imported) and call an object of its choosing with ``config=``. The host never
runs what a sandbox names (guarantee 10).

What this extension does: jupyter_server's two nbconvert handlers (the file
one, ``GET /nbconvert/<format>/<path>``, and the one that converts a notebook
sent in the request, ``POST /nbconvert/<format>``) are replaced by
subclasses (:mod:`sandbox_kernel.lab_routes`) that refuse, with a 400 naming
the field, a notebook whose exporter name is not a plain name (what ipykernel
writes, ``python``, and every installed exporter's entry point are plain
names), whatever the format asked for: a custom exporter may read the field
too, and a notebook naming an import path was not written by a kernel. A
plain name must name a script's exporter (or none installed): the script
export delegates to whatever exporter the field names, so ``html`` made the
"Executable Script" download an HTML page outside the HTML export's
confinement, and ``pdf`` a LaTeX run. Without a delegate, the script's
extension and type are the notebook's ``file_extension`` and ``mimetype``:
they must be a script's (``.html`` and ``text/html`` made the same page,
downloaded as ``report.html``). The notebook is not changed; removing the
field lets it export.

The handler's check reads the file, and jupyter_server's handler then reads
it again to convert it: a sandbox swapping the notebook back and forth
(atomic renames, in a loop left running after its cell) won that race on the
second request (measured), and the server imported ``this``. So the check is
made again on the very notebook converted: every exporter the handlers
construct is a subclass whose ``from_notebook_node`` refuses first
(:func:`checked_class`). The handler's early check stays for its 400; a
notebook swapped after it is refused by the conversion, which jupyter_server
answers with a 500 "nbconvert failed: " and the same reason.

The same extension makes the exporters of the HTML family that those handlers
construct confined ones (:mod:`sandbox_kernel.lab_html_exports`: the
downloaded page shows the notebook as Lab does and runs only its template's
scripts), unless ``SANDBOX_KERNEL_REMOTE_CONTENT=1``.
"""

from __future__ import annotations

import re
from typing import Any

from tornado.web import HTTPError, authenticated

from . import lab_html_exports, lab_routes
from .lab_content_policy import remote_content_allowed

#: what an exporter's entry-point name looks like (nbconvert imports a dotted one)
PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def exporter_problem(notebook: Any, fmt: str | None = None) -> str:
    """Why the server must not convert ``notebook`` (its JSON content) to
    ``fmt`` (None: to any format), or ""."""
    metadata = notebook.get("metadata") if isinstance(notebook, dict) else None
    info = metadata.get("language_info") if isinstance(metadata, dict) else None
    name = info.get("nbconvert_exporter") if isinstance(info, dict) else None
    field = f"the notebook's metadata.language_info.nbconvert_exporter is {name!r}"
    fix = "Remove that field from the notebook's metadata to export it."
    if not name or name == "script":
        # nbconvert delegates to no exporter for these: the script's own name and type are the notebook's
        return _script_type_problem(info, fix) if fmt in (None, "script") else ""
    if not (isinstance(name, str) and PLAIN_NAME.match(name)):
        return (
            f"{field}, not an exporter's name: nbconvert's script export would import it and run it in the "
            f"server. {fix}"
        )
    kind = installed_exporter(name)
    if kind is not None and not makes_a_script(kind):
        return (
            f"{field}, the exporter of {kind.__name__}, which makes no script: nbconvert's script export "
            f"would make that instead, unchecked (an HTML page with the notebook's scripts, or a LaTeX run). {fix}"
        )
    return ""


#: what a script's file extension looks like (``.py``, ``.R``, ``.jl``, ``.sh``)
SCRIPT_EXTENSION = re.compile(r"\.[A-Za-z0-9_+-]{1,16}\Z")
#: extensions a browser or a desktop opens as a page, a document or a link
#: rather than as a script's text: a script export must never be one
NOT_SCRIPTS = frozenset(
    [
        "html",
        "htm",
        "xhtml",
        "xht",
        "shtml",
        "mht",
        "mhtml",
        "svg",
        "svgz",
        "xml",
        "xsl",
        "xslt",
        "pdf",
        "hta",
        "desktop",
        "url",
        "webloc",
        "website",
        "lnk",
        "scf",
    ]
)
#: what a script's type looks like (``text/x-python``): one that is no page
SCRIPT_TYPE = re.compile(r"(?:text|application)/[A-Za-z0-9.+-]{1,64}\Z")


def _script_type_problem(info: Any, fix: str) -> str:
    """Why the script export of a notebook with ``language_info`` ``info``
    must not be made, or "": it names the download's extension and type
    after the notebook's ``file_extension`` and ``mimetype``, so a notebook a
    sandbox wrote with ``.html`` and ``text/html`` made "Executable Script"
    download an HTML page (the cell's source, scripts and remote images
    included), outside the HTML export's confinement (an attack review)."""
    if not isinstance(info, dict):
        return ""
    # (empty, as gophernotes and lgo write them: nbconvert writes no extension and no type)
    extension, mimetype = info.get("file_extension") or None, info.get("mimetype") or None
    if extension is not None and not (
        isinstance(extension, str) and SCRIPT_EXTENSION.match(extension) and extension[1:].lower() not in NOT_SCRIPTS
    ):
        return (
            f"the notebook's metadata.language_info.file_extension is {str(extension)[:40]!r}, not a script's: "
            f"its script export would be downloaded as that. {fix.replace('that field', 'it')}"
        )
    if mimetype is not None and not (
        isinstance(mimetype, str)
        and SCRIPT_TYPE.match(mimetype)
        and not any(word in mimetype.lower() for word in ("html", "xml", "svg", "pdf"))
    ):
        return (
            f"the notebook's metadata.language_info.mimetype is {str(mimetype)[:60]!r}, not a script's: "
            f"its script export would be downloaded as that. {fix.replace('that field', 'it')}"
        )
    return ""


def installed_exporter(name: str) -> type | None:
    """The exporter class nbconvert finds under the plain ``name`` (the script
    exporter delegates to it: nbconvert's own lookup), or None."""
    from nbconvert.exporters.base import get_exporter

    try:
        kind = get_exporter(name)  # type: ignore[no-untyped-call]
    except Exception:  # no such exporter, one disabled, or a broken package: nbconvert makes nothing
        return None
    return kind if isinstance(kind, type) else None


def makes_a_script(kind: type) -> bool:
    """Whether an exporter makes a script (``text/x-python``...) rather than a page or a document."""
    from nbconvert.exporters import HTMLExporter

    mimetype = getattr(kind, "output_mimetype", "")
    return isinstance(mimetype, str) and mimetype.startswith("text/x-") and not issubclass(kind, HTMLExporter)


class ExportRefused(ValueError):
    """A notebook handed to an exporter that the server must not convert (:func:`exporter_problem`)."""


_CHECKED: dict[type, type] = {}


def _no_template_basedirs(exporter: Any) -> list[str]:
    return []


def keep_templates_out_of_the_working_directory() -> None:
    """Make nbconvert's templates, in this process, come only from the
    Jupyter data path and the places the user configured, never from the
    working directory.

    Why: ``TemplateExporter.extra_template_basedirs`` defaults to the working
    directory, searched before nbconvert's own templates; a template is Jinja
    run unsandboxed (``cycler.__init__.__globals__.os.system``) and its
    ``conf.json`` names preprocessors nbconvert imports. A Lab started in the
    notebooks' folder, or ``sandbox-kernel export`` run there, works in a
    sandbox's workspace: a cell that wrote ``lab/index.html.j2`` ran its
    command on the host at the next HTML export (an attack review, measured
    through the guarded Lab server and through the CLI). Exporters are made in
    many places with whatever config is at hand (nbconvert's ``get_exporter``
    makes one to ask whether it is enabled, the export menu's listing one of
    each, the script export its delegate), so it is the trait's default that
    changes, for every exporter class not defining its own. A value the user
    configures still wins: it names a place of theirs."""
    from nbconvert.exporters.templateexporter import TemplateExporter

    handler = TemplateExporter._trait_default_generators.get("extra_template_basedirs")
    if getattr(handler, "func", None) is _no_template_basedirs:
        return
    if handler is None or not callable(getattr(handler, "func", None)):  # nbconvert or traitlets changed
        raise RuntimeError(
            "sandbox_kernel cannot keep nbconvert from taking templates from the working directory "
            "(TemplateExporter.extra_template_basedirs has no default handler): upgrade sandbox_kernel"
        )
    handler.func = _no_template_basedirs


def checked_class(kind: type) -> type:
    """``kind``, with its ``from_notebook_node`` refusing a notebook
    :func:`exporter_problem` refuses, before anything reads it. (Same class
    name, so a ``c.ScriptExporter`` section keeps applying.)"""
    if kind in _CHECKED:
        return _CHECKED[kind]

    from nbconvert.exporters import ScriptExporter

    fmt = "script" if issubclass(kind, ScriptExporter) else "other"

    def from_notebook_node(self: Any, nb: Any, resources: Any = None, **kw: Any) -> Any:
        problem = exporter_problem(nb, fmt)
        if problem:
            raise ExportRefused(problem)
        return super(checked, self).from_notebook_node(nb, resources, **kw)  # type: ignore[arg-type]

    checked = type(
        kind.__name__,
        (kind,),
        {"from_notebook_node": from_notebook_node, "__doc__": kind.__doc__},
    )
    _CHECKED[kind] = checked
    return checked


def install_exporters() -> bool:
    """Make jupyter_server's nbconvert handlers construct checked exporters
    (:func:`checked_class`), of the HTML family confined
    (:mod:`sandbox_kernel.lab_html_exports`) unless the user allowed remote
    content; whether they are confined. The handlers look their exporter up
    through their module's ``get_exporter`` (no setting or hook chooses the
    class), so that one function is wrapped. Templates come from no
    working directory (:func:`keep_templates_out_of_the_working_directory`)."""
    from jupyter_server.nbconvert import handlers

    keep_templates_out_of_the_working_directory()
    confine = not remote_content_allowed()
    original: Any = handlers.get_exporter
    if getattr(original, "sandbox_kernel_checked", False):
        return confine

    def get_exporter(format: str, **kwargs: Any) -> Any:
        kind = type(original(format, **kwargs))  # jupyter_server's own errors (404, 500) as they are
        if confine:
            kind = lab_html_exports.confined_class(kind)
        return checked_class(kind)(**kwargs)

    get_exporter.sandbox_kernel_checked = True  # type: ignore[attr-defined]
    handlers.get_exporter = get_exporter
    return confine


def _guarded_handlers() -> dict[type, type]:
    """The checking subclasses of jupyter_server's nbconvert handlers, by the handler they replace."""
    from jupyter_core.utils import ensure_async
    from jupyter_server.auth.decorator import authorized
    from jupyter_server.nbconvert.handlers import NbconvertFileHandler, NbconvertPostHandler

    class GuardedNbconvertFileHandler(NbconvertFileHandler):
        @authenticated
        @authorized
        async def get(self, format: str, path: str) -> Any:
            self.check_xsrf_cookie()  # as the handler does, before anything is read
            model = await ensure_async(self.contents_manager.get(path=path.strip("/")))  # type: ignore[no-untyped-call]
            if model.get("type") == "notebook":
                problem = exporter_problem(model.get("content"), format)
                if problem:
                    raise HTTPError(400, problem)
            return await super().get(format, path)  # type: ignore[misc]  # (decorated)

    class GuardedNbconvertPostHandler(NbconvertPostHandler):
        @authenticated
        @authorized
        async def post(self, format: str) -> Any:
            model = self.get_json_body()
            problem = exporter_problem(model.get("content") if isinstance(model, dict) else None, format)
            if problem:
                raise HTTPError(400, problem)
            return await super().post(format)  # type: ignore[misc]  # (decorated)

    return {NbconvertFileHandler: GuardedNbconvertFileHandler, NbconvertPostHandler: GuardedNbconvertPostHandler}


def _load_jupyter_server_extension(serverapp: Any) -> None:
    lab_routes.install(serverapp, _guarded_handlers(), "nbconvert handlers")
    install_exporters()


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_exports"}]


__all__ = [
    "PLAIN_NAME",
    "ExportRefused",
    "checked_class",
    "exporter_problem",
    "install_exporters",
    "installed_exporter",
    "makes_a_script",
]
