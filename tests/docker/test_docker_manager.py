"""SandboxManager against a real Docker daemon (offline image, host /usr read-only).

Network checks look at interfaces (/sys/class/net), never send traffic.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_refusals import DaemonGoneAway, DaemonRefusingDisconnect

import docker
from sandbox_kernel.docker import TIMEOUT_EXIT_CODE, SandboxManager
from sandbox_kernel.docker.hardening import SANDBOX_NETWORK
from sandbox_kernel.docker.names import LABEL_OWNER_PID, LABEL_OWNER_START, container_labels, container_name
from sandbox_kernel.privacy.modes import NetworkMode


def _inspect(client: Any, container_id: str) -> dict[str, Any]:
    return client.api.inspect_container(container_id)


def _gone(client: Any, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False


def _without_watcher(make_manager: Any, **manager_kwargs: Any) -> SandboxManager:
    """A manager whose own watcher is off: the tests using it flip the mode and
    look at what the next command (or an explicit enforce_network) does, which
    the watcher's cut, 0.25 s later at most, would otherwise race."""
    manager: SandboxManager = make_manager(manager_kwargs={"privacy_poll_interval": 0, **manager_kwargs})
    return manager


def _interfaces(manager: SandboxManager, ids: tuple[str, str], persistent: bool) -> list[str]:
    code, out = manager.execute_command(*ids, "ls /sys/class/net", persistent=persistent)
    assert code == 0, out
    return sorted(out.split())


# ----------------------------------------------------------------- hardening


