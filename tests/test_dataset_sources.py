"""A private dataset's source inside a workspace (guarantee 11: private data
never becomes readable by a sandbox that has network, through any path).

``c.SandboxKernel.private_datasets = {'hr': {'source': 'data/hr.csv'}}`` (next
to the notebook, the natural configuration) used to be readable by the PUBLIC,
networked sandbox at ``/workspace/data/hr.csv``, and by every other kernel on
the folder: the dataset was kept only from ``/private/hr``. Each configured
source is now recorded host-wide (``privacy/dataset_registry.py``) and hidden
from every sandbox whose workspace holds it (``engine/workspace_policy.py``);
a private sandbox of the configuring session reads it at ``/private/<name>``
only. And since a hiding mount does not survive a host program replacing the
file, a folder holding a source is recorded as holding private data: every
sandbox on it is without network (``engine/ratchet.py``, ``record_source``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap, shared_data_kernel

from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.engine.workspace_policy import (
    HIDE,
    PIN,
    ProtectedPlaces,
    WorkspaceRefused,
    apply_policy,
    collect_protected_places,
    hide_private_sources,
    plan_workspace,
)
from sandbox_kernel.privacy import PrivacyStore
from sandbox_kernel.privacy.dataset_registry import register, registered_sources, registry_dir

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"
ROW = "ada,123456"


def _masks(plan) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {str(m.path.relative_to(plan.workspace)): m.kind for m in plan.masks}


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A default data dir of the test's own (its registry starts empty)."""
    data = tmp_path / "sk-data"
    data.mkdir()
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    return data


# ------------------------------------------------------------------ real kernels


def test_a_dataset_in_the_workspace_keeps_every_sandbox_on_its_folder_without_network(tmp_path: Path) -> None:
    """Kernel B runs on the folder, public with network; kernel A starts there
    naming ``data/hr.csv`` (relative to the notebook's folder) as its
    dataset; kernel C runs on a sibling folder. The hiding mount does not
    survive a host program replacing the file, so a folder holding a source
    holds private data: A starts without network, B loses its network within
    a poll, C keeps it. Neither A nor B reads the file while it is hidden;
    once it is replaced on the host (an atomic save) B reads the new rows,
    and has no network to send them with. A reads the dataset at /private/hr
    once it adds it."""
    require_bwrap()
    data = tmp_path / "host-data"
    ws = tmp_path / "project"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "hr.csv").write_text(f"name,salary\n{ROW}\n")
    (ws / "data" / "notes.txt").write_text("public notes\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "sandbox_kernel_config.py").write_text(
        "c.SandboxKernel.private_datasets = {'hr': {'source': 'data/hr.csv', 'sensitivity': 'SECRET'}}\n"
    )
    probe = (
        "import os\n"
        "try:\n    print(repr(open('/workspace/data/hr.csv').read()))\nexcept OSError as e:\n    print('refused', e)\n"
        "print(open('/workspace/data/notes.txt').read().strip())\n"
        "try:\n    os.rename('/workspace/data', '/workspace/moved')\n    print('renamed')\n"
        "except OSError as e:\n    print('rename refused', e.errno)\n"
    )
    kernels: list[SandboxKernelHandle] = []
    try:
        b = shared_data_kernel(ws, tmp_path / "b-tmp", data)
        kernels.append(b)
        c = shared_data_kernel(tmp_path / "sibling", tmp_path / "c-tmp", data)
        kernels.append(c)
        assert len(eval(b.run(IFACES).stdout)) > 1  # public, with network, before A
        (tmp_path / "a-tmp").mkdir()
        a = SandboxKernelHandle(
            ws,
            tmp_path / "a-tmp",
            extra_args=["--SandboxKernel.backend=bwrap", "--SandboxKernel.network=full"],
            env={"SANDBOX_KERNEL_DATA_DIR": str(data), "JUPYTER_CONFIG_DIR": str(config)},
        )
        kernels.append(a)
        first = a.run(IFACES)
        assert first.stdout.strip() == "['lo']", (first.stdout, first.stderr)
        assert "hr.csv" in first.stderr, first.stderr  # the notice names the cause
        run = a.run(probe)
        assert ROW not in run.stdout and "public notes" in run.stdout, (run.stdout, run.stderr)
        assert "rename refused" in run.stdout, run.stdout

        b.run("x = 1")  # its poll or this cell saw the folder's level
        assert b.run(IFACES).stdout.strip() == "['lo']"
        run = b.run(probe)
        assert ROW not in run.stdout and "rename refused" in run.stdout, (run.stdout, run.stderr)
        assert len(eval(c.run(IFACES).stdout)) > 1  # the sibling folder keeps its network

        # a host program saves the file atomically: B's hiding mount is gone
        fresh = ws / "data" / ".hr.csv.tmp"
        fresh.write_text(f"name,salary\n{ROW}\nbob,654321\n")
        os.replace(fresh, ws / "data" / "hr.csv")
        run = b.run(probe + IFACES)
        assert run.stdout.strip().endswith("['lo']"), (run.stdout, run.stderr)

        read = "import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read())"
        a.run(read)  # (private from its start: its sandbox may mount /private/hr already)
        run = a.run(read)
        assert run.status == "ok" and ROW in run.stdout, (run.stdout, run.stderr)
        assert a.run(IFACES).stdout.strip() == "['lo']"
    finally:
        for k in kernels:
            k.shutdown()


