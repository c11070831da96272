"""PROXIED mode on the Docker backend: ``network_mode=none`` plus the egress
proxy's socket; the same guarantees as with bubblewrap (tests/test_proxied_kernel.py).

The origin is a server on the host's 127.0.0.1, reached as files.example
through the proxy's test-only name override: the container never touches
the Docker bridge or any non-loopback address.
"""

from __future__ import annotations

import os
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


def test_the_proxys_folder_is_entered_not_written(proxied_dk: DockerKernel, origin: OriginServer) -> None:
    """The container reaches the proxy's socket in a host folder under /tmp.
    That folder was mounted writable and handed to the container's user, so
    a cell stashed files there, beside any disk cap, and as it was no longer
    the kernel's, a crashed kernel's folder was never collected (an attack
    review). The container may read it (the socket's name) and connect,
    nothing more."""
    dk = proxied_dk
    run = dk.run(
        "import os, urllib.request\n"
        "folder = '/.sandbox_kernel/egress'\n"
        "for name in ('stash.bin',):\n"
        "    try:\n"
        "        open(f'{folder}/{name}', 'wb').write(b'x' * 4096)\n"
        "        print(name, 'written')\n"
        "    except OSError as exc:\n"
        "        print(name, 'refused', exc.errno)\n"
        "print(sorted(os.listdir(folder)))\n"
        f"print(urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10).read())"
    )
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith("stash.bin refused"), run.stdout
    assert lines[1:] == ["['proxy.sock']", "b'hello from the origin'"], (run.stdout, run.stderr)
    source = next(m["Source"] for m in dk.container()["Mounts"] if m["Destination"] == "/.sandbox_kernel/egress")
    folder = Path(source)
    # still the kernel's (collected after a crash), open to no one else (an ACL lets the container's user read)
    assert folder.stat().st_uid == os.geteuid() and folder.stat().st_mode & 0o007 == 0
    assert {p.name for p in folder.iterdir()} == {"proxy.sock"}
    assert next(m for m in dk.container()["Mounts"] if m["Destination"] == "/.sandbox_kernel/egress")["RW"] is False


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