def test_inspect_shows_hardening(manager: SandboxManager, docker_client: Any, ids: tuple[str, str]) -> None:
    session = manager.get_or_create_session(*ids)
    info = _inspect(docker_client, session.container_id)
    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"] or host["CapDrop"] == ["all"]
    assert not host.get("CapAdd")
    assert host["ReadonlyRootfs"] is True
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 64
    assert host["Memory"] == 128 * 1024**2 and host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Init"] is True
    assert host["IpcMode"] == "private"
    assert host["Privileged"] is False
    assert host["NetworkMode"] == SANDBOX_NETWORK  # not Docker's default bridge: no container reaches another
    assert "/tmp" in host["Tmpfs"] and "size=" in host["Tmpfs"]["/tmp"]
    user = info["Config"]["User"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/workspace"]["RW"] is True and mounts["/usr"]["RW"] is False
    assert not any("docker.sock" in m["Source"] or m["Source"].startswith(("/run", "/var/run")) for m in info["Mounts"])
    labels = info["Config"]["Labels"]
    assert labels["sandbox_kernel.managed"] == "1"
    assert (labels["sandbox_kernel.user"], labels["sandbox_kernel.session"]) == ids
    assert labels["sandbox_kernel.owner_pid"] == str(os.getpid())
    assert info["Name"].lstrip("/") == f"{manager.prefix}-{ids[0]}-{ids[1]}"


def test_inside_no_capabilities_no_new_privs(manager: SandboxManager, ids: tuple[str, str]) -> None:
    code, out = manager.execute_command(
        *ids,
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status; id -u; "
        "touch /rootfs-write 2>&1; echo ok > /tmp/t && cat /tmp/t; echo ws > /workspace/w && cat /workspace/w",
    )
    assert code == 0, out
    fields = dict(line.split(":\t") for line in out.splitlines() if ":\t" in line)
    assert fields["CapEff"] == "0000000000000000"
    assert fields["CapPrm"] == "0000000000000000"
    assert fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"
    assert "\n0\n" not in f"\n{out}"  # not uid 0
    assert "Read-only file system" in out
    assert "ok\n" in out and "ws\n" in out


def test_workspace_owned_by_sandbox_user(manager: SandboxManager, ids: tuple[str, str]) -> None:
    code, out = manager.execute_command(*ids, "echo data > /workspace/made-inside.txt; id -u; id -g")
    assert code == 0, out
    uid, gid = (int(x) for x in out.split())
    path = manager.workspace_for(*ids) / "made-inside.txt"
    assert path.read_text() == "data\n"
    assert (path.stat().st_uid, path.stat().st_gid) == (uid, gid)
    assert uid != 0


def test_memory_limit_oom_kills(make_manager: Any, ids: tuple[str, str]) -> None:
    manager = make_manager(memory_limit="64m")
    started = time.monotonic()
    code, out = manager.execute_command(
        *ids, "python3 -c \"b = b'x' * (400 * 1024 * 1024); print('survived', len(b))\""
    )
    assert code == 137, out
    assert "survived" not in out
    assert time.monotonic() - started < 30


def test_pids_limit_holds(make_manager: Any, ids: tuple[str, str]) -> None:
    manager = make_manager(pids_limit=32)
    script = (
        "import os, time\n"
        "kids, err = [], None\n"
        "for _ in range(64):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        err = exc; break\n"
        "    if pid == 0:\n"
        "        time.sleep(10); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print(len(kids), type(err).__name__)\n"
        "for k in kids: os.kill(k, 9)\n"
        "for k in kids: os.waitpid(k, 0)\n"
    )
    code, out = manager.execute_command(
        *ids, f"cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; python3 -c '{script}'"
    )
    assert code == 0, out
    lines = out.split("\n")
    assert lines[0].strip() == "32"
    spawned, error = lines[1].split()
    assert int(spawned) < 32 and error == "BlockingIOError", out


# ----------------------------------------------------------------- lifecycle


def test_ephemeral_leaves_no_container(manager: SandboxManager, ids: tuple[str, str], list_managed: Any) -> None:
    user, session = ids
    assert list_managed(user=user) == []
    code, out = manager.execute_command(user, session, "echo hello; echo oops >&2; exit 3")
    assert (code, out) == (3, "hello\noops\n")
    assert list_managed(user=user) == []
    # The context manager removes its container even when the body raises.
    with pytest.raises(RuntimeError, match="boom"), manager.ephemeral_session(user, session) as eph:
        assert eph.ephemeral and len(list_managed(user=user, kind="ephemeral")) == 1
        assert eph.container_name.startswith(f"{manager.prefix}-{user}-{session}-")
        assert manager.run_in_session(eph, "echo in-session") == (0, "in-session\n")
        raise RuntimeError("boom")
    assert list_managed(user=user) == []


def test_persistent_reused_then_closed(
    manager: SandboxManager, docker_client: Any, ids: tuple[str, str], list_managed: Any
) -> None:
    user, session = ids
    assert manager.execute_command(user, session, "echo kept > /tmp/state", persistent=True)[0] == 0
    first = manager.get_session(user, session)
    assert first is not None
    code, out = manager.execute_command(user, session, "cat /tmp/state", persistent=True)
    assert (code, out) == (0, "kept\n")
    assert manager.get_or_create_session(user, session).container_id == first.container_id
    assert len(list_managed(user=user)) == 1
    assert first.last_active_at >= first.created_at
    assert manager.close_session(user, session) is True
    assert _gone(docker_client, first.container_id)
    assert manager.close_session(user, session) is False
    assert list_managed(user=user) == []


def test_ratchet_recreates_without_network(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any
) -> None:
    manager = _without_watcher(make_manager)
    user, session = ids
    assert "eth0" in _interfaces(manager, ids, persistent=True)  # FULL: a bridge interface
    old = manager.get_session(user, session)
    assert old is not None
    assert manager.execute_command(user, session, "echo private > /workspace/data.txt", persistent=True)[0] == 0

    mode_switch.mode = NetworkMode.NONE
    assert _interfaces(manager, ids, persistent=True) == ["lo"]
    new = manager.get_session(user, session)
    assert new is not None and new.container_id != old.container_id
    assert new.network_mode is NetworkMode.NONE
    assert _gone(docker_client, old.container_id)
    assert _inspect(docker_client, new.container_id)["HostConfig"]["NetworkMode"] == "none"
    assert manager.execute_command(user, session, "cat /workspace/data.txt", persistent=True) == (0, "private\n")

    # The getter going back to FULL changes nothing: the ratchet only goes up.
    mode_switch.mode = NetworkMode.FULL
    assert _interfaces(manager, ids, persistent=True) == ["lo"]
    assert manager.get_session(user, session).container_id == new.container_id
    assert _interfaces(manager, ids, persistent=False) == ["lo"]
    # ... even after the persistent container is closed.
    manager.close_session(user, session)
    assert _interfaces(manager, ids, persistent=True) == ["lo"]


def test_ephemeral_and_proxied_get_no_network(manager: SandboxManager, ids: tuple[str, str], mode_switch: Any) -> None:
    mode_switch.mode = NetworkMode.PROXIED
    assert _interfaces(manager, ids, persistent=False) == ["lo"]
    assert mode_switch.calls and mode_switch.calls[-1] == ids


def test_held_ephemeral_session_refused_after_ratchet(
    make_manager: Any, ids: tuple[str, str], mode_switch: Any, list_managed: Any
) -> None:
    from sandbox_kernel.docker import NetworkModeChanged

    manager = _without_watcher(make_manager)
    with manager.ephemeral_session(*ids) as session:
        assert manager.run_in_session(session, "ls /sys/class/net")[1].split() == ["eth0", "lo"]
        mode_switch.mode = NetworkMode.NONE
        with pytest.raises(NetworkModeChanged, match="NONE"):
            manager.run_in_session(session, "echo leak")
    assert list_managed(user=ids[0]) == []


def test_config_network_none(make_manager: Any, ids: tuple[str, str]) -> None:
    manager = make_manager(network_mode=NetworkMode.NONE)
    assert _interfaces(manager, ids, persistent=False) == ["lo"]


def test_read_only_skill_mount(make_manager: Any, tmp_path: Path, ids: tuple[str, str]) -> None:
    scripts = tmp_path / "skills" / "demo" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "hello.sh").write_text("echo hello from skill\n")
    manager = make_manager(read_only_mounts={str(scripts): "/skills/demo/scripts"})
    code, out = manager.execute_command(*ids, "bash /skills/demo/scripts/hello.sh")
    assert (code, out) == (0, "hello from skill\n")
    code, out = manager.execute_command(*ids, "echo evil > /skills/demo/scripts/hello.sh")
    assert code != 0 and "Read-only file system" in out, out
    code, out = manager.execute_command(*ids, "touch /skills/demo/scripts/new")
    assert code != 0 and "Read-only file system" in out, out
    assert (scripts / "hello.sh").read_text() == "echo hello from skill\n"
    assert sorted(p.name for p in scripts.iterdir()) == ["hello.sh"]


