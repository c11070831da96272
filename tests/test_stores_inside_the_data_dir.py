"""A store kept inside the default data dir, not at its default place, counts.

``--SandboxKernel.privacy_dir=<D>/second/privacy``, a kernel's ``data_dir`` or
``ToolsConfig.data_dir`` under the default data dir ``<D>``: every sandbox
hides such a store already (with ``<D>``), but its folder levels and its
holders must be read by every other process on the folder. Such stores were
not registered, so a kernel with the default store sharing the folder kept
its network and read the other's SECRET rows (two real kernels:
tests/test_folder_levels_across_stores.py, ``inside-the-data-dir``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle

from sandbox_kernel.privacy import PrivacyStore, Sensitivity, store_registry
from sandbox_kernel.privacy.enforcement import EnforcementRecord, pending_holders
from sandbox_kernel.privacy.store_registry import all_store_roots, read_registry, register
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels, read_everywhere

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def _interfaces(kernel: SandboxKernelHandle) -> str:
    return kernel.stdout_of(IFACES).strip().splitlines()[-1]


def test_stores_inside_the_data_dir_are_registered_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``<D>/agents/privacy`` (a tools data dir under D) is registered when it
    is written, its folder levels count for a kernel on the default store,
    and a raiser there waits for a holder of the default store (and back)."""
    data = tmp_path / "data"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    folder = tmp_path / "w"
    folder.mkdir()
    inner = PrivacyStore(data / "agents" / "privacy")
    default_levels = WorkspaceLevels.beside(PrivacyStore(data / "privacy"))
    assert read_everywhere(folder, default_levels).sensitivity == Sensitivity.PUBLIC
    WorkspaceLevels.beside(inner).record(folder, Sensitivity.SECRET, "an agent session went SECRET here")
    assert [root.parent for root in read_registry()[0]] == [inner.root.parent]  # the levels' own store
    assert read_everywhere(folder, default_levels).sensitivity == Sensitivity.SECRET
    assert read_everywhere(folder / "sub").sensitivity == Sensitivity.SECRET

    own = EnforcementRecord(inner.root, "alice", "agent", workspace=folder)
    other = EnforcementRecord(data / "privacy", "bob", "nb", workspace=folder)
    try:
        own.report(Sensitivity.SECRET, False)
        other.report(Sensitivity.PUBLIC, True)
        pending = pending_holders(inner.root, "alice", "agent", Sensitivity.SECRET)
        assert len(pending) == 1 and "nb" in pending[0], pending
        assert pending_holders(data / "privacy", "bob", "nb", Sensitivity.SECRET) != []
        other.report(Sensitivity.SECRET, False)
        assert pending_holders(inner.root, "alice", "agent", Sensitivity.SECRET) == []
    finally:
        own.close()
        other.close()


def test_the_default_store_itself_is_not_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    PrivacyStore(data / "privacy").prepare("alice", "s1")
    register(data / "privacy")
    assert read_registry() == ([], [])


def test_an_unlisted_store_left_inside_the_data_dir_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store an earlier version left at ``<D>/x/y/privacy`` without an entry
    (those versions skipped the data dir) is found by the first read of this
    process, and its folder levels count; one a sandbox could have made in a
    data dir's ``workspaces`` is not."""
    data = tmp_path / "data"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    folder = tmp_path / "w"
    folder.mkdir()
    monkeypatch.setattr(store_registry, "register", lambda root: None)  # as earlier versions did
    left = PrivacyStore(data / "x" / "y" / "privacy")
    WorkspaceLevels.beside(left).record(folder, Sensitivity.CONFIDENTIAL, "left by an earlier version")
    made_up = PrivacyStore(data / "workspaces" / "ws1" / "privacy")
    WorkspaceLevels.beside(made_up).record(folder / "other", Sensitivity.SECRET, "written by a sandbox")
    monkeypatch.undo()
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    # (a process of this version starts: this one looked for unlisted stores
    # while the earlier version's were being made, when a rise looked for
    # folders a sandbox reached)
    store_registry._scanned.clear()
    assert read_registry() == ([], [])
    roots, problem = all_store_roots()
    assert problem is None and left.root in roots, roots
    assert not any("workspaces" in str(root) for root in roots), roots
    assert read_everywhere(folder).sensitivity == Sensitivity.CONFIDENTIAL
    assert read_everywhere(folder / "other").sensitivity == Sensitivity.CONFIDENTIAL  # exact(folder) only
