"""A Docker shell manager killed with SIGKILL leaves its containers running,
on their network, with the workspace mounted read-write (nothing of it runs
to remove them). Its holder record was keyed by its pid alone and dropped once
the pid was gone, so a rise's ``wait=True`` returned at once while the orphan
kept eth0 beside the private data (review r66, finding A). Now a rise removes
the dead holder's containers through the daemon, and counts the holder as one
with network until the daemon confirms none is left (guarantee 11).

The manager runs in a child process (this checkout's code), killed by its pid.
Network checks look at Docker's view and at the interfaces a background
process in the container lists; nothing is sent anywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import docker
from sandbox_kernel.docker.names import LABEL_OWNER_PID, LABEL_SESSION, LABEL_USER

REPO = Path(__file__).resolve().parents[2]

#: the child: a manager with the default getter and store, one command that
#: leaves a process listing the interfaces (and reading the secret) every 0.1 s
MANAGER = r"""
import os, sys, time
from pathlib import Path
from sandbox_kernel.docker import SandboxManager, offline_config
image, user, session, persistent = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
config = offline_config(image=image, cpu_limit=1.0, memory_limit="128m", pids_limit=64, tmpfs_size="16m",
                        command_timeout=120)
manager = SandboxManager(config=config, workspace_root=Path(os.environ["SANDBOX_KERNEL_DATA_DIR"]) / "ws")
recorder = ("nohup setsid sh -c 'while true; do echo $(date +%s.%N) $(ls /sys/class/net) $(cat /workspace/secret 2>/dev/null); "
            "sleep 0.1; done' >> /workspace/ifaces.log 2>/dev/null </dev/null &")
if persistent:
    manager.execute_command(user, session, recorder + " echo started", persistent=True)
    print("READY", flush=True)
    time.sleep(3600)
manager.execute_command(user, session, recorder + " sleep 600")
"""


class Orphaned:
    """A manager process killed with SIGKILL, and what it left."""

    def __init__(self, client: Any, image: str, data: Path, ids: tuple[str, str], persistent: bool) -> None:
        self.client, self.ids = client, ids
        self.workspace = data / "ws" / ids[0] / ids[1]
        env = {**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
        env.pop("SANDBOX_WORKSPACE_ROOT", None)
        self.child = subprocess.Popen(
            [sys.executable, "-c", MANAGER, image, *ids, "1" if persistent else "0"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.containers: list[str] = []

    def wait_for_recorder(self) -> None:
        """Until the background process has listed eth0 (its container has a network)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any("eth0" in line for line in self.lines()):
                self.containers = [c["Id"] for c in self.client.api.containers(filters=self._filters())]
                assert len(self.containers) == 1, self.containers
                return
            assert self.child.poll() is None, "the manager process ended early"
            time.sleep(0.1)
        raise AssertionError("the command never listed its interfaces")

    def kill(self) -> None:
        os.kill(self.child.pid, signal.SIGKILL)
        self.child.wait()

    def _filters(self) -> dict[str, Any]:
        return {
            "label": [
                f"{LABEL_OWNER_PID}={self.child.pid}",
                f"{LABEL_USER}={self.ids[0]}",
                f"{LABEL_SESSION}={self.ids[1]}",
            ]
        }

    def lines(self) -> list[str]:
        try:
            return (self.workspace / "ifaces.log").read_text().splitlines()
        except FileNotFoundError:
            return []

    def running(self) -> list[str]:
        """Those of its containers still there (any state), by id."""
        left = []
        for cid in self.containers:
            try:
                self.client.api.inspect_container(cid)
            except docker.errors.NotFound:
                continue
            left.append(cid)
        return left

    def cleanup(self) -> None:
        if self.child.poll() is None:
            self.kill()
        for info in self.client.api.containers(all=True, filters=self._filters()):
            try:
                self.client.api.remove_container(info["Id"], force=True, v=True)
            except docker.errors.NotFound:
                pass


@pytest.fixture
def orphaned(docker_client: Any, test_image: str, tmp_path: Path, ids: tuple[str, str]) -> Iterator[Any]:
    made: list[Orphaned] = []

    def make(persistent: bool) -> Orphaned:
        made.append(Orphaned(docker_client, test_image, tmp_path / "data", ids, persistent))
        return made[-1]

    yield make
    for item in made:
        item.cleanup()


def _rise(data: Path, ids: tuple[str, str], monkeypatch: pytest.MonkeyPatch, wait: bool | float) -> None:
    from sandbox_kernel.privacy import PrivateData

    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(data))
    PrivateData(*ids).add_private_dataset("payroll", "CONFIDENTIAL", source="connector", wait=wait)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "ephemeral"])
def test_a_rise_removes_the_networked_containers_of_a_killed_manager(
    orphaned: Any, tmp_path: Path, ids: tuple[str, str], monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """The review's reproducer (orphan_repro.sh, orphan_ephemeral.sh): old
    code returned from ``wait=True`` in 0.01 s with the orphan running on its
    bridge network, and its process then read the secret. Now the container
    is gone when the call returns, and nothing of it writes afterwards."""
    item = orphaned(persistent)
    item.wait_for_recorder()
    item.kill()
    assert item.running() == item.containers  # SIGKILL ran no cleanup: it outlives its manager

    _rise(tmp_path / "data", ids, monkeypatch, wait=True)
    returned = time.time()
    assert item.running() == []
    (item.workspace / "secret").write_text("PAYROLL-ROW\n")
    time.sleep(0.5)
    assert not [line for line in item.lines() if float(line.split()[0]) > returned]
    assert not any("PAYROLL" in line for line in item.lines())


def test_a_rise_without_wait_removes_them_too(
    orphaned: Any, tmp_path: Path, ids: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raiser that does not wait still looks once at the holders: the dead
    holder's containers go before ``add_private_dataset`` returns (old code:
    they ran on until ``sandbox-kernel gc``)."""
    item = orphaned(True)
    item.wait_for_recorder()
    item.kill()
    _rise(tmp_path / "data", ids, monkeypatch, wait=False)
    assert item.running() == []


def test_a_rise_that_cannot_ask_the_daemon_fails_closed(
    orphaned: Any, tmp_path: Path, ids: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raiser reaches no Docker daemon (DOCKER_HOST names a socket that
    does not exist): the dead holder cannot be shown harmless, so ``wait``
    times out naming it (old code: returned at once). Once the daemon
    answers again, the next rise removes the orphan."""
    item = orphaned(True)
    item.wait_for_recorder()
    item.kill()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(TimeoutError, match=f"dead process {item.child.pid} of session {ids[1]}"):
        _rise(tmp_path / "data", ids, monkeypatch, wait=1.0)
    assert item.running() == item.containers
    monkeypatch.delenv("DOCKER_HOST")
    _rise(tmp_path / "data", ids, monkeypatch, wait=True)
    assert item.running() == []
