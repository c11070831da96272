"""The Docker daemon restarted under a running kernel (issue 17's fault list).

The test starts a daemon of its own (its own socket, data and exec roots, pid
file and bridge interface, no iptables rules), so stopping it touches nothing
else (``--bridge=none`` would not do: dockerd then deletes ``docker0``, the
other daemon's bridge);
it is stopped by the pid it was started with. The kernel's container dies with
the daemon; the next cell gets a new container and the state from the last
checkpoint, saying so, and no container is left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import SandboxKernelHandle
from test_docker_kernel import containers_of, docker_args

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


class OwnDaemon:
    """A dockerd of this test's own, started through scripts/ensure-docker.sh."""

    def __init__(self) -> None:
        # short paths: containerd's sockets live under the exec root (108-byte limit)
        self.root = Path(tempfile.mkdtemp(prefix="skd-", dir="/tmp"))
        self.socket = f"unix://{self.root}/d.sock"
        self.pidfile = self.root / "dockerd.pid"
        self.pid: int | None = None
        self.bridge = f"skd{os.getpid() % 100000}"
        subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", "10.213.117.1/24", "dev", self.bridge], check=True)

    def start(self) -> None:
        env = {
            **os.environ,
            "DOCKER_HOST": self.socket,
            "SANDBOX_DOCKERD_PIDFILE": str(self.pidfile),
            "SANDBOX_DOCKERD_LOG": str(self.root / "dockerd.log"),
            "SANDBOX_DOCKERD_ARGS": (
                f"--data-root {self.root}/data --exec-root {self.root}/x --pidfile {self.root}/docker.pid "
                f"--bridge={self.bridge} --iptables=false --ip6tables=false --ip-masq=false"
            ),
        }
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "ensure-docker.sh")], env=env, capture_output=True, text=True, timeout=180
        )
        if proc.returncode != 0 or not self.pidfile.exists():
            log = (self.root / "dockerd.log").read_text()[-2000:] if (self.root / "dockerd.log").exists() else ""
            message = f"could not start a Docker daemon of the test's own: {proc.stderr[-1500:]}\n{log}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        self.pid = int(self.pidfile.read_text())

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and Path(f"/proc/{self.pid}").exists():
            time.sleep(0.2)
        if Path(f"/proc/{self.pid}").exists():
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None
        self.pidfile.unlink(missing_ok=True)

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.socket, timeout=60)

    def remove(self) -> None:
        self.stop()
        with open("/proc/self/mounts") as fh:  # overlay and shm mounts of its containers
            mounts = [line.split()[1] for line in fh if line.split()[1].startswith(str(self.root))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], check=False)


@pytest.fixture
def own_daemon() -> Iterator[OwnDaemon]:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        if IN_CI:
            pytest.fail("restarting a Docker daemon of the test's own needs root and dockerd")
        pytest.skip("needs root and dockerd")
    bridges = sorted(os.listdir("/sys/class/net"))
    daemon = OwnDaemon()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.remove()
    assert sorted(os.listdir("/sys/class/net")) == bridges  # the other daemon's docker0 is still there


def test_daemon_restart_mid_session_resumes_from_the_checkpoint(own_daemon: OwnDaemon, tmp_path: Path) -> None:
    from sandbox_kernel.docker.image import ensure_test_image

    client = own_daemon.client()
    image = ensure_test_image(client)
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    os.chown(tmp_path / "ws", 65534, 65534)
    k = SandboxKernelHandle(
        tmp_path / "ws",
        tmp_path / "tmp",
        extra_args=docker_args(image, "--SandboxKernel.network=none"),
        env={"DOCKER_HOST": own_daemon.socket},
    )
    pid = k.pid
    try:
        assert k.run("x = 41").status == "ok"
        time.sleep(2)  # the background checkpoint after cell [1]
        first = [c["Id"] for c in containers_of(client, pid)]
        assert len(first) == 1
        own_daemon.stop()  # the container goes with the daemon
        own_daemon.start()
        client = own_daemon.client()
        outputs = []
        for _ in range(2):  # the first cell may find the old container dead and say so
            run = k.run("print(x + 1)", timeout=120)
            outputs.append((run.stdout, run.stderr, run.reply.get("evalue")))
            if run.stdout == "42\n":
                break
        assert outputs[-1][0] == "42\n", outputs
        said = "\n".join(err for _, err, _ in outputs)
        assert "The sandbox was replaced" in said and "after cell [1]" in said, outputs
        now = containers_of(client, pid)
        assert [c["Id"] for c in now if c["State"] == "running"] != first
        assert [c for c in now if c["Id"] in first] == []  # the dead one was removed, not left behind
    finally:
        k.shutdown()
    assert containers_of(client, pid) == []
