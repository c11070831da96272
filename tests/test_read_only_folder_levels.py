"""A private session's read-only folders raise the sessions WORKING in them,
not those reading them.

An attack review: a read-only mount keeps a cell from writing in a folder, not
from connecting to a unix socket in it. A public sandbox with network working
in a folder that a private Docker kernel mounts read-only (its
``read_only_mounts``) listened on a socket there, and the private cell sent
it the rows. Raising every session that mounts such a folder (tried, and
reverted) made every session sharing a reference dataset or the test image's
host Python private. So the folder is recorded as *read by a private
session* (``workspace_levels.READ_EXACT``, its ancestors ``READ_BELOW``): a
session whose workspace overlaps it rises, the other readers keep their
network, and a raiser's wait covers the first. The end-to-end attack, with a
Docker kernel and a bwrap kernel, is in
``tests/docker/test_docker_read_only_mount_levels.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.enforcement import EnforcementRecord, pending_holders
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PrivacyStore:
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    for name in ("team/ref/project", "team/notes", "reader", "other-reader", "elsewhere"):
        (tmp_path / name).mkdir(parents=True)
    return PrivacyStore(tmp_path / "data" / "privacy")


def _ratchet(store: PrivacyStore, session: str, workspace: Path, reads: tuple[Path, ...] = ()) -> Ratchet:
    ratchet = Ratchet("u", session, store, workspace=workspace)
    ratchet.read_folders = reads
    ratchet.prepare()
    return ratchet


def test_the_other_readers_of_a_private_sessions_read_only_folder_keep_their_network(
    tmp_path: Path, store: PrivacyStore
) -> None:
    """What the reverted rise broke: a reference folder many sessions mount
    read-only, none working in it."""
    ref = tmp_path / "team" / "ref"
    reader = _ratchet(store, "reader", tmp_path / "reader", (ref,))
    other_reader = _ratchet(store, "other-reader", tmp_path / "other-reader", (ref,))
    beside = _ratchet(store, "beside", tmp_path / "team" / "notes")
    reader.mark("CONFIDENTIAL", "the rows", "cell")
    assert reader.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert other_reader.network_allowed and beside.network_allowed
    # the folder itself holds no rows: only the sessions writing in it rise
    assert WorkspaceLevels.beside(store).exact(ref).sensitivity == Sensitivity.PUBLIC


def test_the_sessions_working_in_a_private_sessions_read_only_folder_rise(tmp_path: Path, store: PrivacyStore) -> None:
    ref = tmp_path / "team" / "ref"
    reader = _ratchet(store, "reader", tmp_path / "reader", (ref,))
    writers = [_ratchet(store, "inside", ref / "project"), _ratchet(store, "same", ref)]
    writers.append(_ratchet(store, "around", tmp_path / "team"))
    elsewhere = _ratchet(store, "elsewhere", tmp_path / "elsewhere")
    assert all(ratchet.network_allowed for ratchet in writers)
    reader.mark("CONFIDENTIAL", "the rows", "cell")
    assert reader.state.sensitivity == Sensitivity.CONFIDENTIAL  # (its read records its folders)
    for ratchet in writers:
        assert not ratchet.network_allowed, f"{ratchet.workspace} works in a private session's read-only folder"
        assert ratchet.state.sensitivity == Sensitivity.CONFIDENTIAL
        assert "read-only" in str(ratchet.state.mark), ratchet.state.mark
    assert elsewhere.network_allowed
    # a writer may have written what it received into the folder: from then
    # on the folder holds private data, and its readers rise as well
    other_reader = _ratchet(store, "other-reader", tmp_path / "other-reader", (ref,))
    assert not other_reader.network_allowed


def test_a_folder_a_sandbox_worked_in_around_the_read_only_one_rises_too(tmp_path: Path, store: PrivacyStore) -> None:
    """A public sandbox of ``team`` may have moved a socket that a sandbox in
    ``notes`` listens on into ``ref`` (the reached rule, for reading)."""
    team, ref = tmp_path / "team", tmp_path / "team" / "ref"
    _ratchet(store, "parent", team).note_reached([team])
    reader = _ratchet(store, "reader", tmp_path / "reader", (ref,))
    beside = _ratchet(store, "beside", team / "notes")
    reader.mark("CONFIDENTIAL", "the rows", "cell")
    assert reader.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert not beside.network_allowed, "a sibling a past sandbox could tie to the read folder kept its network"


def test_a_raisers_wait_covers_the_sessions_working_in_its_read_only_folders(
    tmp_path: Path, store: PrivacyStore
) -> None:
    ref = tmp_path / "team" / "ref"
    reports = [
        EnforcementRecord(store.root, "u", "reader", tmp_path / "reader", reads=[ref]),
        EnforcementRecord(store.root, "u", "inside", ref / "project"),
        EnforcementRecord(store.root, "u", "other-reader", tmp_path / "other-reader", reads=[ref]),
        EnforcementRecord(store.root, "u", "elsewhere", tmp_path / "elsewhere"),
    ]
    try:
        reports[0].report(Sensitivity.CONFIDENTIAL, has_network=False)
        for report in reports[1:]:
            report.report(Sensitivity.PUBLIC, has_network=True)
        pending = pending_holders(store.root, "u", "reader", Sensitivity.CONFIDENTIAL)
        # the reader of the folder is waited for as well: ``inside`` rises and
        # may write what it received there (the levels' rule, transitively)
        assert sorted(line.split(" of session ")[1].split()[0] for line in pending) == ["inside", "other-reader"]
        reports[1].report(Sensitivity.CONFIDENTIAL, has_network=False)
        reports[2].report(Sensitivity.CONFIDENTIAL, has_network=False)
        assert pending_holders(store.root, "u", "reader", Sensitivity.CONFIDENTIAL) == []
    finally:
        for report in reports:
            report.close()


def test_a_reader_raised_by_its_folder_raises_the_writers_of_what_it_reads(tmp_path: Path, store: PrivacyStore) -> None:
    """A session private only through its workspace's level records its
    read-only folders too (the second way into a private state)."""
    ref = tmp_path / "team" / "ref"
    owner = _ratchet(store, "owner", tmp_path / "reader")
    reader = _ratchet(store, "reader", tmp_path / "reader", (ref,))
    inside = _ratchet(store, "inside", ref / "project")
    owner.mark("CONFIDENTIAL", "the rows", "cell")
    assert owner.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert reader.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert not inside.network_allowed
