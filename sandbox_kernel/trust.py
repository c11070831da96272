"""``sandbox-kernel trust NOTEBOOK``: vouch for a notebook, as the guarded Lab checks it.

The Lab server that ``lab_content_policy.apply`` guards signs and checks
notebooks with :class:`sandbox_kernel.lab_signatures.CanonicalNotary` (the
digest of nbformat's notary could be matched by a notebook cut from another's
bytes), and no save there signs a notebook carrying saved widget state. A
notebook the user wrote, or read and vouches for, is signed here with the
same secret and store (``jupyter trust`` signs nbformat's digest, which the
guarded server no longer accepts): its outputs and saved widgets then load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel trust",
        description="Sign notebooks you vouch for, so the guarded Lab shows their outputs and saved widget "
        "state as trusted. Read a notebook a sandbox wrote before you do: its saved widgets can run script.",
    )
    parser.add_argument("notebooks", nargs="+", type=Path, help="the .ipynb files")
    parser.add_argument(
        "--notary-dir",
        type=Path,
        default=None,
        help="where the signatures and their secret are kept (the server's NotebookNotary.data_dir; "
        "default: the Jupyter data dir)",
    )
    args = parser.parse_args(argv)

    import nbformat

    from .lab_signatures import CanonicalNotary

    notary = CanonicalNotary(**({"data_dir": str(args.notary_dir)} if args.notary_dir is not None else {}))  # type: ignore[no-untyped-call]
    failed = 0
    with notary:
        for path in args.notebooks:
            try:
                # the form the server checks: it reads every notebook as nbformat 4
                notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                print(f"sandbox-kernel trust: {path}: no such file", file=sys.stderr)
                failed += 1
                continue
            except Exception as exc:  # nbformat raises what json and its reader raise
                print(f"sandbox-kernel trust: {path} is not a notebook nbformat can read ({exc})", file=sys.stderr)
                failed += 1
                continue
            notary.sign(notebook)  # type: ignore[no-untyped-call]
            print(f"Signed {path}")
    return 1 if failed else 0