def test_timeout_kills_command(manager: SandboxManager, docker_client: Any, ids: tuple[str, str]) -> None:
    user, session = ids
    started = time.monotonic()
    code, out = manager.execute_command(user, session, "echo before; sleep 31 & sleep 30", timeout=2, persistent=True)
    elapsed = time.monotonic() - started
    assert code == TIMEOUT_EXIT_CODE, out
    assert "before" in out and "timed out after 2 s" in out
    assert elapsed < 10
    session_obj = manager.get_session(user, session)
    assert session_obj is not None
    commands = [p[-1] for p in docker_client.api.top(session_obj.container_id)["Processes"]]
    assert not any("sleep 30" in c or "sleep 31" in c for c in commands), commands
    # The session keeps serving.
    assert manager.execute_command(user, session, "echo still here", persistent=True) == (0, "still here\n")
    # Ephemeral timeouts too, and leave nothing behind.
    started = time.monotonic()
    code, out = manager.execute_command(user, session, "sleep 30", timeout=1)
    assert code == TIMEOUT_EXIT_CODE and time.monotonic() - started < 10


def test_watchdog_kills_escaped_process(make_manager: Any, docker_client: Any, ids: tuple[str, str]) -> None:
    """A process outside the command's process group keeps the output open: the
    host kills the container after the grace period."""
    manager = make_manager(manager_kwargs={"kill_grace": 1.0})
    user, session = ids
    assert manager.execute_command(user, session, "true", persistent=True)[0] == 0
    old = manager.get_session(user, session)
    started = time.monotonic()
    code, out = manager.execute_command(user, session, "setsid sleep 60; echo done", timeout=1, persistent=True)
    assert code == TIMEOUT_EXIT_CODE and "container was killed" in out, out
    assert time.monotonic() - started < 10
    assert _gone(docker_client, old.container_id)
    assert manager.execute_command(user, session, "echo again", persistent=True) == (0, "again\n")


