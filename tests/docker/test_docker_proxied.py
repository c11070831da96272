"""PROXIED mode on the Docker backend: ``network_mode=none`` plus the egress
proxy's socket; the same guarantees as with bubblewrap (tests/test_proxied_kernel.py).

The origin is a server on the host's 127.0.0.1, reached as files.example
through the proxy's test-only name override: the container never touches
the Docker bridge or any non-loopback address.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_docker_kernel import DockerKernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "network"))
from proxy_helpers import OriginServer

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


@pytest.fixture
def origin() -> Iterator[OriginServer]:
    server = OriginServer()
    yield server
    server.close()


@pytest.fixture
def proxied_dk(docker_client: Any, test_image: str, tmp_path: Path) -> Iterator[DockerKernel]:
    kernel = DockerKernel(
        tmp_path,
        docker_client,
        test_image,
        "--SandboxKernel.network=proxied",
        "--SandboxKernel.egress_allow_addresses=127.0.0.1",
        "--SandboxKernel.egress_deny=blocked.test",
        '--SandboxKernel.egress_name_overrides={"files.example": ["127.0.0.1"], "blocked.test": ["127.0.0.1"]}',
    )
    yield kernel
    kernel.shutdown()


def test_container_has_no_network_but_the_proxy(proxied_dk: DockerKernel, origin: OriginServer) -> None:
    dk = proxied_dk
    assert dk.run(IFACES).stdout.strip() == "['lo']"
    info = dk.container()
    assert info["HostConfig"]["NetworkMode"] == "none"
    run = dk.run(
        "import urllib.request, urllib.error\n"
        f"print(urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10).read())\n"
        "try:\n"
        f"    urllib.request.urlopen('http://blocked.test:{origin.port}/small', timeout=10)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.headers['X-Sandbox-Egress-Rule'])"
    )
    assert run.stdout.strip().splitlines() == ["b'hello from the origin'", "403 deny list: blocked.test"], run.stderr


def test_rise_cuts_in_place_and_keeps_the_container(proxied_dk: DockerKernel, origin: OriginServer) -> None:
    dk = proxied_dk
    dk.run("import urllib.request\nfh = open('/tmp/kept', 'w')\nx = 41")
    before = dk.container()["Id"]
    run = dk.run(
        "import sandbox_kernel.private as p\np.add_dataset('patients', 'CONFIDENTIAL')\n"
        "try:\n"
        f"    urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.headers['X-Sandbox-Egress-Rule'])\n"
        "print(x + 1, fh.closed)"
    )
    assert run.status == "ok", run.reply
    assert run.stdout.strip().splitlines() == ["403 no network: the session holds private data", "42 False"]
    assert "The sandbox was replaced" not in run.stderr
    assert dk.container()["Id"] == before, "the container was replaced instead of cut in place"
