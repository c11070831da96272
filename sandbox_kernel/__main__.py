"""``python -I -m sandbox_kernel``: run the kernel, or one of its commands.

The kernel's working directory is the notebook's folder, which is also the
sandbox's ``/workspace``: anything there was possibly written by a cell.
``python -m`` puts that directory first on ``sys.path`` (and a plain
interpreter adds the user's site-packages), so a cell could plant
``traitlets.py`` and have it imported on the HOST at the next start. The
kernelspec therefore starts ``python -I`` (isolated: no cwd on the path, no
user site, no ``PYTHON*`` variables), and as a second line of defence for
kernelspecs installed by older versions the working directory is dropped from
``sys.path`` here before anything else is imported.
"""

from __future__ import annotations

import os
import sys


def _drop_cwd_from_path() -> None:
    """Remove the entries ``-m``/``-c`` put first for the working directory."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    sys.path[:] = [p for p in sys.path if p != "" and (cwd is None or os.path.realpath(p) != cwd)]


_drop_cwd_from_path()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "install":
        from .install import main as install_main

        install_main(args[1:])
        return
    if args and args[0] == "mcp":
        from .tools.mcp_app import main as mcp_main

        sys.exit(mcp_main(args[1:]))
    if args and args[0] == "gc":
        from .docker.gc import main as gc_main

        sys.exit(gc_main(args[1:]))
    from .app import SandboxKernelApp

    SandboxKernelApp.launch_instance(argv=args)


if __name__ == "__main__":
    main()