def test_container_killed_from_outside_is_replaced(
    manager: SandboxManager, docker_client: Any, ids: tuple[str, str]
) -> None:
    user, session = ids
    assert manager.execute_command(user, session, "echo x > /workspace/keep", persistent=True)[0] == 0
    old = manager.get_session(user, session)
    docker_client.api.kill(old.container_id)
    assert manager.execute_command(user, session, "cat /workspace/keep", persistent=True) == (0, "x\n")
    assert manager.get_session(user, session).container_id != old.container_id
    assert _gone(docker_client, old.container_id)


# ------------------------------------------------------------ one name, one pair


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _foreign_container(client: Any, image: str, name: str, user: str, session: str) -> str:
    """A created (not started) container at ``name``, labelled as the
    persistent container of ``user``/``session`` whose owner died."""
    labels = container_labels(user, session, kind="persistent", network="none")
    labels[LABEL_OWNER_PID] = str(_dead_pid())
    labels[LABEL_OWNER_START] = ""
    container = client.containers.create(image, command=["sleep", "infinity"], name=name, labels=labels)
    return str(container.id)


def test_hyphenated_ids_of_two_users_get_their_own_containers(make_manager: Any, ids: tuple[str, str]) -> None:
    """'alice-x'/'s' and 'alice'/'x-s' once had one container name: the second
    user's session was refused while the first one's container lived."""
    manager = make_manager(network_mode=NetworkMode.NONE)
    user, session = ids
    first, second = (f"{user}-x", session), (user, f"x-{session}")
    for pair in (first, second):
        assert manager.execute_command(*pair, f"echo {pair[0]}/{pair[1]} > /tmp/who", persistent=True)[0] == 0
    held = [manager.get_session(*pair) for pair in (first, second)]
    assert held[0].container_id != held[1].container_id
    assert held[0].container_name != held[1].container_name
    for pair in (first, second):  # each command ran in its own pair's container
        assert manager.execute_command(*pair, "cat /tmp/who", persistent=True) == (0, f"{pair[0]}/{pair[1]}\n")


def test_a_same_named_container_of_another_session_is_left_alone(
    manager: SandboxManager, docker_client: Any, test_image: str, ids: tuple[str, str]
) -> None:
    """Whatever made it (another prefix, an older naming), a container at this
    session's name that belongs to another session is neither removed as this
    session's stale container (its owner is dead) nor used."""
    user, session = ids
    name = container_name(manager.prefix, user, session)
    foreign = _foreign_container(docker_client, test_image, name, f"{user}-x", session)
    try:
        with pytest.raises(RuntimeError, match="not the persistent container of session"):
            manager.get_or_create_session(user, session)
        assert not _gone(docker_client, foreign)
        assert manager.get_session(user, session) is None
    finally:
        if not _gone(docker_client, foreign):
            docker_client.api.remove_container(foreign, force=True)


def test_a_dead_owners_container_of_this_session_is_still_replaced(
    manager: SandboxManager, docker_client: Any, test_image: str, ids: tuple[str, str]
) -> None:
    user, session = ids
    name = container_name(manager.prefix, user, session)
    stale = _foreign_container(docker_client, test_image, name, user, session)
    try:
        assert manager.execute_command(user, session, "echo ok", persistent=True) == (0, "ok\n")
        assert _gone(docker_client, stale)
        assert manager.get_session(user, session).container_name == name
    finally:
        if not _gone(docker_client, stale):
            docker_client.api.remove_container(stale, force=True)


def test_bad_ids_raise_before_any_container(manager: SandboxManager, list_managed: Any) -> None:
    before = len(list_managed())
    with pytest.raises(ValueError, match="user_id"):
        manager.execute_command("../etc", "s", "true")
    with pytest.raises(ValueError, match="session_id"):
        manager.execute_command("u", "a/b", "true", persistent=True)
    with pytest.raises(ValueError, match="session_id"), manager.ephemeral_session("u", ".."):
        pass
    with pytest.raises(ValueError, match="timeout"):
        manager.execute_command("u", "s", "true", timeout=0)
    with pytest.raises(ValueError, match="command"):
        manager.execute_command("u", "s", b"true")  # type: ignore[arg-type]
    assert len(list_managed()) == before


