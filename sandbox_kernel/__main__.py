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


USAGE = """\
usage: sandbox-kernel <command> [options]

The sandboxed Jupyter kernel ("Python 3 (sandboxed)", kernelspec sandbox-python)
and its tools. Commands:

  -f CONNECTION_FILE [--SandboxKernel.x=...]
            run the kernel (what Jupyter does; options: --help-all)
  install   install the kernelspec (--user | --sys-prefix | --prefix P)
  mcp       serve the agent tools over MCP (stdio or streamable HTTP)
  gc        remove sandbox containers left behind by a crash
  container-profile
            print the seccomp profile for a container whose kernels sandbox
            themselves with bwrap (docs/deploy/container.md)
  export    convert a notebook a sandbox wrote to HTML, slides or a script as
            the Lab server does (jupyter nbconvert trusts the file)
  trust     sign notebooks you vouch for, as the guarded Lab checks them
            (their outputs and saved widget state load as trusted)
  store-init
            create the shared ratchet store's tables in PostgreSQL as their
            owner, and grant the kernels' role what it needs, nothing more
  doctor    check bubblewrap, user namespaces, pasta, seccomp, cgroups, Docker,
            the kernelspec, the JupyterLab extension and the ratchet store, and
            print the command that fixes what is missing

Each command takes --help. Configuration: docs, or `sandbox-kernel --help-all`.
"""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    if args[0] == "doctor":
        from .doctor import main as doctor_main

        sys.exit(doctor_main(args[1:]))
    if args[0] == "export":
        from .export import main as export_main

        sys.exit(export_main(args[1:]))
    if args[0] == "store-init":
        from .privacy.postgres import main as store_init_main

        sys.exit(store_init_main(args[1:]))
    if args[0] == "trust":
        from .trust import main as trust_main

        sys.exit(trust_main(args[1:]))
    if args[0] == "container-profile":
        import json

        from .sandbox.seccomp import container_profile

        if len(args) > 1:
            sys.exit(f"container-profile takes no arguments (got {' '.join(args[1:])!r})")
        print(json.dumps(container_profile(), indent=1))
        return
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
