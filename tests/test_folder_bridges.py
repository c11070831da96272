"""A session in a folder that holds a private one must not bridge it to a sibling with network.

Session A works in ``P/A`` and is private; S works in ``P`` (its sandbox
reaches ``P/A`` and ``P/B``); B works in ``P/B``, a sibling of A's folder.
S is cut by the record of the private folder below it, and records ``P``
itself (engine/ratchet.py), so B rises: otherwise S's cells could copy A's
rows into ``P/B`` and B send them out. An attack review found two ways
around it, tested here with the real store, ratchets and holders' reports:
S's read of ``P`` failing closed (a record lost) recorded nothing, and a
raiser's wait for the holders sharing its folder did not wait for B.
(tests/test_ratchet_side_doors.py attacks the rule itself with real kernels.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy import store as store_mod
from sandbox_kernel.privacy.enforcement import EnforcementRecord, pending_holders
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, PrivacyStore]:
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    parent = tmp_path / "P"
    for name in ("A", "B"):
        (parent / name).mkdir(parents=True)
    return parent, PrivacyStore(tmp_path / "data" / "privacy")


def test_a_parent_whose_read_fails_closed_still_raises_the_sibling(folders: tuple[Path, PrivacyStore]) -> None:
    parent, store = folders
    a = Ratchet("u", "a", store, workspace=parent / "A")
    s = Ratchet("u", "s", store, workspace=parent)
    b = Ratchet("u", "b", store, workspace=parent / "B")
    for ratchet in (a, s, b):
        ratchet.prepare()
    a.mark("CONFIDENTIAL", "the rows", "cell")
    assert a.state.sensitivity == Sensitivity.CONFIDENTIAL  # (its read records its folder's levels)
    # the folder records are lost (their high-water markers stay), as after a
    # store restored from an old copy; other processes start afresh
    shutil.rmtree(store.root.parent / "workspace-levels")
    store_mod._floors.clear()
    store_mod._cache.clear()
    assert s.state.error and not s.network_allowed  # fails closed at SECRET
    assert not b.network_allowed, "the sibling kept its network while the parent's cells reach A's rows"
    assert WorkspaceLevels.beside(store).exact(parent).sensitivity == Sensitivity.SECRET


def test_a_raisers_wait_covers_the_sibling_a_live_parent_session_raises(folders: tuple[Path, PrivacyStore]) -> None:
    parent, store = folders
    reports = [
        EnforcementRecord(store.root, "u", "a", parent / "A"),
        EnforcementRecord(store.root, "u", "s", parent),
        EnforcementRecord(store.root, "u", "b", parent / "B"),
        EnforcementRecord(store.root, "u", "elsewhere", parent.parent / "other"),
    ]
    try:
        reports[0].report(Sensitivity.CONFIDENTIAL, has_network=False)
        reports[1].report(Sensitivity.CONFIDENTIAL, has_network=False)  # cut, and it recorded P
        reports[2].report(Sensitivity.PUBLIC, has_network=True)  # not polled yet
        reports[3].report(Sensitivity.PUBLIC, has_network=True)  # no session holds it and A
        pending = pending_holders(store.root, "u", "a", Sensitivity.CONFIDENTIAL)
        assert len(pending) == 1 and "session b " in pending[0], pending
        reports[2].report(Sensitivity.CONFIDENTIAL, has_network=False)
        assert pending_holders(store.root, "u", "a", Sensitivity.CONFIDENTIAL) == []
        reports[1].close()  # no live session in P: B is not A's concern
        reports[2].report(Sensitivity.PUBLIC, has_network=True)
        assert pending_holders(store.root, "u", "a", Sensitivity.CONFIDENTIAL) == []
    finally:
        for report in reports:
            report.close()