def test_reaper_removes_idle_sessions(make_manager: Any, docker_client: Any, ids: tuple[str, str]) -> None:
    manager = make_manager(manager_kwargs={"session_timeout": 0.5})
    user, session = ids
    manager.execute_command(user, session, "true", persistent=True)
    first = manager.get_session(user, session)
    assert manager.reap_idle() == []  # just used
    time.sleep(0.6)
    assert manager.reap_idle() == [ids]
    assert _gone(docker_client, first.container_id) and manager.get_session(user, session) is None

    manager.execute_command(user, session, "true", persistent=True)
    second = manager.get_session(user, session)
    manager.start_reaper(interval=0.2)
    try:
        deadline = time.monotonic() + 10
        while manager.get_session(user, session) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        manager.stop_reaper()
    assert manager.get_session(user, session) is None
    assert _gone(docker_client, second.container_id)


def test_output_is_capped(make_manager: Any, ids: tuple[str, str]) -> None:
    manager = make_manager(manager_kwargs={"max_output_bytes": 1000})
    code, out = manager.execute_command(*ids, "head -c 5000 /dev/zero | tr '\\0' a")
    assert code == 0
    assert out.startswith("a" * 1000) and "4000 more bytes not shown" in out


def test_close_all_removes_everything(make_manager: Any, list_managed: Any, ids: tuple[str, str]) -> None:
    manager = make_manager()
    user, session = ids
    manager.execute_command(user, session, "true", persistent=True)
    manager.execute_command(user, session + "b", "true", persistent=True)
    assert len(list_managed(user=user)) == 2
    manager.close_all()
    assert list_managed(user=user) == []


# ----------------------------------------------------------------- async


def test_async_wrapper_does_not_block_the_loop(manager: SandboxManager, ids: tuple[str, str]) -> None:
    async def main() -> tuple[int, tuple[int, str], tuple[int, str]]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await manager.aexecute_command(*ids, "sleep 3; echo slept")
        async with manager.aephemeral_session(*ids) as session:
            inside = await manager.arun_in_session(session, "echo async-session")
        stop.set()
        await task
        return ticks, result, inside

    started = time.monotonic()
    ticks, result, inside = asyncio.run(main())
    elapsed = time.monotonic() - started
    assert result == (0, "slept\n") and inside == (0, "async-session\n")
    # At 20 ticks/s the loop ran freely for (nearly) the whole command.
    assert ticks >= 0.6 * 20 * 3, (ticks, elapsed)


# ----------------------------------------------------------------- privacy store


