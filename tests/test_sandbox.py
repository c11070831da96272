"""The process-sandbox API (seeds): run(), timeouts, isolation, limits."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import require_bwrap

from sandbox_kernel.sandbox import BindMount, BubblewrapSandbox, ResourceLimits, SubprocessSandbox, get_sandbox

PY = sys.executable


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def bwrap() -> BubblewrapSandbox:
    require_bwrap()
    return BubblewrapSandbox()


def test_get_sandbox_prefers_bwrap_and_rejects_unknown_names() -> None:
    require_bwrap()
    assert get_sandbox().name == "bwrap"
    assert get_sandbox("subprocess").isolates is False
    with pytest.raises(ValueError, match="unknown sandbox backend 'chroot'"):
        get_sandbox("chroot")


def test_run_returns_exit_code_and_output(bwrap: BubblewrapSandbox, tmp_path: Path) -> None:
    result = run(bwrap.run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], cwd="/"))
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, b"out\n", b"err\n", False)


def test_timeout_kills_the_whole_sandbox(bwrap: BubblewrapSandbox) -> None:
    result = run(bwrap.run(["/bin/sh", "-c", "sleep 60 & sleep 60"], timeout=1))
    assert result.timed_out and result.exit_code == -1


def test_only_granted_mounts_are_visible(bwrap: BubblewrapSandbox, tmp_path: Path) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "in.txt").write_text("visible")
    (tmp_path / "outside.txt").write_text("hidden")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    script = (
        "import os\n"
        "print(open('/data/in.txt').read())\n"
        f"print(os.path.exists({str(tmp_path / 'outside.txt')!r}))\n"
        "open('/data/new.txt', 'w').write('w')\n"
        "try:\n    open('/ro/x', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
    )
    result = run(
        bwrap.run(
            [PY, "-c", script], bind_mounts=[BindMount(granted, "/data"), BindMount(readonly, "/ro", readonly=True)]
        )
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["visible", "False", "ro", "30"]
    assert (granted / "new.txt").read_text() == "w"


def test_a_mount_through_a_linked_folder_is_granted(bwrap: BubblewrapSandbox, tmp_path: Path) -> None:
    """A workspace (or the venv, the worker's code) reached through a linked
    folder: the grant of the sandbox's uid follows the link as configured.
    Opening the link as a folder without following it fails with ENOTDIR,
    not ELOOP, and every sandbox start failed ("Not a directory")."""
    (tmp_path / "real" / "ws").mkdir(parents=True)
    (tmp_path / "linked").symlink_to(tmp_path / "real", target_is_directory=True)
    result = run(
        bwrap.run(
            [PY, "-c", "open('/data/new.txt', 'w').write('w')"],
            bind_mounts=[BindMount(tmp_path / "linked" / "ws", "/data")],
        )
    )
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "real" / "ws" / "new.txt").read_text() == "w"


def test_environment_is_explicit(bwrap: BubblewrapSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_ONLY_SECRET", "s3cr3t")
    result = run(bwrap.run([PY, "-c", "import os; print(sorted(os.environ.items()))"], env={"ONLY": "this"}))
    assert b"s3cr3t" not in result.stdout
    assert b"('ONLY', 'this')" in result.stdout


def test_pid_and_network_namespaces(bwrap: BubblewrapSandbox) -> None:
    result = run(bwrap.run([PY, "-c", "import os, socket; print(os.getpid(), [n for _, n in socket.if_nameindex()])"]))
    pid, nets = result.stdout.decode().split(" ", 1)
    assert int(pid) < 10
    assert nets.strip() == "['lo']"


def test_file_size_limit(bwrap: BubblewrapSandbox) -> None:
    limits = ResourceLimits(file_size=1 << 20)
    script = "open('/tmp/big', 'wb').write(b'x' * (2 << 20))"
    result = run(bwrap.run([PY, "-c", script], limits=limits))
    assert result.exit_code != 0
    assert b"File too large" in result.stderr or result.exit_code < 0


def test_open_files_limit(bwrap: BubblewrapSandbox) -> None:
    limits = ResourceLimits(open_files=64)
    script = "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e:\n    print(len(fds) < 64, e.errno)"
    result = run(bwrap.run([PY, "-c", script], limits=limits))
    assert result.stdout.decode().split() == ["True", "24"]


def test_memory_limit(bwrap: BubblewrapSandbox) -> None:
    limits = ResourceLimits(address_space=512 << 20)
    result = run(bwrap.run([PY, "-c", "b = bytearray(1 << 30)"], limits=limits))
    assert result.exit_code != 0 and b"MemoryError" in result.stderr


def test_tmp_is_private_and_capped(bwrap: BubblewrapSandbox) -> None:
    script = "import os\ntry:\n    open('/tmp/fill', 'wb').write(b'x' * (8 << 20))\nexcept OSError as e:\n    print('full', e.errno)"
    result = run(_run_with_tmp(bwrap, script, 4 << 20))
    assert b"full 28" in result.stdout


def _run_with_tmp(bwrap: BubblewrapSandbox, script: str, size: int):
    from sandbox_kernel.sandbox import SandboxSpec

    async def go():
        child = await bwrap.start(SandboxSpec(command=[PY, "-c", script], tmp_size=size))
        out, err = await child.process.communicate()
        from sandbox_kernel.sandbox import SandboxResult

        return SandboxResult(child.process.returncode or 0, out, err)

    return go()


def test_subprocess_backend_says_it_isolates_nothing() -> None:
    from sandbox_kernel.sandbox.subprocess_backend import WARNING

    sandbox = SubprocessSandbox()
    assert sandbox.isolates is False
    assert "Nothing is isolated" in WARNING
    result = run(sandbox.run([PY, "-c", "import os; print(os.getpid() > 1)"], env=dict(os.environ)))
    assert result.stdout == b"True\n"


def test_a_cut_cancelled_while_it_reaps_leaves_every_helper_to_the_kill() -> None:
    """A cut (``cut_network``) took the helper list, then killed and reaped
    one helper at a time. Cancelled in a wait (a registry's watcher stopped
    during a rise), it left the rest unkilled and forgotten by the sandbox,
    whose kill then neither killed nor reaped them: a helper (the user-mode
    network) outlived its sandbox, its transport finalised after the loop."""
    from sandbox_kernel.sandbox.base import SandboxProcess

    async def scenario() -> list[int | None]:
        def sleeper() -> Any:
            return asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)

        main = await sleeper()
        helpers = [await sleeper(), await sleeper()]
        sandbox = SandboxProcess(main, "test", helpers)
        cut = asyncio.ensure_future(sandbox.cut_network())
        await asyncio.sleep(0)  # it killed what it kills before its first wait
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        await sandbox.kill()
        assert sandbox.helpers == []
        return [main.returncode, *(h.returncode for h in helpers)]

    codes = asyncio.run(scenario())
    assert all(code is not None for code in codes), f"left running or unreaped: {codes}"
