"""``python -m sandbox_kernel``: run the kernel, or ``install`` its kernelspec."""

from __future__ import annotations

import sys


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
