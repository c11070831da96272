"""Attacks on the HOST through what a cell writes (issue: the host never runs what
the sandbox wrote), classes 1 and 4:

1. host processes must not import from the workspace: a cell plants modules
   named like what the kernel imports, the kernel is restarted, and the planted
   code must not run on the host;
4. a kernel running as root must not give its sandbox root's file access.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from kernel_helpers import KERNEL_NAME, SandboxKernelHandle, require_bwrap

VENV_BIN = Path(sys.executable).parent

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel runs as root only when the tests do")


def _planted(marker: Path) -> str:
    """Python that, if it ever runs on the host, leaves ``marker`` behind."""
    return f"import pathlib; pathlib.Path({str(marker)!r}).write_text('host code ran')\n"


# ---- class 1: the import path of host processes ---------------------------------------


def test_kernelspec_starts_python_isolated() -> None:
    """What jupyter_client really launches: an isolated interpreter."""
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    assert spec.argv[1] == "-I", spec.argv
    assert spec.argv[2:4] == ["-m", "sandbox_kernel"], spec.argv


@pytest.mark.parametrize(
    "planted",
    [
        "traitlets.py",  # imported by the kernel application at start
        "zmq/__init__.py",  # a package shadowing a dependency
        "sandbox_kernel/__init__.py",  # shadowing the kernel itself
        "sandbox_kernel/__main__.py",
        "jupyter_client/__init__.py",
    ],
)
def test_modules_planted_in_the_workspace_never_run_on_the_host(tmp_path: Path, planted: str) -> None:
    require_bwrap()
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir()
    marker = tmp_path / "outside" / "PWNED"
    marker.parent.mkdir()
    marker.parent.chmod(0o777)  # writable by whatever uid the planted code would run as
    kernel = SandboxKernelHandle(ws, tmp, extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        target = f"/workspace/{planted}"
        code = (
            "import pathlib\n"
            f"p = pathlib.Path({target!r})\n"
            "p.parent.mkdir(parents=True, exist_ok=True)\n"
            f"p.write_text({_planted(marker)!r})\n"
            "print('planted', p.exists())"
        )
        run = kernel.run(code)
        assert run.stdout.strip() == "planted True", (run.stdout, run.stderr, run.errors)
        assert (ws / planted).exists()  # the attack really placed it where the kernel starts
        # The user restarts the kernel: the host interpreter starts again in the workspace.
        kernel.km.restart_kernel(now=True)
        kernel.kc.wait_for_ready(timeout=60)
        run = kernel.run("x = 41 + 1\nprint(x)")
        assert run.stdout.strip() == "42"
        assert not marker.exists(), f"code planted as {planted} ran on the host"
    finally:
        kernel.shutdown()
    assert not marker.exists()


def test_console_script_ignores_the_working_directory(tmp_path: Path) -> None:
    """``sandbox-kernel gc``/``mcp`` are started by users from anywhere, also
    from a notebook folder: nothing there is imported."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    marker = tmp_path / "PWNED"
    for name in ("argparse.py", "docker/__init__.py", "traitlets.py", "sandbox_kernel/__init__.py"):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_planted(marker))
    result = subprocess.run(
        [str(VENV_BIN / "sandbox-kernel"), "gc", "--help"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    result = subprocess.run(
        [sys.executable, "-I", "-m", "sandbox_kernel", "gc", "--help"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_main_module_drops_the_working_directory(tmp_path: Path) -> None:
    """A kernelspec installed by an older version (no ``-I``): modules imported
    after ``sandbox_kernel`` itself are not taken from the working directory."""
    folder = tmp_path / "nb"
    folder.mkdir()
    marker = tmp_path / "PWNED"
    (folder / "argparse.py").write_text(_planted(marker))
    result = subprocess.run(
        [sys.executable, "-m", "sandbox_kernel", "gc", "--help"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


# ---- class 4: a root kernel's sandbox is not root on the host ------------------------


@ROOT_ONLY
def test_root_only_file_in_a_readonly_mount_is_unreadable(kernel: SandboxKernelHandle) -> None:
    """The Python installation is mounted read-only; a 0600 root file in it was
    readable from a cell because the sandbox's uid was host root."""
    secret = Path(sys.prefix) / f"root-only-{os.getpid()}.txt"
    secret.write_text("root's secret")
    secret.chmod(0o600)
    try:
        run = kernel.run(
            f"p = {str(secret)!r}\n"
            "try:\n    print('READ', open(p).read())\n"
            "except PermissionError as e:\n    print('DENIED', e.errno)\n"
        )
        assert "READ" not in run.stdout, run.stdout
        assert run.stdout.startswith("DENIED 13"), (run.stdout, run.stderr, run.errors)
    finally:
        secret.unlink()


@ROOT_ONLY
def test_sandbox_processes_hold_an_unprivileged_host_uid(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("import os; print(os.getpid(), os.getuid())")
    assert run.status == "ok"
    found = []
    for proc in kernel.descendants():
        try:
            if proc.name() in ("bwrap", "python3", "python") or "sandbox_kernel_worker" in " ".join(proc.cmdline()):
                found.append(proc.uids())
        except psutil.NoSuchProcess:
            continue
    assert found, "no sandbox process found"
    assert all(uids.real != 0 and uids.effective != 0 and uids.saved != 0 for uids in found), found


@ROOT_ONLY
def test_files_written_by_a_cell_are_not_owned_by_root(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("open('/workspace/made-by-cell.txt', 'w').write('x'); import os; os.mkdir('/workspace/made-dir')")
    assert run.status == "ok", run.errors
    for name in ("made-by-cell.txt", "made-dir"):
        st = (kernel.workspace / name).stat()
        assert st.st_uid != 0 and st.st_gid != 0, (name, st.st_uid, st.st_gid)
    # The host (root) still reads and removes what the sandbox made.
    assert (kernel.workspace / "made-by-cell.txt").read_text() == "x"


@ROOT_ONLY
def test_a_root_kernels_workspace_still_works(tmp_path: Path) -> None:
    """Files root made in the notebook folder before the kernel started stay
    usable: read, overwritten, replaced; new files and folders can be made.
    A file root keeps to itself (0600) stays unreadable: "others" may not
    read it, and the sandbox's uid is one of them."""
    require_bwrap()
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    (ws / "data").mkdir(parents=True)
    tmp.mkdir()
    (ws / "table.csv").write_text("a,b\n1,2\n")
    (ws / "data" / "rows.json").write_text(json.dumps([1, 2, 3]))
    (ws / "private.txt").write_text("mine")
    (ws / "private.txt").chmod(0o600)
    kernel = SandboxKernelHandle(ws, tmp, extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        run = kernel.run(
            "import json\n"
            "print(open('table.csv').read().splitlines()[1])\n"
            "open('table.csv', 'w').write('a,b\\n3,4\\n')\n"
            "rows = json.load(open('data/rows.json')); rows.append(4)\n"
            "json.dump(rows, open('data/rows.json', 'w'))\n"
            "open('data/new.txt', 'w').write('new')\n"
            "try:\n"
            "    print(open('private.txt').read())\n"
            "except PermissionError:\n"
            "    print('refused')\n"
        )
        assert run.status == "ok", (run.errors, run.stderr)
        assert run.stdout.split() == ["1,2", "refused"]
        assert (ws / "table.csv").read_text() == "a,b\n3,4\n"
        assert json.loads((ws / "data" / "rows.json").read_text()) == [1, 2, 3, 4]
        assert (ws / "data" / "new.txt").read_text() == "new"
    finally:
        kernel.shutdown()


def test_a_root_file_renamed_by_a_cell_is_not_shared_at_the_next_start(tmp_path: Path) -> None:
    """Attack (found by an audit): the workspace's entries were shared with
    the sandbox's uid by name, dot-entries left out. A cell cannot read a
    0600 ``.env`` of root's, but it may rename it (it can write the folder);
    after a restart (a cell can ask for one: ``exit``), the new kernel had
    ``env-copy`` shared, readable."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("a kernel that is not root shares nothing: its sandbox has the user's own access")
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir()
    (ws / ".env").write_text("TOKEN=root-only")
    (ws / ".env").chmod(0o600)
    (ws / "notes.txt").write_text("shared")
    kernel = SandboxKernelHandle(ws, tmp, extra_args=["--SandboxKernel.backend=bwrap"])
    attempt = "try:\n    print(open('env-copy').read())\nexcept PermissionError:\n    print('refused')\n"
    try:
        assert kernel.stdout_of("import os\nos.rename('.env', 'env-copy')\n" + attempt) == "refused\n"
        kernel.km.restart_kernel(now=True)  # a new kernel process shares the workspace again
        kernel.kc.wait_for_ready(timeout=60)
        assert kernel.stdout_of(attempt + "print(open('notes.txt').read())") == "refused\nshared\n"
    finally:
        kernel.shutdown()
    assert (ws / "env-copy").read_text() == "TOKEN=root-only"
