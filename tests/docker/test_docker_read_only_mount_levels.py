"""The Docker shell's network follows the levels of every host folder it mounts.

A container mounts its session's workspace and the read-only mounts
(``ToolsConfig.docker_read_only_mounts``, ``ContainerConfig.read_only_mounts``).
A kernel whose workspace is one of those folders, or a folder inside one, may
write private rows there; the container must then have no network, its held
containers are cut by the watcher (and a raiser's ``wait=True`` waits for it),
and its own workspace rises too. The standalone manager with its default getter
also reads its workspace's folder level. Against the real daemon; network is
checked by the interfaces inside the container only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import iopub_until, iopub_until_idle, require_bwrap, shared_data_kernel, shell_output

from sandbox_kernel.docker import SandboxManager, offline_config
from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.engine.workspace_policy import WorkspaceRefused
from sandbox_kernel.privacy import NetworkMode, PrivacyStore, PrivateData, Sensitivity
from sandbox_kernel.privacy.enforcement import EnforcementRecord, wait_enforced
from sandbox_kernel.privacy.store import default_store
from sandbox_kernel.tools import SessionRegistry, ToolsConfig, sandbox_execute

LIST = "ls /sys/class/net"


def _standalone(
    tmp_path: Path,
    image: str,
    client: Any,
    limits: dict[str, Any],
    mounts: dict[str, str] | None = None,
    poll: float = 0,
) -> SandboxManager:
    """A manager with the default getter (the default store); a watcher
    every ``poll`` s (none by default)."""
    return SandboxManager(
        read_only_mounts=mounts,
        config=offline_config(image=image, **limits),
        workspace_root=tmp_path / "workspaces",
        client=client,
        privacy_poll_interval=poll,
    )


def _kernel_rises(folder: Path, level: Sensitivity, store: Path, session: str = "nbK") -> None:
    """What a kernel with ``folder`` as its workspace and its own store records
    when it turns private (its ratchet's read of its state)."""
    ratchet = Ratchet("kernel-user", session, PrivacyStore(store), workspace=folder)
    ratchet.mark(level.name, "test", "api")
    assert ratchet.state.sensitivity == level


@pytest.fixture
def shared_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    return data


def test_standalone_manager_reads_its_workspace_level(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """The default getter reads the session's own record only: a private
    kernel whose workspace is the session's folder must cut it all the same."""
    manager = _standalone(tmp_path, test_image, docker_client, test_limits)
    try:
        code, out = manager.execute_command("u", "s", LIST)
        assert code == 0 and "eth0" in out, out
        _kernel_rises(tmp_path / "workspaces" / "u" / "s", Sensitivity.CONFIDENTIAL, tmp_path / "kernel-store")
        code, out = manager.execute_command("u", "s", LIST)
        assert code == 0 and out.split() == ["lo"], out
    finally:
        manager.close_all()


@pytest.mark.parametrize("where", ["the mount", "inside the mount", "around the mount"])
def test_a_private_read_only_mount_cuts_and_raises_the_workspace(
    tmp_path: Path,
    shared_data: Path,
    test_image: str,
    docker_client: Any,
    test_limits: dict[str, Any],
    where: str,
) -> None:
    team = tmp_path / "team-data"
    (team / "sub").mkdir(parents=True)
    team.chmod(0o755)
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"})
    try:
        code, out = manager.execute_command("u", "s", LIST)
        assert code == 0 and "eth0" in out, out
        folder = {"the mount": team, "inside the mount": team / "sub", "around the mount": tmp_path}[where]
        _kernel_rises(folder, Sensitivity.SECRET, tmp_path / "kernel-store")
        code, out = manager.execute_command("u", "s2", f"ls /ref; {LIST}")
        assert code == 0 and out.split()[-1:] == ["lo"] and "eth0" not in out, out
        # the session's workspace holds what /ref gave it: it rose too, for
        # every sandbox sharing it (the tools' cells read its level)
        ratchet = Ratchet("u", "s2", PrivacyStore(tmp_path / "other"), workspace=tmp_path / "workspaces" / "u" / "s2")
        assert ratchet.state.sensitivity == Sensitivity.SECRET
    finally:
        manager.close_all()


def test_a_listed_dataset_source_in_a_read_only_mount_cuts_the_container(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """A private dataset's source listed host-wide (``dataset_registry``) in a
    folder the manager mounts read-only: its containers have no network, even
    where no folder-level record of the source could be written (the list
    entry alone is enough; engine/ratchet.py, sources_held)."""
    from sandbox_kernel.privacy.dataset_registry import register

    team = tmp_path / "team-data"
    team.mkdir()
    team.chmod(0o755)
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"})
    try:
        code, out = manager.execute_command("u", "s", LIST)
        assert code == 0 and "eth0" in out, out
        (team / "hr.csv").write_text("ada,123456\n")
        register(team / "hr.csv")
        code, out = manager.execute_command("u", "s2", LIST)
        assert code == 0 and out.split() == ["lo"], out
    finally:
        manager.close_all()


def _shared_folder(tmp_path: Path) -> Path:
    """``team-data``, writable by the kernel's cells and readable by the container's user."""
    team = tmp_path / "team-data"
    team.mkdir()
    team.chmod(0o777)
    tmp_path.chmod(0o755)
    return team


def test_a_docker_shells_workspace_rises_with_a_private_folder_inside(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """A container ties the folders inside its workspace together (a hard
    link, as in tests/test_reached_folders.py), so a later rise of one raises
    its siblings: it records its workspace as reached before it starts, as the
    kernel's sandboxes do. Before, only kernels recorded it, and a notebook
    in ``other`` kept its network while ``project``'s private rows reached it
    through the link a Docker shell left."""
    manager = _standalone(tmp_path, test_image, docker_client, test_limits)
    try:
        code, out = manager.execute_command(
            "u",
            "s",
            "mkdir project other && echo x > project/rows.csv && ln project/rows.csv other/rows.csv && echo ok",
        )
        assert code == 0 and out.strip() == "ok", out
    finally:
        manager.close_all()
    workspace = tmp_path / "workspaces" / "u" / "s"
    assert (workspace / "project" / "rows.csv").stat().st_ino == (workspace / "other" / "rows.csv").stat().st_ino
    other = Ratchet("kernel-user", "nbO", PrivacyStore(tmp_path / "other-store"), workspace=workspace / "other")
    other.prepare()
    assert other.network_allowed
    _kernel_rises(workspace / "project", Sensitivity.SECRET, tmp_path / "kernel-store")
    assert not other.network_allowed, "a sibling the container tied to the private folder kept its network"
    assert other.state.sensitivity == Sensitivity.SECRET


@pytest.mark.asyncio
async def test_tools_shell_mounting_a_private_kernels_folder(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """PoC: a kernel (its own privacy_dir) on ``team-data`` goes SECRET while
    the tools' Docker shell (another data dir) mounts ``team-data`` at /ref.
    A persistent container held with network is cut before the raiser's
    wait=True returns, and a new ephemeral one has no network."""
    require_bwrap()
    team = _shared_folder(tmp_path)
    kernel_store = tmp_path / "kernel-store"
    kernel = shared_data_kernel(
        team,
        tmp_path / "tk",
        shared_data,
        f"--SandboxKernel.privacy_dir={kernel_store}",
        "--SandboxKernel.user_id=alice",
        "--SandboxKernel.session_id=nbK",
    )
    config = ToolsConfig(
        backend="bwrap",
        shell_backend="docker",
        network="user",
        idle_timeout=600,
        data_dir=tmp_path / "tools-data",
        docker_read_only_mounts={str(team): "/ref"},
        docker_config=offline_config(image=test_image, **test_limits),
        docker_persistent=True,
    )
    registry = SessionRegistry(config)
    kw: dict[str, Any] = {"user_id": "agent", "session_id": "t1", "registry": registry}
    try:
        assert "eth0" in (await sandbox_execute(LIST, **kw)).text
        shell = registry.docker_manager().get_session("agent", "t1")
        assert shell is not None
        kernel.stdout_of("open('/workspace/patients.csv', 'w').write('id,dx\\n1,SECRET-ROW\\n')")
        await asyncio.to_thread(
            PrivateData("alice", "nbK", PrivacyStore(kernel_store)).add_private_dataset,
            "patients",
            "SECRET",
            wait=30,
        )
        # the held container, looked at without the manager (no command's mode check)
        names = docker_client.containers.get(shell.container_id).exec_run(LIST).output.decode().split()
        assert names == ["lo"], names
        config.docker_persistent = False
        out = (await sandbox_execute(f"cat /ref/patients.csv; {LIST}", **kw)).text
        assert shell_output(out).split()[-1:] == ["lo"] and "eth0" not in out, out
    finally:
        await registry.aclose()
        kernel.shutdown()


def _docker_kernel(tmp_path: Path, test_image: str, data: Path, mounted: Path, name: str) -> Any:
    """A Docker kernel whose default data dir is ``data``, with ``mounted``
    mounted read-only at /ref (``DockerSandbox.read_only_mounts``)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from kernel_helpers import SandboxKernelHandle
    from test_docker_kernel import docker_args

    (tmp_path / f"{name}-ws").mkdir()
    (tmp_path / f"{name}-tmp").mkdir()
    if os.geteuid() == 0:
        os.chown(tmp_path / f"{name}-ws", 65534, 65534)
    return SandboxKernelHandle(
        tmp_path / f"{name}-ws",
        tmp_path / f"{name}-tmp",
        extra_args=[
            *(a for a in docker_args(test_image) if not a.startswith("--DockerSandbox.read_only_mounts=")),
            f'--DockerSandbox.read_only_mounts={{"/usr": "/usr", "{mounted}": "/ref"}}',
            "--SandboxKernel.privacy_poll_interval=0.2",
        ],
        env={"SANDBOX_KERNEL_DATA_DIR": str(data)},
    )


IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def test_a_docker_kernels_read_only_mount_follows_the_folders_level(tmp_path: Path, test_image: str) -> None:
    """A Docker kernel's own read-only mounts (``DockerSandbox.read_only_mounts``)
    count like its workspace: a bwrap kernel whose workspace is the mounted
    folder goes private and writes rows there, and the Docker kernel loses its
    network."""
    require_bwrap()
    data, team = tmp_path / "data", tmp_path / "team"
    team.mkdir()
    owner = shared_data_kernel(team, tmp_path / "o-tmp", data)
    dock = _docker_kernel(tmp_path, test_image, data, team, "d")
    try:
        assert owner.run("x = 1").status == "ok"
        run = dock.run(IFACES)
        assert run.stdout.strip() not in ("", "['lo']"), (run.stdout, run.stderr, run.errors)
        owner.run("%private patients CONFIDENTIAL")
        assert owner.run("open('/workspace/patients.csv', 'w').write('1,SECRET-ROW')").status == "ok"
        for _ in range(50):
            if dock.run(IFACES).stdout.strip() == "['lo']":
                break
        else:
            raise AssertionError("the Docker kernel kept its network beside a private folder it mounts")
        assert "SECRET-ROW" in dock.run("print(open('/ref/patients.csv').read())").stdout
    finally:
        owner.shutdown()
        dock.shutdown()


LISTEN = """
import os, socket
path = '/workspace/drop.sock'
if os.path.exists(path):
    os.unlink(path)
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)
server.listen(1)
server.settimeout(120)
print('listening', flush=True)
try:
    conn, _ = server.accept()
    conn.settimeout(30)
    got = conn.recv(100).decode()
    print('received', got, sorted(n for _, n in socket.if_nameindex()))
except OSError as exc:
    print('nothing', type(exc).__name__)
"""


def test_a_socket_in_a_private_docker_kernels_read_only_mount_reaches_no_network(
    tmp_path: Path, test_image: str
) -> None:
    """An attack review: a read-only mount keeps a cell from writing, not from
    connecting to a unix socket. A public bwrap kernel with network working
    in ``team`` listened on a socket there; a Docker kernel mounting ``team``
    read-only at /ref turned private and sent the rows to it. Now the bwrap
    kernel rises with it (``WorkspaceLevels.rise_read``), and the private
    kernel's ``%private`` returns only after its network is cut: whatever
    reaches the socket reaches a sandbox without network."""
    require_bwrap()
    data, team = tmp_path / "data", _shared_folder(tmp_path)
    inside = shared_data_kernel(team, tmp_path / "i-tmp", data, "--SandboxKernel.privacy_poll_interval=0.2")
    dock = _docker_kernel(tmp_path, test_image, data, team, "d")
    try:
        assert dock.run(IFACES).stdout.strip() not in ("", "['lo']")
        assert inside.run(IFACES).stdout.strip() not in ("", "['lo']")
        listening = inside.kc.execute(LISTEN)
        iopub_until(inside.kc, lambda got: any("listening" in str(m["content"].get("text", "")) for m in got), 60)
        # (the cell that turns the session private is stopped there: it had network)
        dock.run("%private patients CONFIDENTIAL", timeout=90)
        assert dock.run(IFACES).stdout.strip() == "['lo']"
        sent = dock.run(
            "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect('/ref/drop.sock'); s.sendall(b'SECRET-ROW'); print('sent')\n"
            "except OSError as exc:\n    print('refused', exc)"
        )
        assert sent.status == "ok", (sent.stdout, sent.stderr, sent.errors)
        got = iopub_until_idle(inside.kc, listening, 150)
        said = "".join(m["content"].get("text", "") for m in got if m["msg_type"] == "stream")
        assert "eth0" not in said, f"the private rows reached a sandbox with network: {said!r} ({sent.stdout!r})"
        # it was told why (its sandbox was replaced by one without network)
        assert "mounts this folder" in said and "read-only" in said, said
        assert inside.run(IFACES).stdout.strip() == "['lo']"
    finally:
        inside.shutdown()
        dock.shutdown()


def test_a_socket_in_a_private_standalone_managers_read_only_mount_reaches_no_network(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """The same attack through the documented standalone API (a review): a
    session made private with ``add_private_dataset`` already reads NONE
    from the default getter, so the manager never asked the folders, and
    recorded no read of its mount. The public kernel listening in ``team``
    kept its network and received the rows its container sent. Now the
    session's own level records the mounts, and its container starts once
    the kernel reports its cut."""
    require_bwrap()
    team = _shared_folder(tmp_path)
    inside = shared_data_kernel(team, tmp_path / "i-tmp", shared_data, "--SandboxKernel.privacy_poll_interval=0.2")
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"})
    try:
        assert inside.run(IFACES).stdout.strip() not in ("", "['lo']")
        PrivateData("u", "s").add_private_dataset("patients", "SECRET", wait=10)
        rows = manager.workspace_for("u", "s") / "rows.csv"
        rows.write_text("1,SECRET-ROW")
        rows.chmod(0o644)
        listening = inside.kc.execute(LISTEN)
        iopub_until(inside.kc, lambda got: any("listening" in str(m["content"].get("text", "")) for m in got), 60)
        code, out = manager.execute_command(
            "u",
            "s",
            "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/ref/drop.sock'); "
            "s.sendall(open('/workspace/rows.csv', 'rb').read()); print('sent')\"; " + LIST,
        )
        assert out.split()[-1:] == ["lo"] and "eth0" not in out, out  # (the container itself has none)
        got = iopub_until_idle(inside.kc, listening, 150)
        said = "".join(m["content"].get("text", "") for m in got if m["msg_type"] == "stream")
        assert "eth0" not in said, f"the private rows reached a sandbox with network: {said!r} ({out!r})"
        assert inside.run(IFACES).stdout.strip() == "['lo']"
    finally:
        manager.close_all()
        inside.shutdown()


def test_a_raisers_wait_covers_the_mounts_of_a_container_cut_since(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """A review of the fix above: a container held with network while public
    was cut by the watcher, and its record, the only one naming the
    session's mounts, went with the cut; a raiser's ``wait=True`` then
    returned while a kernel working in the mount still had network (the rows
    reached it). Now the record stays, reporting the level without network,
    while the container is held; and its next command, after a rise without
    a wait, starts only once that kernel reports its cut."""
    team = _shared_folder(tmp_path)
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"}, poll=0.25)
    # a public kernel working in the mount (its own store) that has not polled yet
    kernel = EnforcementRecord(tmp_path / "kernel-store", "kernel-user", "nbK", workspace=team)
    kernel.report(Sensitivity.PUBLIC, True)
    try:
        code, out = manager.execute_command("u", "s", LIST, persistent=True)
        assert code == 0 and "eth0" in out, out
        with pytest.raises(TimeoutError, match="nbK"):
            PrivateData("u", "s").add_private_dataset("patients", "CONFIDENTIAL", wait=3)
        held = manager.get_session("u", "s")
        assert held is not None and held.network_mode is NetworkMode.NONE  # (the watcher cut it)
        # a second rise, no wait: the next command waits for the kernel's cut
        PrivateData("u", "s").add_private_dataset("payroll", "SECRET")
        cut_at: list[float] = []

        def cut_later() -> None:
            time.sleep(1.0)
            cut_at.append(time.time())
            kernel.report(Sensitivity.SECRET, False)

        threading.Thread(target=cut_later, daemon=True).start()
        code, out = manager.execute_command("u", "s", f"date +%s.%N; {LIST}", persistent=True)
        assert code == 0 and out.split()[-1:] == ["lo"], out
        assert cut_at and float(out.split()[0]) >= cut_at[0], (out, cut_at)
        wait_enforced(default_store().root, "u", "s", Sensitivity.SECRET, timeout=5)
    finally:
        kernel.close()
        manager.close_all()


def test_a_later_rise_does_not_wait_on_a_container_already_without_network(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """The record a held container keeps once cut says no network at every
    level: a higher rise later, once the watcher has stopped, returns at once
    (it said the level of the first rise, and the second one timed out)."""
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, poll=0.25)
    try:
        code, out = manager.execute_command("u", "s", LIST, persistent=True)
        assert code == 0 and "eth0" in out, out
        PrivateData("u", "s").add_private_dataset("patients", "CONFIDENTIAL", wait=10)
        held = manager.get_session("u", "s")
        assert held is not None and held.network_mode is NetworkMode.NONE
        PrivateData("u", "s").add_private_dataset("payroll", "SECRET", wait=5)  # (no TimeoutError)
        assert manager.execute_command("u", "s", LIST, persistent=True)[1].split() == ["lo"]
    finally:
        manager.close_all()


def test_a_folder_record_that_failed_runs_no_command_until_it_is_written(
    tmp_path: Path,
    shared_data: Path,
    test_image: str,
    docker_client: Any,
    test_limits: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review: a record of the mounts that failed (a read-only store) was
    taken as written, and after the wait the command ran anyway; a kernel
    with network working in the mount received the rows. Now no command of a
    private session runs until its folders are recorded. (The store's
    failure is simulated: the manager's answer to it is what is tested.)"""
    from sandbox_kernel.engine.workspace_policy import WorkspaceRefused
    from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

    team = _shared_folder(tmp_path)
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"})
    try:
        PrivateData("u", "s").add_private_dataset("patients", "SECRET", wait=10)

        def read_only(*args: object, **kwargs: object) -> None:
            raise OSError(30, "Read-only file system")

        with monkeypatch.context() as failing:
            failing.setattr(WorkspaceLevels, "record_read", read_only)
            with pytest.raises(WorkspaceRefused, match="could not be recorded"):
                manager.execute_command("u", "s", "true")
            with pytest.raises(WorkspaceRefused, match="could not be recorded"):
                manager.execute_command("u", "s", "true", persistent=True)
        code, out = manager.execute_command("u", "s", LIST)  # the store works again
        assert code == 0 and out.split() == ["lo"], out
        reader = Ratchet("kernel-user", "nbT", PrivacyStore(tmp_path / "k"), workspace=team)
        assert reader.state.sensitivity == Sensitivity.SECRET  # (a session working in the mount rises)
    finally:
        manager.close_all()


def test_the_first_command_of_a_private_session_does_not_wait_on_itself(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """A review: a manager that had not seen the session private counted its
    own container, being made, as a holder with network, and waited the
    whole HOLDERS_WAIT on it (now that a wait that ends with a holder still
    networked refuses the command, it would not run at all)."""
    team = _shared_folder(tmp_path)
    PrivateData("u", "s").add_private_dataset("patients", "SECRET")
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"})
    try:
        for persistent in (False, True):
            code, out = manager.execute_command("u", "s", LIST, persistent=persistent)
            assert code == 0 and out.split() == ["lo"], out
    finally:
        manager.close_all()


def test_a_higher_rise_is_seen_by_a_sandbox_cut_at_the_first(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """A review: once a kernel working in the mount was cut at CONFIDENTIAL, a
    rise to SECRET waited on it (it had not seen SECRET) and timed out:
    nothing recorded the mount at SECRET, the watcher had stopped with the
    last network. The watcher now goes on while a cut container of a private
    session is held, and records its folders at each new level."""
    require_bwrap()
    team = _shared_folder(tmp_path)
    inside = shared_data_kernel(team, tmp_path / "i-tmp", shared_data, "--SandboxKernel.privacy_poll_interval=0.2")
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"}, poll=0.25)
    try:
        assert inside.run(IFACES).stdout.strip() not in ("", "['lo']")
        code, out = manager.execute_command("u", "s", LIST, persistent=True)
        assert code == 0 and "eth0" in out, out
        PrivateData("u", "s").add_private_dataset("patients", "CONFIDENTIAL", wait=30)
        assert inside.run(IFACES).stdout.strip() == "['lo']"
        PrivateData("u", "s").add_private_dataset("payroll", "SECRET", wait=15)  # (no TimeoutError)
        reader = Ratchet("kernel-user", "nbT", PrivacyStore(tmp_path / "k"), workspace=team)
        assert reader.state.sensitivity == Sensitivity.SECRET
    finally:
        manager.close_all()
        inside.shutdown()


SEND = (
    "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/ref/drop.sock'); "
    "s.sendall(open('/workspace/rows.csv', 'rb').read()); print('sent')\"; " + LIST
)


def _listening(inside: Any) -> str:
    listening = inside.kc.execute(LISTEN)
    iopub_until(inside.kc, lambda got: any("listening" in str(m["content"].get("text", "")) for m in got), 60)
    return listening


def _heard(inside: Any, listening: str, team: Path) -> str:
    """What the kernel in the mount received (the host ends its wait with a
    word of its own when nothing else came)."""
    import socket

    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as knock:
        knock.connect(str(team / "drop.sock"))
        knock.sendall(b"NOTHING")
    got = iopub_until_idle(inside.kc, listening, 150)
    return "".join(m["content"].get("text", "") for m in got if m["msg_type"] == "stream")


def _rise_and_hand_over(manager: SandboxManager) -> None:
    PrivateData("u", "s").add_private_dataset("patients", "SECRET")  # (no wait: the documented default)
    rows = manager.workspace_for("u", "s") / "rows.csv"
    rows.write_text("1,SECRET-ROW")
    rows.chmod(0o644)


def _cut(session: Any) -> None:
    deadline = time.monotonic() + 5
    while session.network_mode is not NetworkMode.NONE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.network_mode is NetworkMode.NONE, "the watcher did not cut the held container"


@pytest.mark.parametrize("how", ["ephemeral", "persistent", "retry"])
def test_a_held_containers_next_command_waits_for_the_mounts_holders(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any], how: str
) -> None:
    """Review 102 (high): a held container cut at a rise ran its next command
    through ``run_in_session`` at once (ephemeral or persistent), and after a
    refused wait the retry ran without one; a kernel with network in the
    mount (slow to poll) received the rows. Now the command is refused while
    it has network, the retry too."""
    require_bwrap()
    team = _shared_folder(tmp_path)
    inside = shared_data_kernel(team, tmp_path / "i-tmp", shared_data, "--SandboxKernel.privacy_poll_interval=120")
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"}, poll=0.25)
    try:
        assert inside.run(IFACES).stdout.strip() not in ("", "['lo']")
        listening = _listening(inside)
        with contextlib.ExitStack() as held:
            if how == "ephemeral":
                session = held.enter_context(manager.ephemeral_session("u", "s"))
            else:
                session = manager.get_or_create_session("u", "s")
            assert "eth0" in manager.run_in_session(session, LIST)[1]
            _rise_and_hand_over(manager)
            _cut(session)
            with pytest.raises(WorkspaceRefused, match="still had network"):
                manager.run_in_session(session, "true" if how == "retry" else SEND)
            if how == "retry":
                with pytest.raises(WorkspaceRefused, match="still had network"):
                    manager.execute_command("u", "s", SEND, persistent=True)
        said = _heard(inside, listening, team)
        assert "SECRET-ROW" not in said and "NOTHING" in said, said
    finally:
        manager.close_all()
        inside.shutdown()


def test_a_held_containers_failed_record_runs_no_command(
    tmp_path: Path,
    shared_data: Path,
    test_image: str,
    docker_client: Any,
    test_limits: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 102 (high): the record of the mounts failed for a container held
    since the session was public, the record was forgotten, and its next
    command ran (the mount never recorded: the kernel there kept its network
    and received the rows)."""
    from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

    require_bwrap()
    team = _shared_folder(tmp_path)
    inside = shared_data_kernel(team, tmp_path / "i-tmp", shared_data, "--SandboxKernel.privacy_poll_interval=0.2")
    manager = _standalone(tmp_path, test_image, docker_client, test_limits, mounts={str(team): "/ref"}, poll=0.25)
    try:
        assert inside.run(IFACES).stdout.strip() not in ("", "['lo']")
        listening = _listening(inside)
        assert "eth0" in manager.execute_command("u", "s", LIST, persistent=True)[1]

        def read_only(*args: object, **kwargs: object) -> None:
            raise OSError(30, "Read-only file system")

        with monkeypatch.context() as failing:
            failing.setattr(WorkspaceLevels, "record_read", read_only)
            _rise_and_hand_over(manager)
            held = manager.get_session("u", "s")
            assert held is not None
            _cut(held)
            with pytest.raises(WorkspaceRefused, match="could not be recorded"):
                manager.execute_command("u", "s", SEND, persistent=True)
        said = _heard(inside, listening, team)
        assert "SECRET-ROW" not in said and "NOTHING" in said, said
    finally:
        manager.close_all()
        inside.shutdown()


def test_a_higher_rise_of_a_session_private_by_its_folders_is_followed(
    tmp_path: Path, shared_data: Path, test_image: str, docker_client: Any, test_limits: dict[str, Any]
) -> None:
    """Review 102 (availability): a session private only through a mount
    (``ref1``, where a kernel of another store rose) had its folders recorded
    at the first level only; a higher rise of ``ref1`` was not followed, the
    kernel working in ``ref2`` never saw it, and the raiser's wait timed out."""
    require_bwrap()
    tmp_path.chmod(0o755)
    ref1, ref2 = tmp_path / "ref1", tmp_path / "ref2"
    for ref in (ref1, ref2):
        ref.mkdir()
        ref.chmod(0o777)
    k2 = shared_data_kernel(ref2, tmp_path / "k2-tmp", shared_data, "--SandboxKernel.privacy_poll_interval=0.2")
    manager = _standalone(
        tmp_path, test_image, docker_client, test_limits, mounts={str(ref1): "/ref1", str(ref2): "/ref2"}, poll=0.25
    )
    store = tmp_path / "k1-store"
    k1 = Ratchet("kernel-user", "nbK", PrivacyStore(store), workspace=ref1)
    k1_holder = EnforcementRecord(store, "kernel-user", "nbK", workspace=ref1)  # (that kernel's own report)
    k1_holder.report(Sensitivity.PUBLIC, False)
    try:
        assert k2.run(IFACES).stdout.strip() not in ("", "['lo']")
        assert "eth0" in manager.execute_command("u", "s", LIST, persistent=True)[1]
        for level in (Sensitivity.CONFIDENTIAL, Sensitivity.SECRET):
            k1.mark(level.name, "test", "api")
            assert k1.state.sensitivity == level
            k1_holder.report(level, False)
            wait_enforced(store, "kernel-user", "nbK", level, timeout=30)  # (no TimeoutError)
        assert k2.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k1_holder.close()
        manager.close_all()
        k2.shutdown()


def test_a_docker_kernel_mounting_a_private_datasets_source_has_no_network(tmp_path: Path, test_image: str) -> None:
    """A private dataset's source inside a Docker kernel's read-only mount is
    hidden there, and since a host program replacing the file would un-hide
    it, the folder holds private data: the Docker kernel has no network from
    its first cell (engine/ratchet.py, record_source)."""
    require_bwrap()
    data, team = tmp_path / "data", tmp_path / "team"
    (team / "data").mkdir(parents=True)
    (team / "data" / "hr.csv").write_text("ada,123456\n")
    owner = shared_data_kernel(
        team, tmp_path / "o-tmp", data, f"--SandboxKernel.private_datasets=hr={team}/data/hr.csv"
    )
    dock = None
    try:
        assert owner.run("x = 1").status == "ok"  # (its sources are recorded)
        dock = _docker_kernel(tmp_path, test_image, data, team, "d")
        run = dock.run(IFACES + "\nimport os\nprint(os.listdir('/ref/data'), repr(open('/ref/data/hr.csv').read()))")
        lines = run.stdout.splitlines()
        assert lines and lines[0] == "['lo']" and "123456" not in run.stdout, (run.stdout, run.stderr, run.errors)
    finally:
        owner.shutdown()
        if dock is not None:
            dock.shutdown()
