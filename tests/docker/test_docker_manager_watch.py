"""A standalone SandboxManager cuts its held containers' network on a rise by
itself (guarantee 11): no command, no tools registry, no cooperation of the
container, within the poll interval; and ``wait=True`` waits for that cut.

Network checks look at Docker's view and at interfaces (/sys/class/net),
never send traffic.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.docker import SandboxManager
from sandbox_kernel.docker.hardening import SANDBOX_NETWORK
from sandbox_kernel.privacy.enforcement import enforced_root
from sandbox_kernel.privacy.modes import NetworkMode

WATCHER = "sandbox-network-watcher"

#: leaves a process behind that writes "<epoch> <interfaces>" every 0.1 s
RECORDER = (
    "nohup sh -c 'while true; do echo $(date +%s.%N) $(ls /sys/class/net); sleep 0.1; done' "
    ">> /workspace/ifaces.log 2>/dev/null & echo started"
)


def _networks(client: Any, container_id: str) -> list[str]:
    info = client.api.inspect_container(container_id)
    return sorted((info["NetworkSettings"] or {}).get("Networks") or {})


def _watchers(besides: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCHER and t.is_alive() and t not in besides]


def _until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_rise_with_wait_returns_after_the_held_containers_are_cut(
    docker_client: Any,
    test_image: str,
    test_limits: dict[str, Any],
    tmp_path: Path,
    ids: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The review's PoC: a background process in a persistent container saw
    eth0 for 5 s and more after ``add_private_dataset(wait=True)``, which
    returned at once. Now the call returns once the daemon has disconnected
    both the persistent container and a held ephemeral one, and nothing in
    them sees an interface but lo afterwards; no command ran meanwhile."""
    from sandbox_kernel.docker import offline_config
    from sandbox_kernel.privacy import PrivateData

    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SANDBOX_WORKSPACE_ROOT", raising=False)
    user, session = ids
    manager = SandboxManager(config=offline_config(image=test_image, **test_limits), client=docker_client)
    records = enforced_root(tmp_path / "data" / "privacy") / user / session
    try:
        assert manager.execute_command(user, session, RECORDER, persistent=True) == (0, "started\n")
        persistent = manager.get_session(user, session)
        with manager.ephemeral_session(user, session) as ephemeral:
            held = (persistent.container_id, ephemeral.container_id)
            assert [_networks(docker_client, c) for c in held] == [[SANDBOX_NETWORK], [SANDBOX_NETWORK]]
            time.sleep(0.5)  # the recorder has seen eth0

            started = time.monotonic()
            PrivateData(user, session).add_private_dataset("crm", "SECRET", source="connector", wait=True)
            returned, took = time.time(), time.monotonic() - started

            assert [_networks(docker_client, c) for c in held] == [[], []]
            assert took < 5.0, took  # the poll is 0.25 s
            assert docker_client.api.inspect_container(persistent.container_id)["State"]["Running"]
            time.sleep(0.6)
        log = (manager.workspace_for(user, session) / "ifaces.log").read_text().splitlines()
        assert any("eth0" in line for line in log), log  # it had a network before
        after = [line.split(" ", 1)[1] for line in log if float(line.split()[0]) > returned]
        assert after and set(after) == {"lo"}, after
        assert manager.get_session(user, session).container_id == persistent.container_id  # cut, not replaced
    finally:
        manager.close_all()
    assert not records.exists() or os.listdir(records) == []  # no holder left behind


def test_the_watcher_cuts_without_a_command_and_ends_with_the_manager(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any
) -> None:
    """Any getter: the manager's own watcher asks it and cuts, without a
    command. The watcher ends once nothing has a network, and with close_all."""
    others = frozenset(_watchers())  # other tests' managers, if any are still open
    manager: SandboxManager = make_manager()
    first = manager.get_or_create_session(*ids)
    assert _networks(docker_client, first.container_id) == [SANDBOX_NETWORK]
    mode_switch.mode = NetworkMode.NONE
    assert _until(lambda: _networks(docker_client, first.container_id) == [], 2.0)
    assert _until(lambda: _watchers(others) == [], 2.0)  # nothing with a network left to watch
    assert manager.execute_command(*ids, "ls /sys/class/net", persistent=True) == (0, "lo\n")

    mode_switch.mode = NetworkMode.FULL
    other = manager.get_or_create_session(ids[0], ids[1] + "b")
    assert _networks(docker_client, other.container_id) == [SANDBOX_NETWORK]
    assert len(_watchers(others)) == 1
    manager.close_all()
    assert _watchers(others) == []


def test_a_given_store_gets_the_records_of_a_custom_getters_containers(
    make_manager: Any, ids: tuple[str, str], mode_switch: Any, tmp_path: Path
) -> None:
    """The tools' registry reads the mode with its own getter: its records
    were written only after its watcher's first round, and never for an
    ephemeral container, so a rise right after one started could return from
    ``wait=True`` before the cut. Given the store, the manager writes them,
    from before the container's mode is read."""
    import json

    store = tmp_path / "privacy"
    manager: SandboxManager = make_manager(manager_kwargs={"enforcement_store": store})
    records = enforced_root(store) / ids[0] / ids[1]
    try:
        with manager.ephemeral_session(*ids):
            held = [json.loads(p.read_text()) for p in records.glob("*.json")]
            assert [r["network"] for r in held] == [True] and held[0]["pid"] == os.getpid()
        assert list(records.glob("*.json")) == []
        mode_switch.mode = NetworkMode.NONE
        with manager.ephemeral_session(*ids):  # no network: nothing to wait for
            assert list(records.glob("*.json")) == []
    finally:
        manager.close_all()


class _DaemonWithoutID:
    """The real client, except that ``docker info`` gives no ID (a daemon
    in trouble answering part of it): everything else is real."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def info(self) -> dict[str, Any]:
        return {}


def test_no_container_with_network_starts_while_the_daemon_does_not_say_its_id(
    make_manager: Any, docker_client: Any, ids: tuple[str, str], mode_switch: Any, tmp_path: Path, list_managed: Any
) -> None:
    """Review 76: a holder record written while the daemon gave no ID can
    never be confirmed gone (the rise cannot tell which daemon to ask), so
    every later rise of that session timed out on it for good, after this
    process died. A container with network is not started then; a manager
    whose containers get none needs no record, and starts them."""
    store = tmp_path / "privacy"
    manager: SandboxManager = make_manager(
        manager_kwargs={"enforcement_store": store, "client": _DaemonWithoutID(docker_client)}
    )
    with pytest.raises(OSError, match="does not say its ID"):
        manager.execute_command(*ids, "true")
    assert list_managed(user=ids[0], session=ids[1]) == []
    assert list((enforced_root(store) / ids[0] / ids[1]).glob("*.json")) == []
    offline: SandboxManager = make_manager(
        network_mode=NetworkMode.NONE,
        manager_kwargs={"enforcement_store": store, "client": _DaemonWithoutID(docker_client)},
    )
    assert offline.execute_command(*ids, "ls /sys/class/net") == (0, "lo\n")
