"""Install the ``sandbox-python`` kernelspec (the wheel also ships it as shared data)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

KERNEL_NAME = "sandbox-python"
SPEC_DIR = Path(__file__).resolve().parent.parent / "kernelspec"


def spec_source() -> Path:
    """kernelspec/ of a source checkout, or the copy inside an installed wheel."""
    for candidate in (SPEC_DIR, Path(sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME):
        if (candidate / "kernel.json").is_file():
            return candidate
    raise FileNotFoundError("kernel.json not found: is sandbox_kernel installed correctly?")


def install(user: bool = False, prefix: str | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / KERNEL_NAME
        shutil.copytree(spec_source(), target)
        spec = json.loads((target / "kernel.json").read_text())
        spec["argv"][0] = sys.executable  # the interpreter that has sandbox_kernel installed
        (target / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        return KernelSpecManager().install_kernel_spec(str(target), KERNEL_NAME, user=user, prefix=prefix)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox_kernel install", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the venv)")
    where.add_argument("--prefix", help="install under this prefix")
    args = parser.parse_args(argv)
    prefix = sys.prefix if args.sys_prefix else args.prefix
    path = install(user=args.user, prefix=prefix)
    print(f"Installed kernelspec {KERNEL_NAME} in {path}")
    from .engine import completer_seed

    seed = completer_seed.build()
    if seed is not None:
        print(f"Made the sandboxes' completion and font caches in {seed}")


if __name__ == "__main__":
    main()
