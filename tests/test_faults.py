"""Fault injection with real filesystems: the kernel's state directory on a
full disk, the privacy store on a read-only one (tmpfs mounts made and removed
by the test; root only).

Each: the kernel keeps serving, nothing is lost beyond what the message says,
the ratchet fails closed, and nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from kernel_helpers import IN_CI, SandboxKernelHandle, require_bwrap, status_of

IFACES = "import socket; print([n for _, n in socket.if_nameindex()])"


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=False)
    if result.returncode != 0:
        if IN_CI:
            pytest.fail("mounting a tmpfs failed (the fault tests need root)")
        pytest.skip("mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB filesystem of its own, unmounted after the test."""
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small-disk"
    _mount_tmpfs(mount, "3m")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def kernel_on(tmp_path: Path, data_dir: Path, *args: str) -> SandboxKernelHandle:
    require_bwrap()
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return SandboxKernelHandle(
        tmp_path / "ws",
        tmp_path / "tmp",
        extra_args=["--SandboxKernel.backend=bwrap", "--SandboxKernel.network=full", *args],
        env={"SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
    )


def shut_down_cleanly(k: SandboxKernelHandle) -> None:
    """Shut the kernel down; every process it started must be gone."""
    started = k.descendants()
    assert started, "the kernel had no sandbox processes to check"
    k.shutdown()
    _, alive = psutil.wait_procs(started, timeout=15)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


def test_state_disk_full_the_kernel_goes_on_and_says_what_a_loss_would_cost(tmp_path: Path, small_disk: Path) -> None:
    k = kernel_on(tmp_path, small_disk)
    try:
        assert k.run("x = 'small'").status == "ok"
        time.sleep(2)  # the background checkpoint after cell [1] (fits)
        run = k.run("big = bytes(6 * 1024 * 1024)\nprint('made')")  # its checkpoint cannot fit in 3 MB
        assert run.status == "ok" and "made" in run.stdout
        time.sleep(2)
        run = k.run("y = len(big)")
        assert run.status == "ok", run.reply
        assert "could not be checkpointed" in run.stderr and "No space left on device" in run.stderr
        assert "after cell [1]" in run.stderr
        assert k.run("print(x, y)").stdout == "small 6291456\n"  # the live state is whole
        # the sandbox is lost: what comes back is what the message said
        assert k.kill_sandboxes() >= 1
        run = k.run("print(x, 'big' in dir())")
        assert run.status == "ok" and run.stdout == "small False\n", (run.reply, run.stdout, run.stderr)
        assert "checkpoint taken after cell [1]" in run.stderr
        leftovers = [p.name for p in small_disk.rglob("*") if ".tmp-" in p.name]
        assert leftovers == []  # failed writes leave no partial files filling the disk
        shut_down_cleanly(k)
    finally:
        if k.km.has_kernel:
            k.shutdown()


def test_privacy_store_read_only_fails_closed(tmp_path: Path, small_disk: Path) -> None:
    store = small_disk / "store"
    store.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    k = kernel_on(tmp_path, tmp_path / "data", f"--SandboxKernel.privacy_dir={store}")
    try:
        before = k.run(IFACES).stdout
        assert "'lo'" in before and before != "['lo']\n"  # public: an interface besides lo
        run = k.run("%private payroll")
        assert "could not record the privacy change" in run.stderr and "Read-only file system" in run.stderr
        assert "Network access has been restricted" in run.stderr
        assert k.run(IFACES).stdout == "['lo']\n"  # not written, yet in force: the network is gone
        assert status_of(k)["level"] == "CONFIDENTIAL"
        assert k.run("print('still serving')").stdout == "still serving\n"
        shut_down_cleanly(k)
    finally:
        if k.km.has_kernel:
            k.shutdown()
