"""A folder a sandbox worked in rises with a private folder inside it, even when
that sandbox ended before the rise.

An attack review (with real kernels): a notebook in ``root`` (public, with
network) hard-linked ``root/project/results.csv`` to ``root/other/results.csv``
and ended. Later ``project``'s notebook turned private and wrote its rows to
``results.csv`` (``open(..., 'w')`` writes into the same file); ``other``'s
notebook, a sibling, public with network, read them. A unix socket a sandbox
in ``other`` listens on, moved into ``project`` by the parent's sandbox, gave
the private cell a live channel to it the same way. The folder rule raised
a parent only when a session worked there *after* the rise. Now every folder
a sandbox mounts writable is recorded as reached before it starts, and a rise
records each reached folder around the private one at its level: ``other``
rises, so it loses its network, and a raiser's wait covers it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernel_helpers import ok, shared_data_kernel

from sandbox_kernel.engine.launch import writable_folders
from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.enforcement import EnforcementRecord, pending_holders
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels, reached_ancestors
from sandbox_kernel.sandbox import BindMount

pytestmark = pytest.mark.timeout(300)

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PrivacyStore:
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    for name in ("root/project", "root/other", "elsewhere"):
        (tmp_path / name).mkdir(parents=True)
    return PrivacyStore(tmp_path / "data" / "privacy")


def test_a_rise_raises_the_folders_around_it_that_a_sandbox_worked_in(tmp_path: Path, store: PrivacyStore) -> None:
    root = tmp_path / "root"
    parent = Ratchet("u", "parent", store, workspace=root)
    parent.prepare()
    parent.note_reached([root])  # a sandbox in root, public, then gone
    assert reached_ancestors(root / "project") == [root]
    project = Ratchet("u", "project", store, workspace=root / "project")
    other = Ratchet("u", "other", store, workspace=root / "other")
    elsewhere = Ratchet("u", "elsewhere", store, workspace=tmp_path / "elsewhere")
    for ratchet in (project, other, elsewhere):
        ratchet.prepare()
    assert other.network_allowed
    project.mark("CONFIDENTIAL", "the rows", "cell")
    assert project.state.sensitivity == Sensitivity.CONFIDENTIAL  # (its read records its folder's levels)
    assert not other.network_allowed, "the sibling kept its network: a link its parent's sandbox left reaches it"
    assert other.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert "a sandbox worked in" in str(WorkspaceLevels.beside(store).exact(root).mark)
    assert elsewhere.network_allowed  # a folder no sandbox tied to it keeps its network


def test_without_a_sandbox_around_it_the_sibling_keeps_its_network(tmp_path: Path, store: PrivacyStore) -> None:
    root = tmp_path / "root"
    project = Ratchet("u", "project", store, workspace=root / "project")
    other = Ratchet("u", "other", store, workspace=root / "other")
    for ratchet in (project, other):
        ratchet.prepare()
        ratchet.note_reached([ratchet.workspace])  # type: ignore[list-item]
    project.mark("CONFIDENTIAL", "the rows", "cell")
    assert project.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert other.network_allowed and reached_ancestors(root / "project") == []


def test_a_raisers_wait_covers_the_folders_a_past_sandbox_tied(tmp_path: Path, store: PrivacyStore) -> None:
    root = tmp_path / "root"
    Ratchet("u", "parent", store, workspace=root).note_reached([root])
    reports = [
        EnforcementRecord(store.root, "u", "project", root / "project"),
        EnforcementRecord(store.root, "u", "other", root / "other"),
        EnforcementRecord(store.root, "u", "elsewhere", tmp_path / "elsewhere"),
    ]
    try:
        reports[0].report(Sensitivity.CONFIDENTIAL, has_network=False)
        reports[1].report(Sensitivity.PUBLIC, has_network=True)  # not polled yet
        reports[2].report(Sensitivity.PUBLIC, has_network=True)
        pending = pending_holders(store.root, "u", "project", Sensitivity.CONFIDENTIAL)
        assert len(pending) == 1 and "session other " in pending[0], pending
        reports[1].report(Sensitivity.CONFIDENTIAL, has_network=False)
        assert pending_holders(store.root, "u", "project", Sensitivity.CONFIDENTIAL) == []
    finally:
        for report in reports:
            report.close()


def test_under_the_home_rule_a_sandbox_reaches_the_writable_entries_not_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    mounts = [
        BindMount(home, "/workspace", readonly=True),
        BindMount(home / "data", "/workspace/data"),
        BindMount(home / "notes", "/workspace/notes"),
        BindMount(home / ".ssh", "/workspace/.ssh", kind="hide"),
        BindMount(tmp_path / "state", "/.sandbox_kernel/state"),
    ]
    assert writable_folders(mounts, home) == [home / "data", home / "notes"]
    assert writable_folders([BindMount(tmp_path / "w", "/workspace")], tmp_path / "w") == [tmp_path / "w"]


def test_a_link_a_past_parent_sandbox_left_reaches_no_sibling_with_network(tmp_path: Path) -> None:
    """The review's attack with real bwrap kernels sharing one data dir: a
    hard link and a unix socket planted by a public notebook of ``root``
    (ended before the rise), a private ``project`` and a public ``other``."""
    root, data = tmp_path / "root", tmp_path / "shared-data"
    parent = shared_data_kernel(root, tmp_path / "p-tmp", data)
    try:
        (root / "project").mkdir()
        (root / "other").mkdir()
        planted = ok(
            parent,
            "import os\nopen('/workspace/project/results.csv', 'w').write('placeholder\\n')\n"
            "os.link('/workspace/project/results.csv', '/workspace/other/results.csv')\n"
            "print(os.stat('/workspace/other/results.csv').st_nlink)",
        )
        assert planted.strip() == "2"
    finally:
        parent.shutdown()
    assert os.stat(root / "project/results.csv").st_ino == os.stat(root / "other/results.csv").st_ino
    project = shared_data_kernel(root / "project", tmp_path / "a-tmp", data)
    other = shared_data_kernel(root / "other", tmp_path / "s-tmp", data)
    try:
        assert "eth0" in ok(other, IFACES) or "tap0" in ok(other, IFACES)  # the sibling starts with network
        project.run("%private patients CONFIDENTIAL")  # (the cell that raises is stopped: it had network)
        assert ok(project, IFACES).strip() == "['lo']"
        ok(project, "open('/workspace/results.csv', 'w').write('ada,42,diabetes\\n')")
        seen = ok(other, IFACES + "\nprint(open('/workspace/results.csv').read())", timeout=60)
        assert seen.splitlines()[0] == "['lo']", f"the sibling read the private rows with network: {seen}"
    finally:
        project.shutdown()
        other.shutdown()


def test_a_reached_folder_made_anew_and_moved_on_the_host_still_rises(tmp_path: Path, store: PrivacyStore) -> None:
    """An attack review: ``root`` was reached once, then deleted and made
    anew on the host (``rm -rf``, ``git clone``). A public sandbox in the new
    ``root`` left a link between ``project`` and ``other``, and its start
    was not recorded again: the path's record was there, the new identity's
    was not. After a host ``mv root moved`` the rise of ``moved/project``
    raised nothing around it, and ``other`` read the rows with network."""
    import shutil

    root = tmp_path / "root"
    Ratchet("u", "first", store, workspace=root).note_reached([root])
    shutil.rmtree(root)
    (root / "project").mkdir(parents=True)
    (root / "other").mkdir()
    Ratchet("u", "second", store, workspace=root).note_reached([root])  # the sandbox that left the link
    moved = tmp_path / "moved"
    root.rename(moved)
    assert reached_ancestors(moved / "project") == [moved]
    project = Ratchet("u", "project", store, workspace=moved / "project")
    other = Ratchet("u", "other", store, workspace=moved / "other")
    for ratchet in (project, other):
        ratchet.prepare()
    assert other.network_allowed
    project.mark("CONFIDENTIAL", "the rows", "cell")
    assert project.state.sensitivity == Sensitivity.CONFIDENTIAL
    assert not other.network_allowed, "the sibling kept its network after its reached parent was remade and moved"
