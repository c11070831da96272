"""A folder's level counts across every ratchet store of the host.

Two processes on one folder may keep their sessions in different stores
(``--SandboxKernel.privacy_dir``, another data dir, ``ToolsConfig.data_dir``),
each with the folder levels beside it. A kernel that went private in one store
must cut the network of a kernel in the other store sharing its folder, a
host-side raiser's ``wait=True`` must wait for that kernel too, and a store
whose records cannot be read fails closed. Network is checked by interfaces
inside the sandbox only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, shared_data_kernel, status_of

from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.enforcement import EnforcementRecord, pending_holders
from sandbox_kernel.privacy.store_registry import register
from sandbox_kernel.privacy.workspace_levels import EXACT, WorkspaceLevels, _key, folder_of, read_everywhere

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def _interfaces(kernel: SandboxKernelHandle) -> str:
    return kernel.stdout_of(IFACES).strip().splitlines()[-1]


@pytest.mark.parametrize("where", ["beside", "inside-the-data-dir"])
@pytest.mark.parametrize("private_one", ["own-store", "default-store"])
def test_a_kernel_in_another_store_sharing_the_folder_loses_its_network(
    tmp_path: Path, private_one: str, where: str
) -> None:
    """Kernel A keeps its sessions in a store of its own (privacy_dir), kernel
    B in the user's default one; both have the same workspace. Whichever goes
    private, the other's next cell has no network and the private rows it
    can read came with the cut. A's store may also lie inside the default
    data dir ``<D>/second/privacy``: such stores were not registered, so B
    never read their folder levels (tests/test_stores_inside_the_data_dir.py)."""
    data = tmp_path / "data"
    data.mkdir()
    folder = tmp_path / "shared-notebooks"
    store = tmp_path / "store-a" if where == "beside" else data / "second" / "privacy"
    own = f"--SandboxKernel.privacy_dir={store}"
    a = shared_data_kernel(folder, tmp_path / "ta", data, own, "--SandboxKernel.session_id=nbA")
    try:
        b = shared_data_kernel(folder, tmp_path / "tb", data, "--SandboxKernel.session_id=nbB")
        try:
            assert _interfaces(a) != "['lo']" and _interfaces(b) != "['lo']"  # public: with network
            riser, other = (a, b) if private_one == "own-store" else (b, a)
            riser.run(
                "import sandbox_kernel.private as p\np.add_dataset('patients', 'SECRET')"
            )  # stopped: it had network
            riser.stdout_of("open('/workspace/patients.csv', 'w').write('id,dx\\n1,SECRET-ROW\\n')")
            assert _interfaces(riser) == "['lo']"
            out = other.stdout_of("print(open('/workspace/patients.csv').read())\n" + IFACES)
            assert out.strip().splitlines()[-1] == "['lo']", out
            assert "SECRET" in str(status_of(other))
        finally:
            b.shutdown()
    finally:
        a.shutdown()


def test_wait_waits_for_holders_in_other_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A raiser's wait=True in store A waits for a live holder kept in store B
    whose workspace, or whose read-only folder, overlaps the session's."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    store_a, store_b = tmp_path / "a" / "privacy", tmp_path / "b" / "privacy"
    register(store_a)
    register(store_b)
    folder = tmp_path / "team"
    folder.mkdir()
    own = EnforcementRecord(store_a, "alice", "nb1", workspace=folder)
    own.report(Sensitivity.SECRET, False)
    other = EnforcementRecord(store_b, "bob", "nb2", workspace=folder / "sub")
    reader = EnforcementRecord(store_b, "carol", "shell", workspace=tmp_path / "elsewhere", reads=[folder])
    bystander = EnforcementRecord(store_b, "dave", "nb3", workspace=tmp_path / "sibling")
    try:
        for record in (other, reader, bystander):
            record.report(Sensitivity.PUBLIC, True)
        pending = pending_holders(store_a, "alice", "nb1", Sensitivity.SECRET)
        assert len(pending) == 2, pending
        assert any("nb2" in p for p in pending) and any("shell" in p for p in pending), pending
        other.report(Sensitivity.SECRET, False)
        reader.report(Sensitivity.SECRET, False)
        assert pending_holders(store_a, "alice", "nb1", Sensitivity.SECRET) == []
    finally:
        for record in (own, other, reader, bystander):
            record.close()


def test_an_unreadable_record_in_another_store_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session in store A whose folder's record beside store B is damaged
    is treated as private (SECRET, with the error), as for its own store."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    store_a, store_b = PrivacyStore(tmp_path / "a" / "privacy"), PrivacyStore(tmp_path / "b" / "privacy")
    folder = tmp_path / "team"
    folder.mkdir()
    levels_b = WorkspaceLevels.beside(store_b)
    levels_b.record(folder, Sensitivity.CONFIDENTIAL, "a kernel of store B")
    ratchet = Ratchet("alice", "nb1", store_a, workspace=folder)
    assert ratchet.state.sensitivity == Sensitivity.CONFIDENTIAL
    record = levels_b.store.path_for(EXACT, _key(folder_of(folder)))
    os.chmod(record, 0o600)
    record.write_bytes(b"{not json")
    state = Ratchet("alice", "nb2", store_a, workspace=folder).state
    assert state.sensitivity == Sensitivity.SECRET and state.error, state


def test_levels_beside_every_registered_store_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default store's levels and each registered store's count; a store
    that was never registered is not known (its process registers first)."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    folder = tmp_path / "w"
    folder.mkdir()
    default_levels = WorkspaceLevels.beside(PrivacyStore(tmp_path / "data" / "privacy"))
    assert read_everywhere(folder).sensitivity == Sensitivity.PUBLIC
    WorkspaceLevels.beside(PrivacyStore(tmp_path / "x" / "privacy")).record(folder / "in", Sensitivity.INTERNAL, "x")
    assert read_everywhere(folder).sensitivity == Sensitivity.INTERNAL  # below(folder), beside a registered store
    default_levels.record(folder, Sensitivity.CONFIDENTIAL, "default")
    assert read_everywhere(folder / "in").sensitivity == Sensitivity.CONFIDENTIAL