# ------------------------------------------------------------------ the policy


def test_configured_sources_are_recorded_and_hidden_in_any_workspace(tmp_path: Path, data_dir: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "data" / "deep").mkdir(parents=True)
    src = ws / "data" / "deep" / "hr.csv"
    src.write_text(ROW)
    Ratchet("u", "s", PrivacyStore(tmp_path / "store"), {"hr": {"source": str(src)}}, workspace=ws)
    assert registered_sources() == [src.resolve()]
    assert (registry_dir() / os.listdir(registry_dir())[0]).stat().st_mode & 0o077 == 0
    # another process's plan, configured with nothing, hides it all the same
    mounts, plan = apply_policy(ws, "/workspace")
    masks = _masks(plan)
    assert masks["data/deep/hr.csv"] == HIDE
    assert masks["data"] == PIN and masks["data/deep"] == PIN  # mount points: cannot be renamed away
    hide = [m for m in mounts if m.kind == "hide"]
    assert [m.target for m in hide] == ["/workspace/data/deep/hr.csv"]
    pins = [m for m in mounts if m.target in ("/workspace/data", "/workspace/data/deep")]
    assert [m.target for m in pins] == ["/workspace/data", "/workspace/data/deep"]
    assert all(not m.readonly and m.kind == "bind" for m in pins)  # the rest of the folder stays writable
    # mount order: each pin before what lies inside it
    targets = [m.target for m in mounts]
    assert targets.index("/workspace/data") < targets.index("/workspace/data/deep") < targets.index(hide[0].target)


def test_a_folder_source_and_a_symlinked_source_are_hidden(tmp_path: Path, data_dir: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "records").mkdir(parents=True)
    (ws / "records" / "a.csv").write_text(ROW)
    (ws / "real.csv").write_text(ROW)
    (ws / "link.csv").symlink_to("real.csv")
    mounts, plan = apply_policy(ws, "/workspace", private_sources=[ws / "records", ws / "link.csv"])
    masks = _masks(plan)
    assert masks == {"records": HIDE, "real.csv": HIDE}  # the link's target, which a sandbox would open
    assert all(m.kind == "hide" for m in mounts[1:])


def test_a_workspace_inside_or_equal_to_a_source_is_refused(tmp_path: Path, data_dir: Path) -> None:
    data = tmp_path / "dataset"
    (data / "nb").mkdir(parents=True)
    register(data)
    for ws in (data, data / "nb"):
        with pytest.raises(WorkspaceRefused, match="private dataset source"):
            apply_policy(ws, "/workspace")
    # even an allowed root's workspace (the agent tools' own) inside one
    places = ProtectedPlaces(allowed_roots=(data.resolve(),), private_sources=(data.resolve(),))
    with pytest.raises(WorkspaceRefused, match="private dataset source"):
        plan_workspace((data / "nb").resolve(), places)


