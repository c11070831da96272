"""Run inside a test container (not collected by pytest): prints one JSON line.

``notebook CELLS_JSON``: run the cells on ``sandbox-python`` with nbclient, as a
single-user server's kernel would run them; print their outputs.
``syscalls NAME...``: call each syscall with zero arguments (``unshare`` with
CLONE_NEWUSER) from the container's own process, outside any bwrap sandbox;
print the errno each one got (0: allowed).
``doctor``: ``sandbox-kernel doctor``'s report and exit code.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path


def notebook(cells: list[str]) -> dict[str, object]:
    import nbformat
    from nbclient import NotebookClient

    spec = Path("/tmp/jupyter/kernels/sandbox-python")
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-I", "-m", "sandbox_kernel", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(json.dumps({"argv": argv, "display_name": "t", "language": "python"}))
    os.environ["JUPYTER_PATH"] = "/tmp/jupyter"
    work = Path("/tmp/work")
    work.mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(
        nb, kernel_name="sandbox-python", timeout=120, allow_errors=True, resources={"metadata": {"path": str(work)}}
    )
    client.execute()
    return {"outputs": [cell.outputs for cell in nb.cells]}


def syscalls(names: list[str]) -> dict[str, object]:
    import pyseccomp

    libc = ctypes.CDLL(None, use_errno=True)
    arch = pyseccomp.system_arch()
    got: dict[str, int] = {}
    for name in names:
        number = pyseccomp.resolve_syscall(arch, name)
        args = (0x10000000,) if name == "unshare" else (0, 0, 0, 0, 0)
        ctypes.set_errno(0)
        result = libc.syscall(number, *args)
        got[name] = ctypes.get_errno() if result == -1 else 0
    return {"errno": got}


def doctor() -> dict[str, object]:
    done = subprocess.run([sys.executable, "-I", "-m", "sandbox_kernel", "doctor"], capture_output=True, text=True)
    return {"code": done.returncode, "report": done.stdout + done.stderr}


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "notebook":
        out = notebook(json.loads(rest[0]))
    elif mode == "doctor":
        out = doctor()
    else:
        out = syscalls(rest)
    print("RESULT " + json.dumps(out))
