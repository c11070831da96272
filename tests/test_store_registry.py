"""The registry of privacy stores outside the default data dir
(``sandbox_kernel/privacy/store_registry.py``) and what the workspace policy
makes of it, without a sandbox. The attacks through real kernels are in
test_foreign_stores.py."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

import pytest

from sandbox_kernel.engine.workspace_policy import HIDE, WorkspaceRefused, collect_protected_places, plan_workspace
from sandbox_kernel.privacy import PrivacyStore, PrivateData
from sandbox_kernel.privacy.store_registry import (
    REFRESH_AFTER,
    STALE_AFTER,
    entry_name,
    read_registry,
    registered_stores,
    registry_dir,
)
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels


def _masks(workspace: Path) -> dict[str, str]:
    plan = plan_workspace(workspace, collect_protected_places())
    return {str(m.path.relative_to(workspace)): m.kind for m in plan.masks}


def test_a_store_is_registered_before_it_is_written_and_hidden_everywhere(fake_host: Path, tmp_path: Path) -> None:
    """Preparing a store outside the default data dir records it (0600 in a
    0700 folder); a process that never used it then hides the store and what
    is written beside it, and not the folder holding it."""
    ws = tmp_path / "ws"
    store = PrivacyStore(ws / "a-store")
    PrivateData("alice", "s1", store).add_private_dataset("crm", "SECRET")
    entry = registry_dir() / entry_name(str(store.root))
    assert entry.read_bytes() == os.fsencode(str(store.root)) + b"\n"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(registry_dir().stat().st_mode) == 0o700
    assert registered_stores() == [store.root]
    masks = _masks(ws)
    for name in ("a-store", "a-store-highwater", "a-store-enforced", "workspace-levels", "workspace-levels-highwater"):
        assert masks.get(name) == HIDE, (name, masks)
    plan_workspace(ws / "notebooks", collect_protected_places())  # a folder beside the store still runs


def test_a_data_dirs_store_hides_the_whole_data_dir(fake_host: Path, tmp_path: Path) -> None:
    """``<data dir>/privacy`` (a kernel's or the tools' ``data_dir``): the data
    dir holds checkpoints, egress logs and agent workspaces too."""
    ws = tmp_path / "ws"
    PrivacyStore(ws / "agents" / "privacy").prepare("alice", "s1")
    assert _masks(ws) == {"agents": HIDE}
    with pytest.raises(WorkspaceRefused):
        plan_workspace(ws / "agents", collect_protected_places())
    places = collect_protected_places()
    assert ws / "agents" / "workspaces" in places.allowed_roots  # the tools' own workspaces stay usable


def test_stores_in_the_default_data_dir_are_not_registered(fake_host: Path) -> None:
    PrivacyStore(fake_host / "sk" / "privacy").prepare("alice", "s1")
    assert read_registry() == ([], [])


def test_a_store_that_is_gone_is_skipped_and_its_entry_kept(fake_host: Path, tmp_path: Path) -> None:
    """Nothing left on disk: nothing to hide (no empty mount points made in a
    user's folder). The entry stays: a process may be about to create the store."""
    ws = tmp_path / "ws"
    store = PrivacyStore(ws / "a-store")
    store.prepare("alice", "s1")
    for place in ("a-store", "a-store-highwater"):
        for path in sorted((ws / place).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (ws / place).rmdir()
    assert registered_stores() == []
    assert read_registry()[0] == [store.root]
    assert _masks(ws) == {}


def test_bad_registry_entries_are_logged_once_and_never_hide_less(
    fake_host: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage, a relative path, two lines, a NUL, an oversized file, a
    symlink, a FIFO and a folder in the registry: each is named in a log line
    (once per process), none raises, and the good entry still hides its store."""
    ws = tmp_path / "ws"
    good = PrivacyStore(ws / "a-store")
    good.prepare("alice", "s1")
    folder = registry_dir()
    bad = {
        "garbage": b"\xff\xfe not a path",
        "relative": b"relative/store\n",
        "two-lines": b"/a\n/b\n",
        "nul": b"/a\0b\n",
        "dotdot": b"/a/../b\n",
        "huge": b"/" + b"a" * 5000 + b"\n",
        "empty": b"",
    }
    for name, content in bad.items():
        (folder / name).write_bytes(content)
    (folder / "link").symlink_to(folder / entry_name(str(good.root)))
    os.mkfifo(folder / "fifo")
    (folder / "dir").mkdir()
    (folder / ".inflight.tmp-1-ab").write_bytes(b"/half")  # a write in progress: silently skipped
    with caplog.at_level(logging.WARNING, logger="sandbox_kernel.privacy"):
        assert registered_stores() == [good.root]
        assert registered_stores() == [good.root]
        places = collect_protected_places()
    named = {
        name for name in (*bad, "link", "fifo", "dir") if any(f"{folder / name} " in r.message for r in caplog.records)
    }
    assert named == {*bad, "link", "fifo", "dir"}
    assert len(caplog.records) == len(named), [r.message for r in caplog.records]  # once each, not per read
    assert not any(".inflight" in r.message for r in caplog.records)
    assert (ws / "a-store").resolve() in places.hidden


def test_an_unwritable_registry_is_logged_and_the_rise_still_recorded(
    fake_host: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (fake_host / "sk").mkdir()
    (fake_host / "sk" / "stores").write_text("a file where the registry's folder should be")
    store = PrivacyStore(tmp_path / "ws" / "a-store")
    with caplog.at_level(logging.ERROR, logger="sandbox_kernel.privacy"):
        PrivateData("alice", "s1", store).add_private_dataset("crm", "SECRET")
    assert store.read("alice", "s1").sensitivity.name == "SECRET"
    assert any(
        "could not record the privacy store" in r.message and str(store.root) in r.message for r in caplog.records
    )


def test_a_store_in_a_home_keeps_the_homes_secrets_masked(fake_host: Path, tmp_path: Path) -> None:
    """``privacy_dir=~/.sk-store``: its folder is the home. Hiding the home as a
    whole swallowed every mask inside it (``.ssh`` was readable by the home's
    sandbox); now the store is hidden, the home is not, and its secrets stay
    masked."""
    (fake_host / ".ssh").mkdir()
    (fake_host / ".ssh" / "id_rsa").write_text("key")
    (fake_host / "notes").mkdir()
    store = fake_host / ".sk-store"
    PrivacyStore(store).prepare("alice", "s1")
    WorkspaceLevels.beside(PrivacyStore(store)).prepare(fake_host / "notes")
    for places in (collect_protected_places([store]), collect_protected_places()):
        plan = plan_workspace(fake_host.resolve(), places)
        masks = {m.path.name: m.kind for m in plan.masks}
        assert masks.get(".ssh") == HIDE and masks.get(".sk-store") == HIDE, masks
        # a top-level folder of the home the home rule would bind writable, hidden instead
        assert masks.get("workspace-levels") == HIDE, masks
        assert fake_host.resolve() / "workspace-levels" not in plan.writable_entries
        assert fake_host.resolve() / "notes" in plan.writable_entries


def _age_entry(store: PrivacyStore, seconds: float) -> Path:
    entry = registry_dir() / entry_name(str(store.root))
    then = entry.stat().st_mtime - seconds
    os.utime(entry, (then, then))
    return entry


def test_the_entry_of_a_store_long_gone_is_removed_and_a_used_ones_kept(fake_host: Path, tmp_path: Path) -> None:
    """Without removal every store ever made (a test suite makes hundreds in
    temporary folders) is checked at every sandbox start. An entry goes once
    nothing of its store has existed for STALE_AFTER since it was last written;
    a store that registers again (every prepare and write) rewrites an entry
    older than REFRESH_AFTER, so one in use or being made again never goes."""
    gone = PrivacyStore(tmp_path / "ws" / "gone-store")
    gone.prepare("alice", "s1")
    used = PrivacyStore(tmp_path / "ws" / "used-store")
    used.prepare("alice", "s1")
    for place in ("gone-store", "gone-store-highwater", "used-store", "used-store-highwater"):
        for path in sorted((tmp_path / "ws" / place).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (tmp_path / "ws" / place).rmdir()
    old = STALE_AFTER + 60
    gone_entry, used_entry = _age_entry(gone, old), _age_entry(used, old)
    used.prepare("alice", "s1")  # registers again before it makes its folders: a fresh entry
    assert used_entry.exists() and time.time() - used_entry.stat().st_mtime < REFRESH_AFTER
    assert registered_stores() == [used.root]
    assert not gone_entry.exists() and read_registry() == ([used.root], [])
    assert [p.name for p in registry_dir().iterdir() if p.name.startswith(".")] == []  # nothing left aside
    # an entry whose store is gone but that was written recently stays (the store may be on its way)
    young = PrivacyStore(tmp_path / "ws2" / "young-store")
    young.prepare("alice", "s1")
    _age_entry(young, REFRESH_AFTER)
    for path in sorted((tmp_path / "ws2").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    registered_stores()
    assert young.root in read_registry()[0]


def test_a_store_registered_after_a_cached_reading_is_seen(fake_host: Path, tmp_path: Path) -> None:
    """The registry's reading is kept while its folder is unchanged (every
    sandbox start reads it); a store registered afterwards changes the folder
    and is seen at the next start."""
    first = PrivacyStore(tmp_path / "ws" / "first-store")
    first.prepare("alice", "s1")
    folder = registry_dir()
    past = time.time() - 60
    os.utime(folder, (past, past))  # settled: this reading is kept
    assert registered_stores() == [first.root]
    second = PrivacyStore(tmp_path / "ws" / "second-store")
    second.prepare("alice", "s1")
    assert sorted(registered_stores()) == sorted([first.root, second.root])
    assert "second-store" in _masks(tmp_path / "ws")


def test_a_sandbox_start_skips_only_stores_that_cannot_meet_its_workspace(fake_host: Path, tmp_path: Path) -> None:
    """Stores of other processes that neither lie in the workspace nor hold it
    are left out of its scan; one inside it, or one whose folder holds it, stays."""
    inside = PrivacyStore(tmp_path / "ws" / "in-store")
    around = PrivacyStore(tmp_path / "outer" / "privacy")  # a data dir's store: the data dir holds the workspace
    far = PrivacyStore(tmp_path / "far" / "far-store")
    for store in (inside, around, far):
        store.prepare("alice", "s1")
    ws = (tmp_path / "ws").resolve()
    hidden = collect_protected_places(within=ws).hidden
    assert inside.root.resolve() in hidden and far.root.resolve() not in hidden
    nested = (tmp_path / "outer" / "workspaces" / "w1").resolve()
    nested.mkdir(parents=True)
    assert (tmp_path / "outer").resolve() in collect_protected_places(within=nested).hidden
    assert far.root.resolve() in collect_protected_places().hidden  # without a workspace: every store