def test_sources_elsewhere_gone_or_under_a_read_only_place_add_no_pin(tmp_path: Path, data_dir: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_text(ROW)
    gone = ws / "sub" / "gone.csv"
    register(elsewhere)
    register(gone)
    places = collect_protected_places(within=ws.resolve())
    assert places.private_sources == ()  # not in this workspace; a missing one hides nothing
    assert _masks(plan_workspace(ws.resolve(), places)) == {}
    assert not (ws / "sub").exists()  # and no mount point was made for it
    # a source inside a repository: the read-only .git holds, no writable pin inside it
    (ws / "repo" / ".git" / "objects").mkdir(parents=True)
    inside = ws / "repo" / ".git" / "objects" / "x.csv"
    inside.write_text(ROW)
    masks = _masks(
        plan_workspace(ws.resolve(), collect_protected_places(within=ws.resolve(), private_sources=[inside]))
    )
    assert masks["repo/.git"] == "readonly" and masks["repo/.git/objects/x.csv"] == HIDE
    assert "repo/.git/objects" not in masks and masks.get("repo") == PIN


def test_a_source_that_does_not_exist_is_still_a_configuration_error(tmp_path: Path, data_dir: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        Ratchet("u", "s", PrivacyStore(tmp_path / "store"), {"hr": {"source": str(tmp_path / "nope.csv")}})
    assert registered_sources() == []


def test_read_only_folders_mounted_elsewhere_hide_the_sources_inside(tmp_path: Path, data_dir: Path) -> None:
    """The agent tools' ``docker_read_only_mounts``: no workspace policy, but
    the same sources are hidden in them, and a folder inside one is refused."""
    shared = tmp_path / "team"
    (shared / "hr").mkdir(parents=True)
    register(shared / "hr")
    masks = hide_private_sources(shared, "/ref/")
    assert [(m.target, m.kind, m.readonly) for m in masks] == [("/ref/hr", "hide", True)]
    with pytest.raises(WorkspaceRefused, match="private dataset source"):
        hide_private_sources(shared / "hr", "/ref")
    assert hide_private_sources(tmp_path / "elsewhere", "/x") == []


def test_a_listed_source_makes_its_folders_private_even_without_its_level_records(
    tmp_path: Path, data_dir: Path
) -> None:
    """The folder-level records of a source may fail to be written (a full
    disk or inode table, an unusable store: attack review of this stop) where
    its entry in the host-wide list was written: the entry alone makes every
    session whose folder holds the source private, and a sibling stays public."""
    ws, sibling = tmp_path / "project", tmp_path / "sibling"
    (ws / "data").mkdir(parents=True)
    sibling.mkdir()
    (ws / "data" / "hr.csv").write_text(f"{ROW}\n")
    register(ws / "data" / "hr.csv")  # listed, and no level recorded anywhere
    store = PrivacyStore(data_dir / "privacy")
    state = Ratchet("alice", "nb1", store, workspace=ws).state
    assert state.has_private_data and "hr.csv" in (state.mark.reason if state.mark else ""), state
    assert not Ratchet("alice", "nb2", store, workspace=sibling).state.has_private_data
    inside = Ratchet("alice", "nb3", store, workspace=ws / "data" / "..")
    assert inside.state.has_private_data


def test_a_source_record_that_cannot_be_read_is_written_again(tmp_path: Path, data_dir: Path) -> None:
    """Recording a source whose level record fails closed (unreadable) must
    write it again, not take the failed read's SECRET for a record."""
    from sandbox_kernel.privacy import Sensitivity
    from sandbox_kernel.privacy.workspace_levels import EXACT, WorkspaceLevels, _key, folder_of

    source = tmp_path / "hr.csv"
    source.write_text(f"{ROW}\n")
    levels = WorkspaceLevels.beside(PrivacyStore(data_dir / "privacy"))
    levels.record(source, Sensitivity.CONFIDENTIAL, "first")
    record = levels.store.path_for(EXACT, _key(folder_of(source)))
    os.chmod(record, 0o600)
    record.write_bytes(b"{not json")
    assert levels.exact(source).error
    levels.record(source, Sensitivity.CONFIDENTIAL, "again")
    state = levels.exact(source)
    # written again (readable), keeping what the failed read answered (raise-only)
    assert state.error is None and state.sensitivity >= Sensitivity.CONFIDENTIAL, state


def test_a_source_in_a_folder_every_sandbox_mounts_is_refused_and_listed_ones_make_sessions_private(
    tmp_path: Path, data_dir: Path
) -> None:
    """Every sandbox mounts the Python installation, the system folders and a
    few /etc entries read-only, whatever its workspace (attack review of this
    stop, helper 56: a dataset shipped in a package of the venv was read by
    public sandboxes with eth0). Such a source, or one holding such a folder,
    is a configuration error naming the folder; one listed anyway (another
    process, an older version) makes every session private."""
    import sys

    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    for source, word in ((venv_file, "lies in"), (Path(sys.prefix).parent, "holds"), (Path("/usr/share"), "lies in")):
        with pytest.raises(ValueError, match=word) as refused:
            Ratchet("u", "s", PrivacyStore(tmp_path / "store"), {"hr": {"source": str(source)}})
        assert "every sandbox mounts" in str(refused.value), refused.value
    assert registered_sources() == []
    ws = tmp_path / "ws"
    ws.mkdir()
    assert not Ratchet("u", "s1", PrivacyStore(tmp_path / "store"), workspace=ws).state.has_private_data
    register(venv_file)  # listed by a process that did not refuse it
    state = Ratchet("u", "s2", PrivacyStore(tmp_path / "store"), workspace=ws).state
    assert state.has_private_data and "pyvenv.cfg" in (state.mark.reason if state.mark else ""), state
