"""What a read of a folder's level costs, and what it must still see.

Every session reads its folder's level over every store of the host four
times a second (the privacy poll) and at cells (``Ratchet.recent_state``).
The reading is reused while nothing it looked at changed: the stores' record
folders, and the identity of the folder and each ancestor. Not the folders'
own times: a workspace changes whenever a cell writes a file there (and
``/tmp`` every moment), and a reading keyed on them was made again at every
read, a few reads per ancestor and store each time (a per-cell regression
measured in bench/kernel_latency.py). A reused reading must still see a rise
in any store and a private folder moved into the workspace's place.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from kernel_helpers import require_bwrap

from sandbox_kernel.engine import EngineConfig, Session
from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity, workspace_levels
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels, read_all_folders
from sandbox_kernel.sandbox import get_sandbox

#: a store's records are trusted for reuse once this much older than a reading
SETTLED = workspace_levels._SETTLE_NS / 1e9 + 0.2


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders every store's levels were read for from now on."""
    reads: list[Path] = []
    read = WorkspaceLevels.read

    def counted(self: WorkspaceLevels, workspace: str | os.PathLike[str]) -> object:
        reads.append(Path(workspace))
        return read(self, workspace)

    monkeypatch.setattr(WorkspaceLevels, "read", counted)
    return reads


def _two_settled_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: Path
) -> tuple[WorkspaceLevels, WorkspaceLevels]:
    """``folder`` made, and the folder levels of two stores (A, the caller's,
    and B), each holding a record elsewhere, old enough to be reused."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    folder.mkdir(parents=True)
    own = WorkspaceLevels.beside(PrivacyStore(tmp_path / "a" / "privacy"))
    other = WorkspaceLevels.beside(PrivacyStore(tmp_path / "b" / "privacy"))
    own.record(tmp_path / "elsewhere-a", Sensitivity.INTERNAL, "store A exists")
    other.record(tmp_path / "elsewhere-b", Sensitivity.INTERNAL, "store B exists")
    time.sleep(SETTLED)
    return own, other


def test_a_reading_is_reused_while_the_workspace_changes_and_not_after_a_rise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "team" / "notebooks"
    own, other = _two_settled_stores(tmp_path, monkeypatch, folder)
    assert read_all_folders([folder], own).sensitivity == Sensitivity.PUBLIC
    reads = _count_reads(monkeypatch)

    # cells write files in the workspace and beside it: the same reading holds
    for n in range(3):
        (folder / f"out-{n}.csv").write_text("a,b\n")
        (folder.parent / f"draft-{n}").mkdir()
        assert read_all_folders([folder], own).sensitivity == Sensitivity.PUBLIC
    assert reads == [], "the levels were read again although no store changed"

    # a rise in the other store is seen at the next read
    other.record(folder, Sensitivity.CONFIDENTIAL, "a kernel of store B went private here")
    assert read_all_folders([folder], own).sensitivity == Sensitivity.CONFIDENTIAL
    assert reads, "the rise was answered from the reading made before it"
    # and in the caller's own store
    time.sleep(SETTLED)
    own.record(folder, Sensitivity.SECRET, "a kernel of store A went further")
    assert read_all_folders([folder], own).sensitivity == Sensitivity.SECRET


def test_a_private_folder_moved_into_the_workspace_place_is_seen_by_a_reused_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No store changes when a host shell renames folders: the reading must
    notice that the folder at the workspace's path is another one (its
    identity), which carries the level it was recorded at elsewhere."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    workspace = tmp_path / "public-work"
    workspace.mkdir()
    private = tmp_path / "clinic"
    private.mkdir()
    own = WorkspaceLevels.beside(PrivacyStore(tmp_path / "a" / "privacy"))
    own.record(tmp_path / "elsewhere", Sensitivity.INTERNAL, "store A exists")
    WorkspaceLevels.beside(PrivacyStore(tmp_path / "b" / "privacy")).record(
        private, Sensitivity.CONFIDENTIAL, "a kernel of store B went private in the clinic folder"
    )
    time.sleep(SETTLED)
    for _ in range(2):
        assert read_all_folders([workspace], own).sensitivity == Sensitivity.PUBLIC
    workspace.rename(tmp_path / "public-work-old")
    private.rename(workspace)  # `mv clinic public-work` in a terminal
    state = read_all_folders([workspace], own)
    assert state.sensitivity == Sensitivity.CONFIDENTIAL, state


@pytest.mark.asyncio
async def test_a_privacy_poll_reads_the_level_once_and_still_acts_on_a_rise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll (four a second per kernel) read every store three or four
    times, once per check; one read now serves them all."""
    require_bwrap()
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    store = PrivacyStore(tmp_path / "data" / "privacy")
    ratchet = Ratchet("alice", "nb1", store, workspace=workspace)
    session = Session(EngineConfig(workspace=workspace, network="none"), sandbox=get_sandbox("bwrap"), ratchet=ratchet)
    seen: list[str] = []
    session.on_privacy_change = lambda notice: seen.append(notice or "")
    reads = 0
    read_state = ratchet._read_state

    def counted() -> object:
        nonlocal reads
        reads += 1
        return read_state()

    monkeypatch.setattr(ratchet, "_read_state", counted)
    try:
        assert await session.refresh_privacy() is False
        assert reads == 1
        # another kernel in the folder (another session of the store) goes
        # private, and its own read records the folder's level
        other = Ratchet("alice", "nb2", store, workspace=workspace)
        other.mark("CONFIDENTIAL", "patients", "widget")
        assert other.state.sensitivity == Sensitivity.CONFIDENTIAL
        reads = 0
        assert await session.refresh_privacy() is True
        assert reads == 1
        assert not session.network_allowed and seen and "nb2" in seen[-1], seen
    finally:
        await asyncio.wait_for(session.shutdown(), 30)


def test_a_reused_reading_sees_a_record_kind_folder_made_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading looks only at the record folders a store held when its root
    last changed (``_present_kinds``: eight kinds per store, four times a
    second): a kind folder made later moves the root, and a record in it is
    seen at the next read; a record added to it after that, too."""
    folder = tmp_path / "team" / "ref"
    own, other = _two_settled_stores(tmp_path, monkeypatch, folder)  # (store B: no read-only kinds yet)
    assert read_all_folders([folder], own, [folder]).sensitivity == Sensitivity.PUBLIC
    assert read_all_folders([folder], own, [folder]).sensitivity == Sensitivity.PUBLIC  # (reused)
    other.record_read(tmp_path / "team", Sensitivity.CONFIDENTIAL, "a private kernel of store B reads team")
    time.sleep(SETTLED)
    assert read_all_folders([folder], own, [folder]).sensitivity == Sensitivity.CONFIDENTIAL
    assert read_all_folders([folder], own).sensitivity == Sensitivity.PUBLIC  # (a reader of it only)
    time.sleep(SETTLED)
    other.record_read(folder, Sensitivity.SECRET, "another reads ref itself, later")
    time.sleep(SETTLED)
    assert read_all_folders([folder], own, [folder]).sensitivity == Sensitivity.SECRET
