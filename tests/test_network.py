"""Guarantees 2 and 9: network by mode, host loopback and abstract sockets out of reach.

Traffic goes only to servers these tests start on 127.0.0.1 or in the abstract
unix namespace of this host; the sandbox's own interfaces are read from
/sys/class/net and socket.if_nameindex().
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap


class HostServers:
    """A TCP server on 127.0.0.1 and an abstract unix socket, both on the host."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.port = self.tcp.getsockname()[1]
        self.abstract_name = f"sandbox-kernel-test-{os.getpid()}-{self.port}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract_name)
        self.unix.listen(8)
        self.accepted = 0
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in (self.tcp, self.unix)]
        for thread in self._threads:
            thread.start()

    def _accept(self, server: socket.socket) -> None:
        server.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def probe_code(self) -> str:
        return (
            "import socket\n"
            "res = {}\n"
            "s = socket.socket(); s.settimeout(3)\n"
            f"try:\n    s.connect(('127.0.0.1', {self.port})); res['tcp'] = 'CONNECTED'\n"
            "except OSError as e:\n    res['tcp'] = type(e).__name__\n"
            "u = socket.socket(socket.AF_UNIX); u.settimeout(3)\n"
            f"try:\n    u.connect('\\0{self.abstract_name}'); res['abstract'] = 'CONNECTED'\n"
            "except OSError as e:\n    res['abstract'] = type(e).__name__\n"
            "import os\nres['ifaces'] = sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else sorted(n for _, n in socket.if_nameindex())\n"
            "print(res)"
        )

    def close(self) -> None:
        self._stop = True
        for thread in self._threads:
            thread.join(2)
        self.tcp.close()
        self.unix.close()


@pytest.fixture
def servers() -> Iterator[HostServers]:
    srv = HostServers()
    yield srv
    srv.close()


def parse(run) -> dict:
    import ast

    assert run.status == "ok", run.reply
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def test_public_session_has_network_but_not_the_host(kernel: SandboxKernelHandle, servers: HostServers) -> None:
    result = parse(kernel.run(servers.probe_code()))
    assert "lo" in result["ifaces"] and len(result["ifaces"]) >= 2, result  # a real interface besides lo
    assert result["tcp"] != "CONNECTED" and result["abstract"] != "CONNECTED", result
    assert servers.accepted == 0


def test_private_session_has_only_loopback(fresh_kernel: SandboxKernelHandle, servers: HostServers) -> None:
    fresh_kernel.run("import sandbox_kernel.private as p\np.add_dataset('payroll', 'SECRET')")
    result = parse(fresh_kernel.run(servers.probe_code()))
    assert [i for i in result["ifaces"] if i != "lo"] == [], result
    assert result["tcp"] != "CONNECTED" and result["abstract"] != "CONNECTED", result
    assert servers.accepted == 0


def test_host_network_is_only_shared_when_asked(tmp_path: Path, servers: HostServers) -> None:
    """The explicit option really exposes what its help says (and nothing else does)."""
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(
        tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.share_host_network=True"]
    )
    try:
        result = parse(handle.run(servers.probe_code()))
        assert result["tcp"] == "CONNECTED" and result["abstract"] == "CONNECTED", result
        handle.run("import sandbox_kernel.private as p\np.add_dataset('x')")
        result = parse(handle.run(servers.probe_code()))
        assert result["tcp"] != "CONNECTED" and result["abstract"] != "CONNECTED", result
    finally:
        handle.shutdown()
