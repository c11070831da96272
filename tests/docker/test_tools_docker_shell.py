"""``sandbox_execute`` with ``shell_backend="docker"`` against the real daemon.

The agent tools' registry builds the ``SandboxManager`` (``docker_manager()``)
with the offline test image (``ToolsConfig.docker_config``); REPL cells run on
bwrap, the default engine backend. Nothing is mocked. Network checks look at
interfaces (/sys/class/net), never send traffic.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kernel_helpers import require_bwrap, shell_output

from sandbox_kernel.docker import TEST_IMAGE, ContainerConfig, offline_config
from sandbox_kernel.docker.hardening import SANDBOX_NETWORK
from sandbox_kernel.privacy import PrivacyStore, PrivateData
from sandbox_kernel.privacy.modes import NetworkMode
from sandbox_kernel.tools import (
    SessionRegistry,
    ToolFatalError,
    ToolRetryError,
    ToolsConfig,
    repl_execute_cell,
    sandbox_execute,
)
from sandbox_kernel.tools.mcp_app import MCPServerApp

pytestmark = pytest.mark.asyncio

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _config(data_dir: Path, image: str, limits: dict[str, Any]) -> ToolsConfig:
    return ToolsConfig(
        backend="bwrap",
        shell_backend="docker",
        network="user",  # public shells get Docker's bridge ("proxied" is refused with a Docker shell)
        idle_timeout=600,
        data_dir=data_dir,
        docker_config=offline_config(image=image, **limits),
    )


@pytest_asyncio.fixture
async def registry(tmp_path: Path, test_image: str, test_limits: dict[str, Any]) -> AsyncIterator[SessionRegistry]:
    require_bwrap()
    reg = SessionRegistry(_config(tmp_path / "data", test_image, test_limits))
    try:
        yield reg
    finally:
        await reg.aclose()


def _cli(argv: list[str]) -> ToolsConfig:
    """The ToolsConfig ``sandbox-kernel mcp <argv>`` would serve with."""
    app = MCPServerApp()
    app.initialize(argv)
    return app.tools_config()


def _kw(reg: SessionRegistry, ids: tuple[str, str]) -> dict[str, Any]:
    return {"user_id": ids[0], "session_id": ids[1], "registry": reg}


def _processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (container processes are host processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def _wait_for(predicate: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


# ------------------------------------------------------------------ it runs in Docker


async def test_runs_in_a_container_exit_codes_come_back(registry: SessionRegistry, ids: tuple[str, str]) -> None:
    kw = _kw(registry, ids)
    r = await sandbox_execute(
        "test -f /.dockerenv && echo in-docker; tr '\\0' ' ' < /proc/1/cmdline; echo; "
        "cat /proc/sys/kernel/hostname; id -u; pwd",
        **kw,
    )
    lines = shell_output(r.text).splitlines()
    assert r.text.startswith("Exit code: 0\n"), r.text
    assert lines[0] == "in-docker", r.text
    assert "docker-init" in lines[1], r.text  # PID 1 is Docker's init, not bwrap
    assert lines[2] == "sandbox" and lines[3] != "0" and lines[4] == "/workspace", r.text

    r = await sandbox_execute("echo to-out; echo to-err >&2; exit 7", **kw)
    assert r.text == "Exit code: 7\nto-out\nto-err", r.text
    r = await sandbox_execute("false", **kw)
    assert r.text == "Exit code: 1", r.text


async def test_container_is_the_daemons_with_our_labels_and_the_cells_workspace(
    registry: SessionRegistry, ids: tuple[str, str], docker_client: Any, list_managed: Any, test_image: str
) -> None:
    user, session = ids
    kw = _kw(registry, ids)
    workspace = (await registry.get(user, session)).workspace
    marker = uuid.uuid4().hex
    task = asyncio.create_task(
        sandbox_execute(f"touch started-{marker}; sleep 3; echo done-{marker}", timeout=30, **kw)
    )
    try:
        await _wait_for(lambda: (workspace / f"started-{marker}").exists(), 30, "the command to start")
        running = list_managed(user=user, session=session)
        assert len(running) == 1, running
        info = docker_client.api.inspect_container(running[0]["Id"])
        labels = info["Config"]["Labels"]
        assert labels["sandbox_kernel.kind"] == "ephemeral"
        assert labels["sandbox_kernel.owner_pid"] == str(os.getpid())
        assert (
            labels["sandbox_kernel.network"] == NetworkMode.FULL.value
            and info["HostConfig"]["NetworkMode"] == SANDBOX_NETWORK
        )
        assert info["Config"]["Image"] == test_image  # ToolsConfig.docker_config reached the manager
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert Path(mounts["/workspace"]["Source"]) == workspace and mounts["/workspace"]["RW"] is True
        assert info["HostConfig"]["Memory"] == 128 * 1024**2  # the test limits, not the defaults
        r = await task
    finally:
        if not task.done():
            task.cancel()
    assert r.text == f"Exit code: 0\ndone-{marker}", r.text
    assert list_managed(user=user, session=session) == []  # ephemeral: removed after the command


# ------------------------------------------------------------------ shared workspace


async def test_shell_and_cells_use_the_same_host_directory(registry: SessionRegistry, ids: tuple[str, str]) -> None:
    user, session = ids
    kw = _kw(registry, ids)
    tool_session = await registry.get(user, session)
    assert registry.docker_manager().workspace_for(user, session) == tool_session.workspace
    marker = uuid.uuid4().hex
    r = await repl_execute_cell(
        f"import os\nos.makedirs('/workspace/sub', exist_ok=True)\nopen('/workspace/sub/from_cell.txt', 'w').write('{marker}')",
        **kw,
    )
    assert "COMPLETED" in r.text, r.text
    r = await sandbox_execute("cat sub/from_cell.txt; echo; cat /workspace/sub/from_cell.txt", **kw)
    assert r.text == f"Exit code: 0\n{marker}\n{marker}", r.text
    r = await sandbox_execute(f"echo shell-{marker} > /workspace/from_shell.txt", **kw)
    assert r.text == "Exit code: 0", r.text
    assert (tool_session.workspace / "from_shell.txt").read_text() == f"shell-{marker}\n"


async def test_files_go_both_ways_and_cells_keep_their_workspace(
    registry: SessionRegistry, ids: tuple[str, str]
) -> None:
    kw = _kw(registry, ids)
    marker = uuid.uuid4().hex
    r = await repl_execute_cell(f"open('/workspace/from_cell.txt', 'w').write('{marker}')", **kw)
    assert "COMPLETED" in r.text, r.text
    r = await sandbox_execute(f"cat from_cell.txt && echo shell-{marker} > from_shell.txt", **kw)
    assert r.text == f"Exit code: 0\n{marker}", r.text
    r = await repl_execute_cell("print(open('/workspace/from_shell.txt').read().strip())", **kw)
    assert f"shell-{marker}" in r.text and "COMPLETED" in r.text, r.text
    r = await repl_execute_cell(f"open('/workspace/after.txt', 'w').write('after-{marker}')", **kw)
    assert "COMPLETED" in r.text, r.text
    r = await sandbox_execute("cat after.txt", **kw)
    assert r.text == f"Exit code: 0\nafter-{marker}", r.text
    # each side writes into what the other created: folders and files
    r = await repl_execute_cell(
        "import os\nos.makedirs('/workspace/made_by_cell')\nopen('/workspace/shared.txt', 'w').write('cell ')", **kw
    )
    assert "COMPLETED" in r.text, r.text
    r = await sandbox_execute(
        "echo in > made_by_cell/by_shell.txt && echo -n shell >> shared.txt && mkdir made_by_shell", **kw
    )
    assert r.text == "Exit code: 0", r.text
    r = await repl_execute_cell(
        "open('/workspace/made_by_shell/by_cell.txt', 'w').write('x')\nopen('/workspace/shared.txt', 'a').write(' cell')\nprint(open('/workspace/shared.txt').read())",
        **kw,
    )
    assert "cell shell cell" in r.text and "COMPLETED" in r.text, r.text


@pytest.mark.skipif(not AS_ROOT, reason="the ACL is only needed (and set) when the tools run as root")
async def test_shared_workspace_opens_to_the_container_user_only(
    registry: SessionRegistry, ids: tuple[str, str]
) -> None:
    """As root the workspace is shared by an ACL naming exactly the container's
    uid and root; no group or other access appears."""
    import struct

    user, session = ids
    workspace = (await registry.get(user, session)).workspace
    assert (await sandbox_execute("id -u", **_kw(registry, ids))).text == "Exit code: 0\n65534"
    for name in ("system.posix_acl_access", "system.posix_acl_default"):
        blob = os.getxattr(workspace, name)
        entries = [struct.unpack_from("<HHI", blob, 4 + 8 * i) for i in range((len(blob) - 4) // 8)]
        named = sorted(ident for tag, _perm, ident in entries if tag == 0x02)
        assert named == [0, 65534], entries
        assert [perm for tag, perm, _ in entries if tag in (0x04, 0x20)] == [0, 0], entries  # group, other: nothing
    assert workspace.stat().st_uid == 0 and workspace.stat().st_mode & 0o007 == 0


async def test_persistent_shell_keeps_one_container_per_session(
    tmp_path: Path, test_image: str, test_limits: dict[str, Any], ids: tuple[str, str], list_managed: Any
) -> None:
    """``docker_persistent``: commands of a session share one container (its
    /tmp and processes survive between calls); closing the registry removes it."""
    require_bwrap()
    user, session = ids
    config = _config(tmp_path / "data", test_image, test_limits)
    config.docker_persistent = True
    reg = SessionRegistry(config)
    try:
        kw = _kw(reg, ids)
        r = await sandbox_execute(
            "hostname > /tmp/first && echo kept > /tmp/note && cat /proc/1/cmdline | tr '\\0' ' '", **kw
        )
        assert r.text.startswith("Exit code: 0"), r.text
        running = list_managed(user=user, session=session)
        assert len(running) == 1 and running[0]["Labels"]["sandbox_kernel.kind"] == "persistent", running
        r = await sandbox_execute("cat /tmp/note", **kw)
        assert r.text == "Exit code: 0\nkept", r.text
        assert [c["Id"] for c in list_managed(user=user, session=session)] == [running[0]["Id"]]
        # another session gets its own container and does not see this one's /tmp
        other = (user, session + "-b")
        r = await sandbox_execute("cat /tmp/note", **_kw(reg, other))
        assert r.text.startswith("Exit code: 1"), r.text
    finally:
        await reg.aclose()
    assert list_managed(user=user, session=session) == []
    assert list_managed(user=user, session=session + "-b") == []


# ------------------------------------------------------------------ timeout


async def test_timeout_returns_promptly_and_leaves_nothing(
    registry: SessionRegistry, ids: tuple[str, str], list_managed: Any
) -> None:
    user, session = ids
    kw = _kw(registry, ids)
    marker = uuid.uuid4().hex
    started = time.monotonic()
    r = await sandbox_execute(f"echo begun; sleep 30; echo never-{marker}", timeout=2, **kw)
    elapsed = time.monotonic() - started
    assert elapsed < 15, elapsed
    assert r.text.startswith("Exit code: 124\nbegun\n"), r.text
    assert "timed out after 2 s" in r.text and f"never-{marker}" not in r.text
    assert list_managed(user=user, session=session) == []
    assert _processes_with(marker) == []
    r = await sandbox_execute("echo still-serving", **kw)  # the session keeps working
    assert r.text == "Exit code: 0\nstill-serving", r.text


async def test_bad_timeout_is_a_retry_error(registry: SessionRegistry, ids: tuple[str, str], list_managed: Any) -> None:
    with pytest.raises(ToolRetryError, match="timeout must be between"):
        await sandbox_execute("echo x", timeout=0, **_kw(registry, ids))
    assert list_managed(user=ids[0]) == []


# ------------------------------------------------------------------ ratchet


async def _interfaces(reg: SessionRegistry, ids: tuple[str, str]) -> list[str]:
    r = await sandbox_execute("ls /sys/class/net", **_kw(reg, ids))
    assert r.text.startswith("Exit code: 0\n"), r.text
    return sorted(shell_output(r.text).split())


async def test_ratchet_from_a_cell_cuts_the_shell_network(registry: SessionRegistry, ids: tuple[str, str]) -> None:
    kw = _kw(registry, ids)
    assert "COMPLETED" in (await repl_execute_cell("x = 1", **kw)).text  # the cells' sandbox is up
    before = await _interfaces(registry, ids)
    assert "lo" in before and len(before) >= 2, before  # public: a bridge interface
    r = await repl_execute_cell("import sandbox_kernel.private as p\np.mark_private('CONFIDENTIAL', 'test')", **kw)
    assert r.text.startswith("[SYSTEM]"), r.text
    assert await _interfaces(registry, ids) == ["lo"]
    r = await repl_execute_cell("open('/workspace/after_private.txt', 'w').write('ok')", **kw)
    assert "COMPLETED" in r.text, r.text  # the network-less cells' sandbox still has its workspace


async def test_ratchet_from_the_host_store_cuts_the_shell_network_for_good(
    registry: SessionRegistry, ids: tuple[str, str], tmp_path: Path, test_image: str, test_limits: dict[str, Any]
) -> None:
    user, session = ids
    before = await _interfaces(registry, ids)
    assert "lo" in before and len(before) >= 2, before
    store = PrivacyStore(registry.config.root() / "privacy")
    PrivateData(user, session, store).mark_private("SECRET", reason="test")
    assert await _interfaces(registry, ids) == ["lo"]
    # a new registry (a new process: no manager memory) reads the same store
    # (once the first has let the session go: one process holds it at a time)
    await registry.aclose()
    fresh = SessionRegistry(_config(registry.config.root(), test_image, test_limits))
    try:
        assert await _interfaces(fresh, ids) == ["lo"]
    finally:
        await fresh.aclose()
    # another session of the same user keeps its network
    other = await _interfaces(registry, (user, session + "x"))
    assert len(other) >= 2, other


async def test_host_raise_with_wait_covers_a_persistent_shell_container(
    tmp_path: Path, test_image: str, test_limits: dict[str, Any], ids: tuple[str, str], list_managed: Any
) -> None:
    """A persistent shell container idles between commands, maybe with a
    background process; a connector's ``wait=True`` returns only once the
    daemon has disconnected it (no command needed)."""
    require_bwrap()
    user, session = ids
    config = _config(tmp_path / "data", test_image, test_limits)
    config.docker_persistent = True
    reg = SessionRegistry(config)
    try:
        kw = _kw(reg, ids)
        r = await sandbox_execute("(sleep 60 &) ; ls /sys/class/net", **kw)
        assert len(shell_output(r.text).split()) >= 2, r.text
        [container] = list_managed(user=user, session=session)
        await asyncio.sleep(0.6)  # the watcher has registered the container as a holder
        store = PrivacyStore(config.root() / "privacy")
        await asyncio.to_thread(
            PrivateData(user, session, store).add_private_dataset, "crm", "SECRET", "connector", True
        )
        import docker

        nets = docker.from_env().api.inspect_container(container["Id"])["NetworkSettings"]["Networks"]
        assert not [n for n in nets if n != "none"], nets
        assert await _interfaces(reg, ids) == ["lo"]
    finally:
        await reg.aclose()


# ------------------------------------------------------------------ Docker down


async def test_docker_unreachable_is_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-daemon" / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{missing}")
    reg = SessionRegistry(
        ToolsConfig(
            shell_backend="docker",
            network="none",
            idle_timeout=600,
            data_dir=tmp_path / "data",
            docker_config=offline_config(image=TEST_IMAGE),
        )
    )
    try:
        started = time.monotonic()
        with pytest.raises(ToolFatalError) as caught:
            await sandbox_execute("echo hi", user_id="alice", session_id="down", registry=reg)
        assert time.monotonic() - started < 30
    finally:
        await reg.aclose()
    text = str(caught.value)
    assert text.startswith("[FATAL]") and "Docker" in text, text
    assert not isinstance(caught.value, ToolRetryError)


# ------------------------------------------------------------------ cleanup


async def test_aclose_removes_the_container_of_a_cancelled_call(
    tmp_path: Path, test_image: str, test_limits: dict[str, Any], ids: tuple[str, str], list_managed: Any
) -> None:
    require_bwrap()
    user, session = ids
    reg = SessionRegistry(_config(tmp_path / "data", test_image, test_limits))
    marker = uuid.uuid4().hex
    task = None
    try:
        assert (await sandbox_execute("echo warm", **_kw(reg, ids))).text == "Exit code: 0\nwarm"
        assert list_managed(user=user, session=session) == []
        workspace = (await reg.get(user, session)).workspace
        task = asyncio.create_task(
            sandbox_execute(f"touch started-{marker}; sleep 60; echo {marker}", timeout=120, **_kw(reg, ids))
        )
        await _wait_for(lambda: (workspace / f"started-{marker}").exists(), 30, "the command to start")
        assert len(list_managed(user=user, session=session)) == 1
        assert _processes_with(marker)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        if task is not None and not task.done():
            task.cancel()
        started = time.monotonic()
        await reg.aclose()
    assert time.monotonic() - started < 30
    assert list_managed(user=user, session=session) == []
    await _wait_for(lambda: not _processes_with(marker), 15, "the container's processes to end")


# ------------------------------------------------------------------ configuration


async def test_default_docker_config_and_cli_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_DOCKER_IMAGE", raising=False)
    reg = SessionRegistry(ToolsConfig(shell_backend="docker", network="none", data_dir=tmp_path / "d1"))
    try:
        assert reg.docker_manager().config == ContainerConfig()  # None: ContainerConfig's defaults
        assert reg.docker_manager().workspace_root == tmp_path / "d1" / "workspaces"
    finally:
        await reg.aclose()
    reg = SessionRegistry(
        _cli(
            [
                "--shell-backend",
                "docker",
                "--MCPServerApp.network=full",
                "--docker-image",
                "example/shell:1",
                "--data-dir",
                str(tmp_path / "d2"),
            ]
        )
    )
    try:
        assert reg.config.shell_backend == "docker"
        assert reg.docker_manager().config.image == "example/shell:1"
    finally:
        await reg.aclose()
    assert _cli([]).docker_config is None
    with pytest.raises(ValueError, match="image"):
        _cli(["--docker-image", "has space"])