def test_default_getter_follows_the_privacy_store(
    docker_client: Any,
    test_image: str,
    test_limits: dict[str, Any],
    tmp_path: Path,
    ids: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a getter the manager asks sandbox_kernel.privacy; marking the session
    private replaces the container by one without network, workspace intact."""
    from sandbox_kernel.docker import offline_config
    from sandbox_kernel.privacy import PrivateData

    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SANDBOX_WORKSPACE_ROOT", raising=False)
    user, session = ids
    with SandboxManager(config=offline_config(image=test_image, **test_limits), client=docker_client) as manager:
        assert manager.workspace_root == tmp_path / "data" / "workspaces"
        assert "eth0" in _interfaces(manager, ids, persistent=True)
        manager.execute_command(user, session, "echo before > /workspace/f", persistent=True)
        PrivateData(user, session).add_private_dataset("patients")
        assert _interfaces(manager, ids, persistent=True) == ["lo"]
        assert manager.execute_command(user, session, "cat /workspace/f", persistent=True) == (0, "before\n")
        assert _interfaces(manager, ids, persistent=False) == ["lo"]


# ------------------------------------------------------------- the watcher's cut


def _networks(client: Any, container_id: str) -> list[str]:
    return sorted((_inspect(client, container_id)["NetworkSettings"] or {}).get("Networks") or {})


def test_the_watchers_cut_disconnects_held_containers_and_they_keep_running(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any
) -> None:
    manager = _without_watcher(make_manager)
    persistent = manager.get_or_create_session(*ids)
    with manager.ephemeral_session(*ids) as ephemeral:
        assert _networks(docker_client, persistent.container_id) == [SANDBOX_NETWORK]
        assert _networks(docker_client, ephemeral.container_id) == [SANDBOX_NETWORK]
        assert manager.enforce_network() == []  # still public: nothing cut
        mode_switch.mode = NetworkMode.NONE
        assert sorted(manager.enforce_network()) == sorted([persistent.container_name, ephemeral.container_name])
        for held in (persistent, ephemeral):
            assert _networks(docker_client, held.container_id) == []
            assert _inspect(docker_client, held.container_id)["State"]["Running"] is True
    assert manager.execute_command(*ids, "ls /sys/class/net", persistent=True) == (0, "lo\n")
    assert manager.get_session(*ids).container_id == persistent.container_id  # cut, not replaced


def test_a_refused_disconnect_removes_the_held_containers_ephemeral_included(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any
) -> None:
    manager = _without_watcher(make_manager, client=DaemonRefusingDisconnect(docker_client))
    persistent = manager.get_or_create_session(*ids)
    with manager.ephemeral_session(*ids) as ephemeral:
        mode_switch.mode = NetworkMode.NONE
        assert manager.enforce_network() == []  # nothing could be cut ...
        # ... so nothing keeps its network: both containers are gone at once,
        # the ephemeral one while its holder still has it.
        assert _gone(docker_client, ephemeral.container_id)
        assert _gone(docker_client, persistent.container_id)
        assert manager.get_session(*ids) is None
    # The next command gets a container made without a network.
    assert manager.execute_command(*ids, "ls /sys/class/net", persistent=True) == (0, "lo\n")


def _running(client: Any, container_id: str) -> bool:
    try:
        return bool(_inspect(client, container_id)["State"]["Running"])
    except docker.errors.NotFound:
        return False


def test_a_rise_while_the_daemon_does_not_answer_stops_the_held_containers_from_the_host(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any
) -> None:
    """Neither the disconnect nor the removal reaches the daemon (restarted,
    hung): the containers must not run on with their network beside a private
    workspace until it answers again. The host stops them through their
    cgroups, and once the daemon is back the session gets a new container
    without network in place of the stopped one (same name)."""
    client = DaemonGoneAway(docker_client)
    manager = _without_watcher(make_manager, client=client)
    persistent = manager.get_or_create_session(*ids)
    assert manager.execute_command(*ids, "echo kept > /workspace/note", persistent=True)[0] == 0
    with manager.ephemeral_session(*ids) as ephemeral:
        client.down = True
        mode_switch.mode = NetworkMode.NONE
        assert manager.enforce_network() == []  # nothing could be cut ...
        # ... and asked of the real daemon, nothing runs any more, so nothing
        # holds a network, though the daemon was asked nothing meanwhile.
        assert not _running(docker_client, persistent.container_id)
        assert not _running(docker_client, ephemeral.container_id)
        client.down = False
    assert manager.execute_command(*ids, "ls /sys/class/net; cat /workspace/note", persistent=True) == (
        0,
        "lo\nkept\n",
    )
    assert manager.get_session(*ids).container_id != persistent.container_id
    assert _gone(docker_client, persistent.container_id)


def test_the_sandboxes_network_is_made_without_inter_container_traffic_and_a_lax_one_is_refused(
    docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Docker's default bridge every container reaches every other one:
    one user's cell could connect to a server in another user's container.
    Sandboxes join a bridge of their own with inter-container traffic off
    (checked here by its configuration: tests send nothing to the bridge).
    A network of that name that allows it is refused, not used."""
    from sandbox_kernel.docker import hardening

    name = f"sandbox-kernel-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(hardening, "SANDBOX_NETWORK", name)
    try:
        kwargs = hardening.join_sandbox_network(docker_client, {"network_mode": "bridge", "image": "x"})
        assert kwargs == {"network_mode": name, "image": "x"}
        made = docker_client.networks.get(name)
        assert made.attrs["Driver"] == "bridge" and made.attrs["Options"][hardening.ICC_OPTION] == "false"
        # again: the same network, not a second one
        assert hardening.join_sandbox_network(docker_client, {"network_mode": "bridge"})["network_mode"] == name
        assert [n.id for n in docker_client.networks.list(names=[name]) if n.name == name] == [made.id]
        assert hardening.join_sandbox_network(docker_client, {"network_mode": "none"}) == {"network_mode": "none"}
        made.remove()
        docker_client.networks.create(name, driver="bridge")  # inter-container traffic on (Docker's default)
        with pytest.raises(RuntimeError, match="lets containers reach each other"):
            hardening.join_sandbox_network(docker_client, {"network_mode": "bridge"})
    finally:
        for network in docker_client.networks.list(names=[name]):
            if network.name == name:
                network.remove()
