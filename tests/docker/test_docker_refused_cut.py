"""The ratchet's cut when the Docker daemon refuses it: the sandbox goes at once.

A rise takes the network away first and carries the state afterwards, so a
slow checkpoint cannot keep the network. With a Docker sandbox the cut is a
disconnect by the daemon; when the daemon refuses it, the sandbox must not stay
networked while its state is carried (here a 12 s ``__reduce__``): it is
removed at once and the state comes back from the replay log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

docker = pytest.importorskip("docker")  # CI installs sandbox_kernel[docker]: tests/docker/conftest.py fails there

from daemon_refusals import DaemonGoneAway, DaemonRefusingDisconnect, DaemonSlowToDisconnect  # noqa: E402

from sandbox_kernel.engine import EngineConfig, Session  # noqa: E402
from sandbox_kernel.engine.ratchet import Ratchet  # noqa: E402
from sandbox_kernel.privacy import PrivacyStore  # noqa: E402
from sandbox_kernel.sandbox.docker_backend import DockerSandbox  # noqa: E402

pytestmark = pytest.mark.asyncio

IFACES = "print(sorted(n for _, n in socket.if_nameindex()))"


def _networked(client: Any, container_id: str) -> bool:
    """The container still runs attached to a network."""
    try:
        info = client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    networks = set((info.get("NetworkSettings") or {}).get("Networks") or {}) - {"none"}
    return bool(networks) and bool((info.get("State") or {}).get("Running"))


def _session(client: Any, image: str, tmp_path: Path, **config: Any) -> Session:
    """A public session with a user-mode-like network, on a container through ``client``."""
    sandbox = DockerSandbox(
        client=client,
        image=image,
        read_only_mounts={"/usr": "/usr"},
        memory_limit="256m",
        pids_limit=64,
        cpu_limit=1.0,
        tmpfs_size="16m",
    )
    workspace = tmp_path / "project" / "ws"
    workspace.mkdir(parents=True)
    ratchet = Ratchet("alice", "s1", PrivacyStore(tmp_path / "state" / "privacy"), workspace=workspace)
    return Session(EngineConfig(workspace=workspace, network="user", **config), sandbox=sandbox, ratchet=ratchet)


async def _run(session: Session, code: str, count: int) -> tuple[str, str]:
    emitted: list[tuple[str, dict[str, Any]]] = []
    result = await session.execute(
        code, execution_count=count, emit=lambda kind, content: emitted.append((kind, content))
    )
    errors = "".join(f"{c.get('ename')}: {c.get('evalue')}" for kind, c in emitted if kind == "error")
    return result.status, "".join(c.get("text", "") for kind, c in emitted if kind == "stream") + errors


async def _on_the_bridge(session: Session, code: str) -> Any:
    """Run ``code`` as the first cell, which must see the bridge network
    (public: ``eth0``); the container's process."""
    status, text = await _run(session, code + IFACES, 1)
    assert status == "ok", text
    assert "eth0" in text  # public: a bridge network
    assert session.worker is not None
    return session.worker.process


