"""Temp folders of killed processes are collected by the next one, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox_kernel.engine import owned_dirs


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_real_folders_of_dead_processes_of_this_user_go(tmp_path: Path) -> None:
    mine = owned_dirs.make("sk-x-", str(tmp_path))
    assert mine.name.startswith(f"sk-x-{os.getpid()}-") and (mine.stat().st_mode & 0o777) == 0o700
    dead = tmp_path / f"sk-x-{dead_pid()}-abc"
    dead.mkdir()
    (dead / "proxy.sock").write_text("")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    link = tmp_path / f"sk-x-{dead_pid()}-link"
    link.symlink_to(victim)  # a planted symlink is never followed
    not_a_pid = tmp_path / "sk-x-notapid-1"
    not_a_pid.mkdir()
    alive = tmp_path / "sk-x-1-init"  # pid 1 is alive
    alive.mkdir()
    assert owned_dirs.collect_stale("sk-x-", str(tmp_path)) == 1
    assert not dead.exists()
    assert mine.exists() and link.is_symlink() and (victim / "keep").read_text() == "precious"
    assert not_a_pid.exists() and alive.exists()
