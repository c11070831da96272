"""The magics ipykernel adds to IPython's (its ``KernelMagics``), for the sandbox.

Public notebooks carry them: ``%autosave 0`` heads many, and a cell that
names a magic the kernel lacks fails with "not found", which stops nbclient
and papermill at that cell. ipykernel's own class cannot be used here: it
needs ipykernel's kernel application and ZMQ, and loading its module costs
every sandbox's start about 60 ms. What needs the kernel's connection file
(``%connect_info``, ``%qtconsole``) says why a sandboxed cell cannot have it.
"""

from __future__ import annotations

import os
import warnings

from IPython.core import page
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magics.code import CodeMagics, MacroToEdit
from IPython.utils import openpy

#: why a cell gets no connection file: it holds the key that signs every
#: message to the kernel, which runs on the host, outside the sandbox
NO_CONNECTION_FILE = (
    "the kernel runs on the host, outside this sandbox, and its connection file (with the key that "
    "signs every message to it) is not given to cells. To use this kernel from another frontend, "
    "open a console on it in JupyterLab (right-click the notebook: New Console for Notebook), or run "
    "`jupyter console --existing <connection file>` on the host (`jupyter --runtime-dir` holds the files)"
)


@magics_class
class KernelMagics(Magics):
    """What ipykernel's magics do, with the same output where the sandbox allows."""

    @property
    def _shell(self) -> InteractiveShell:
        assert self.shell is not None  # registered on one
        return self.shell

    @line_magic
    def autosave(self, arg_s: str) -> None:
        """Set the autosave interval in the notebook (in seconds); ``%autosave 0``
        disables it. ipykernel also displays a Javascript call to the classic
        notebook, which JupyterLab and Notebook 7 do not have: here the kernel's
        output policy would drop it with a note in every notebook that starts
        with ``%autosave``, so only the line saying what was asked is printed."""
        try:
            interval = int(arg_s)
        except ValueError as e:
            raise UsageError(f"%autosave requires an integer, got {arg_s!r}") from e
        print(f"Autosaving every {interval} seconds" if interval else "Autosave disabled")

    @line_magic
    def edit(self, parameter_s: str = "", last_call: list[str] | None = None) -> None:
        """Make the file to edit, as ipykernel's ``%edit`` does (it names a
        temporary one), and no more. ipykernel then asks the frontend, in
        the reply, to open it: JupyterLab and Notebook 7 ignore that, and the
        kernel drops it anyway (a frontend must not open a path a sandbox
        chose). IPython's own ``%edit`` runs a terminal editor, which fails
        here. Open the file in JupyterLab's file browser instead."""
        opts, args = self.parse_options(parameter_s, "prn:")
        try:
            CodeMagics._find_edit_target(self._shell, args, opts, last_call or ["", ""])
        except MacroToEdit:
            print("Macro editing not yet implemented in 2-process model.")

    @line_magic
    def clear(self, arg_s: str) -> None:
        """Clear the terminal."""
        self._shell.system("clear")

    @line_magic
    def less(self, arg_s: str) -> None:
        """Show a file through the pager. Files ending in .py are syntax-highlighted."""
        if not arg_s:
            raise UsageError("Missing filename.")
        if arg_s.endswith(".py"):
            content = self._shell.pycolorize(openpy.read_py_file(arg_s, skip_encoding_cookie=False))
        else:
            with open(arg_s) as fid:
                content = fid.read()
        page.page(content)

    more = line_magic("more")(less)  # type: ignore[arg-type,var-annotated]  # as ipykernel's

    @line_magic
    def man(self, arg_s: str) -> None:
        """Find the man page for the given command and display it in the
        pager. The sandbox has no /etc/manpath.config (the host's /etc is not
        in it): man then reads its defaults instead, and groff's warning
        that its site macros are missing too is left out."""
        command = f"man {arg_s}"
        if not os.path.exists("/etc/manpath.config"):
            command = f'man -C /dev/null {arg_s} 2>&1 | grep -v "can\'t find macro file"'
        page.page(self._shell.getoutput(f"{command} | col -b", split=False))

    @line_magic
    def connect_info(self, arg_s: str) -> None:
        """Print information for connecting other clients to this kernel (not
        from a sandbox: see ``NO_CONNECTION_FILE``)."""
        warnings.warn(f"Could not get connection info: {NO_CONNECTION_FILE}.", stacklevel=2)

    @line_magic
    def qtconsole(self, arg_s: str) -> None:
        """Open a qtconsole connected to this kernel (not from a sandbox: it
        has no display, and see ``NO_CONNECTION_FILE``)."""
        warnings.warn(f"Could not start qtconsole: the sandbox has no display, and {NO_CONNECTION_FILE}.", stacklevel=2)

    @line_magic
    def subshell(self, arg_s: str) -> None:
        """List all current subshells (this kernel has none)."""
        print("Kernel does not support subshells")


def register(shell: InteractiveShell) -> None:
    """Add the magics to ``shell``."""
    shell.register_magics(KernelMagics)


__all__ = ["NO_CONNECTION_FILE", "KernelMagics", "register"]
