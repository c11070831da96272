"""A private folder renamed outside JupyterLab keeps its level (guarantee 11).

Folder levels are kept under paths, and JupyterLab's moves carry them
(tests/test_folder_moves.py). A host shell's ``mv`` (a JupyterLab terminal's
too) does not pass through the server: before sandbox_kernel/privacy/
folder_identity.py, the private folder arrived under its new name with no
record and the next notebook there started PUBLIC. Each move here is made by
the real ``mv`` command, and every reader is a WorkspaceLevels of its own (a
new process remembers nothing). The end-to-end attack with kernels is
tests/test_ratchet_side_doors.py::test_a_private_folder_renamed_by_a_host_shell_stays_private.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_kernel.privacy import PrivacyState, PrivacyStore, Sensitivity
from sandbox_kernel.privacy.folder_identity import folder_identity
from sandbox_kernel.privacy.folder_moves import MoveRefused, guard_copy
from sandbox_kernel.privacy.records import SessionMark
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

CONF, PUBLIC = Sensitivity.CONFIDENTIAL, Sensitivity.PUBLIC


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "data" / "privacy"


def _levels(store: Path) -> WorkspaceLevels:
    """A reader of its own, as in another process."""
    return WorkspaceLevels.beside(PrivacyStore(store))


def _mv(source: Path, target: Path) -> None:
    subprocess.run(["mv", str(source), str(target)], check=True)


@pytest.fixture
def home(tmp_path: Path, store: Path) -> Path:
    """home/: a private 'Untitled Folder' (with rows and a subfolder), a public
    folder, and an empty archive."""
    home = tmp_path / "home"
    for folder in ("Untitled Folder/plots", "public", "archive"):
        (home / folder).mkdir(parents=True)
    (home / "Untitled Folder" / "rows.csv").write_text("ada,42\n")
    # as the ratchet of a session working there records its rise
    private = PrivacyState.build(mark=SessionMark.create(CONF, "cell", "patients"))
    _levels(store).rise(home / "Untitled Folder", private, "session s1 of alice")
    return home


def test_a_folder_keeps_its_identity_across_a_rename_and_no_other_folder_has_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = folder_identity(tmp_path / "a")
    assert first is not None and first.startswith("f-")
    assert folder_identity(tmp_path / "b") != first
    _mv(tmp_path / "a", tmp_path / "b" / "c")
    assert folder_identity(tmp_path / "b" / "c") == first
    assert folder_identity(tmp_path / "a") is None, "no folder there any more"
    (tmp_path / "file").write_text("x")
    assert folder_identity(tmp_path / "file") is None, "a file is not a folder"


def test_a_new_folder_that_reuses_a_removed_ones_inode_is_not_taken_for_it(tmp_path: Path, store: Path) -> None:
    """ext4 gives a removed folder's inode number to the next folder made: the
    handle's generation tells them apart, or the new folder would be private."""
    gone = tmp_path / "gone"
    gone.mkdir()
    inode, identity = gone.stat().st_ino, folder_identity(gone)
    _levels(store).record(gone, CONF, "session s1 became CONFIDENTIAL")
    gone.rmdir()
    reused = []
    for n in range(50):
        fresh = tmp_path / f"new-{n}"
        fresh.mkdir()
        assert folder_identity(fresh) != identity
        assert _levels(store).read(fresh).sensitivity == PUBLIC, f"{fresh} (inode {fresh.stat().st_ino})"
        if fresh.stat().st_ino == inode:
            reused.append(fresh)
            break
    print(f"inode number reused: {bool(reused)}")


def test_a_private_folder_renamed_by_a_shell_stays_private_with_what_is_inside(home: Path, store: Path) -> None:
    _mv(home / "Untitled Folder", home / "analysis")
    state = _levels(store).read(home / "analysis")
    assert state.sensitivity == CONF
    assert state.mark is not None and "Untitled Folder" in state.mark.reason, state.mark
    assert _levels(store).read(home / "analysis" / "plots").sensitivity == CONF
    assert _levels(store).read(home / "public").sensitivity == PUBLIC, "a sibling must not rise"
    # JupyterLab's checks see it too: its rows are not copied out to a public folder
    with pytest.raises(MoveRefused):
        guard_copy(home / "analysis" / "rows.csv", home / "public", [store])


def test_the_folders_around_its_new_place_rise_once_it_is_found_there(home: Path, store: Path) -> None:
    """Moved into another folder, it is found by the first read from inside it
    (a notebook opened there); from then on the folders now holding it rise
    too, as they would after a move in JupyterLab."""
    archive = home / "archive"
    _mv(home / "Untitled Folder", archive / "2026")
    assert _levels(store).read(archive / "2026" / "plots").sensitivity == CONF
    assert _levels(store).read(archive).sensitivity == CONF, "the folder now holding private rows"
    assert _levels(store).read(home / "public").sensitivity == PUBLIC


def test_a_folder_holding_a_private_one_keeps_that_when_a_shell_renames_it(home: Path, store: Path) -> None:
    """The folders above a private one are recorded under their identities too:
    renamed, a notebook working in one still contains the private rows."""
    _mv(home, home.parent / "renamed-home")
    moved = home.parent / "renamed-home"
    assert _levels(store).read(moved).sensitivity == CONF
    assert _levels(store).read(moved / "Untitled Folder").sensitivity == CONF
    assert _levels(store).read(moved / "public").sensitivity == PUBLIC


def test_a_rise_records_identities_a_reader_in_another_process_finds(tmp_path: Path, store: Path) -> None:
    """The records are made by the rising session's process and read by a new
    one (as a kernel opened later): nothing is kept only in memory."""
    folder = tmp_path / "w"
    folder.mkdir()
    code = (
        "import sys; from sandbox_kernel.privacy import PrivacyStore, Sensitivity;"
        "from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels;"
        "WorkspaceLevels.beside(PrivacyStore(sys.argv[1])).record(sys.argv[2], Sensitivity.SECRET, 'session s9')"
    )
    subprocess.run([sys.executable, "-c", code, str(store), str(folder)], check=True)
    _mv(folder, tmp_path / "v")
    assert _levels(store).read(tmp_path / "v").sensitivity == Sensitivity.SECRET