async def test_a_refused_disconnect_removes_the_busy_sandbox_before_its_state_moves(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    # no idle checkpoint: the only one would be taken when the state moves
    session = _session(DaemonRefusingDisconnect(docker_client), test_image, tmp_path, checkpoint_delay=3600)
    try:
        process = await _on_the_bridge(
            session,
            "import socket, time\n"
            "class Slow:\n"
            "    def __reduce__(self):\n"
            "        time.sleep(12)\n"
            "        return (Slow, ())\n"
            "slow = Slow()\n",
        )
        container = process.container_id
        assert _networked(docker_client, container)

        busy = asyncio.ensure_future(_run(session, "while True:\n    time.sleep(0.05)", 2))
        await asyncio.sleep(1.0)
        await session.mark_private("CONFIDENTIAL", "payroll", source="api")
        # The daemon refused the disconnect; the networked container is gone
        # already, not after the 12 s checkpoint the move would have taken.
        assert not _networked(docker_client, container)

        status, text = await asyncio.wait_for(busy, 60)
        assert status == "died"
        assert "network could not be cut" in text, text  # the busy cell is told why
        status, text = await _run(session, IFACES, 3)  # the import came back from the replay log
        assert status == "ok", text
        assert text.strip().endswith("['lo']")
        assert not _networked(docker_client, session.worker.process.container_id)
    finally:
        await session.shutdown()


async def test_a_rise_while_the_daemon_is_unreachable_still_stops_the_container(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """Neither the disconnect nor the removal reaches the daemon, and the
    container must not run on with its network until the daemon answers
    again. What stops it is its channel: killing the attached CLI closes the
    worker's stdin, the worker exits, and docker-init takes the rest of the
    container with it. (A daemon killed outright closes that channel too:
    measured with a second dockerd, SIGKILLed during a busy cell, the
    container's cgroup was gone within a second.)"""
    client = DaemonGoneAway(docker_client)
    session = _session(client, test_image, tmp_path)
    try:
        process = await _on_the_bridge(session, "import socket, time\n")
        container = process.container_id
        assert _networked(docker_client, container)

        busy = asyncio.ensure_future(_run(session, "while True:\n    time.sleep(0.05)", 2))
        await asyncio.sleep(1.0)
        client.down = True
        await session.mark_private("CONFIDENTIAL", "payroll", source="api")
        # Asked of the real daemon while the kernel's client is still "down":
        # nothing was disconnected or removed through it, yet the container
        # stopped, so it holds no network.
        stopped = False
        for _ in range(100):
            if not _networked(docker_client, container):
                stopped = True
                break
            await asyncio.sleep(0.1)
        assert stopped, "the container still runs on its network"
        status, text = await asyncio.wait_for(busy, 60)
        assert status == "died"
        assert "network could not be cut" in text, text

        await _answers_again_without_network(client, session)
    finally:
        client.down = False
        await session.shutdown()


async def _answers_again_without_network(client: Any, session: Session) -> None:
    """The daemon answers again: the session's next cell runs, without network."""
    client.down = False
    status, text = await _run(session, IFACES, 3)
    assert status == "ok", text
    assert text.strip().endswith("['lo']")


async def test_the_watchdogs_disconnect_and_the_loops_at_once_are_not_a_refusal(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """The cut watchdog's thread disconnects a container while the loop is
    busy; the loop's poll, once it runs, disconnects it too. When the two
    overlapped, the second saw the networks the first was removing, failed
    on them ("not connected"), and the host took that for a refusal: the
    sandbox was removed and its state lost, with nothing leaking. A daemon
    that takes 0.5 s to disconnect makes them overlap every time."""
    session = _session(DaemonSlowToDisconnect(docker_client, 0.5), test_image, tmp_path)
    try:
        process = await _on_the_bridge(session, "import socket\nkept = 'state'\n")
        from_thread = asyncio.ensure_future(asyncio.to_thread(process.cut_network_now))
        await asyncio.sleep(0.1)  # the thread's disconnect is under way
        from_loop = await process.cut_network()
        assert await from_thread is True
        assert from_loop is True, "the loop's disconnect was taken for a refusal"
        assert not process.cut_refused
        assert not _networked(docker_client, process.container_id)
        status, text = await _run(session, "print(kept)\n" + IFACES, 2)
        assert status == "ok", text
        assert text.split() == ["state", "['lo']"], text  # the same sandbox, without network
        assert session.worker.process is process
    finally:
        await session.shutdown()


async def _until_off_the_network(client: Any, container: str, seconds: float) -> bool:
    for _ in range(int(seconds * 10)):
        if not _networked(client, container):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_rise_while_the_daemon_is_unreachable_stops_a_container_whose_holder_a_cell_stopped(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """Review r66, finding B: what stopped the container in the test above
    is its worker reading EOF on its channel. A cell that SIGSTOPs its holder
    (its parent, same uid) keeps that EOF unread: old code reported the cut
    (``network_reachable`` False) while the container ran on, on its bridge
    network, and it was still there after the daemon answered again, beside
    the new private container sharing the workspace and state dir. Now the
    host kills the container's first process (docker-init, the init of its
    PID namespace) through a pidfd it opened at the start, without the
    daemon."""
    client = DaemonGoneAway(docker_client)
    session = _session(client, test_image, tmp_path)
    try:
        process = await _on_the_bridge(session, "import os, signal, socket, time\n")
        container = process.container_id
        stop_holder = "os.kill(os.getppid(), signal.SIGSTOP)\nwhile True:\n    time.sleep(0.05)"
        busy = asyncio.ensure_future(_run(session, stop_holder, 2))
        await asyncio.sleep(1.0)
        client.down = True
        await session.mark_private("CONFIDENTIAL", "payroll", source="api")
        assert await _until_off_the_network(docker_client, container, 10), "the container still runs on its network"
        status, text = await asyncio.wait_for(busy, 60)
        assert status == "died", text

        await _answers_again_without_network(client, session)
        assert not _networked(docker_client, container)
    finally:
        client.down = False
        await session.shutdown()


async def test_a_container_whose_stop_is_not_confirmed_holds_the_network_and_the_next_start(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """The host cannot kill the container itself when its first process is
    unknown here (the daemon did not answer when the sandbox started; a
    remote daemon; another uid): the kill is then not confirmed. Old code
    reported the cut all the same and started the next sandbox beside it.
    Now the session reports network while it may still run (a raiser's
    ``wait=True`` waits), no sandbox starts before the daemon confirms its
    removal, and the removal is asked again once the daemon answers."""
    client = DaemonGoneAway(docker_client)
    client.down = True  # the kernel's low-level calls fail from the start: docker-init's pid is never learnt
    session = _session(client, test_image, tmp_path)
    try:
        process = await _on_the_bridge(session, "import socket, time\n")
        container = process.container_id
        await session.mark_private("CONFIDENTIAL", "payroll", source="api")
        assert session.network_reachable, "reported cut while the container may still run"
        status, text = await _run(session, IFACES, 2)
        assert status == "error" and container[:12] in text and "could not be stopped" in text, text

        await _answers_again_without_network(client, session)
        assert not session.network_reachable
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(container)
    finally:
        client.down = False
        await session.shutdown()
