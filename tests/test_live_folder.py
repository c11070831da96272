"""sandbox_kernel.privacy.live_folder: a session's workspace followed across moves on the host.

The kernel-level attack (a live notebook's folder moved into a private one) is
tests/test_ratchet_side_doors.py::test_a_notebook_whose_folder_moves_into_a_private_one_follows_it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.live_folder import LiveFolder
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels


def test_the_path_follows_renames_and_falls_back_once_removed(tmp_path: Path) -> None:
    folder = tmp_path / "a (deleted)"  # a name that looks like the kernel's mark of a removed folder
    folder.mkdir()
    live = LiveFolder(folder)
    assert live.path == folder
    os.rename(folder, tmp_path / "b")
    assert live.path == tmp_path / "b"
    os.rmdir(tmp_path / "b")
    assert live.path == folder, "a removed folder is found by its configured path again"
    assert LiveFolder(tmp_path / "missing").path == tmp_path / "missing"


def test_the_held_folder_reaches_no_child_process(tmp_path: Path) -> None:
    """Sandboxes are started by the process holding it: the descriptor must not cross."""
    live = LiveFolder(tmp_path)
    fd = live._fd
    assert fd is not None and not os.get_inheritable(fd)
    listed = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"],
        capture_output=True,
        text=True,
        close_fds=False,
        check=True,
    ).stdout
    assert f"'{fd}'" not in listed, listed


def test_the_ratchet_reads_and_records_where_the_folder_is_now(tmp_path: Path) -> None:
    store = PrivacyStore(tmp_path / "data" / "privacy")
    levels = WorkspaceLevels.beside(store)
    (tmp_path / "secret").mkdir()
    (tmp_path / "work").mkdir()
    levels.record(tmp_path / "secret", Sensitivity.CONFIDENTIAL, "session x became CONFIDENTIAL")
    ratchet = Ratchet("u", "s", store, workspace=tmp_path / "work")
    assert not ratchet.state.has_private_data
    os.rename(tmp_path / "work", tmp_path / "secret" / "work")
    assert ratchet.workspace == tmp_path / "secret" / "work"
    assert ratchet.state.sensitivity == Sensitivity.CONFIDENTIAL
    # its own rise is recorded where the folder is
    ratchet.mark("SECRET", "moved rows", "api")
    assert ratchet.state.sensitivity == Sensitivity.SECRET
    assert levels.exact(tmp_path / "secret" / "work").sensitivity == Sensitivity.SECRET
    assert levels.exact(tmp_path / "work").sensitivity == Sensitivity.PUBLIC
