"""The kernel application: ipykernel's, plus a config file of our own.

ipykernel reads ``ipython_kernel_config.py`` from the IPython profile only;
users of a Jupyter kernel expect Jupyter's config dirs, so
``sandbox_kernel_config.py`` (or ``.json``) is also read from every
directory of ``jupyter --paths`` (e.g. ``~/.jupyter``, ``$JUPYTER_CONFIG_DIR``).
"""

from __future__ import annotations

from typing import Any

from ipykernel.kernelapp import IPKernelApp
from jupyter_core.paths import jupyter_config_path
from traitlets import DottedObjectName, Type
from traitlets.config.application import Application

from .kernel import SandboxKernel
from .terminal_text import TerminalSafeFormatter

CONFIG_FILE = "sandbox_kernel_config"


class SandboxKernelApp(IPKernelApp):
    name = "sandbox-kernel"
    kernel_class = Type(SandboxKernel, klass="ipykernel.kernelbase.Kernel").tag(config=True)  # type: ignore[assignment]
    outstream_class = DottedObjectName(
        "sandbox_kernel.host_streams.HostOutStream",
        help="The importstring for the OutStream factory (ours flushes only what host code wrote).",
        allow_none=True,
    ).tag(config=True)

    # Log lines can quote what a sandbox wrote: no control character reaches
    # the terminal (sandbox_kernel/terminal_text.py).
    _log_formatter_cls = TerminalSafeFormatter

    def get_default_logging_config(self) -> dict[str, Any]:
        """The package's own loggers (the engine, the sandboxes, the ratchet's
        store) write through the application's handler, and so its formatter,
        instead of logging's last-resort handler, which writes lines as they are."""
        config: dict[str, Any] = super().get_default_logging_config()
        if "console" in config.get("handlers", {}):
            config["loggers"]["sandbox_kernel"] = {"level": "DEBUG", "handlers": ["console"], "propagate": False}
        return config

    def init_path(self) -> None:
        """Never put the working directory (the notebook's folder, which sandboxes
        write) on the HOST kernel's ``sys.path``: IPython's ``init_path`` inserts
        it before site-packages, so every later import of a package would try the
        workspace first. Cells run in the sandbox, whose worker keeps its own path."""

    def load_config_file(self, suppress_errors: bool = True) -> None:  # type: ignore[override]
        super().load_config_file(suppress_errors)
        Application.load_config_file(self, CONFIG_FILE, path=jupyter_config_path())
