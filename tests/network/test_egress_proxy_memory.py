"""What a sandbox can make the proxy's process (the kernel's) hold with
tunnels it does not read.

An attack review: a cell opened the 256 tunnels the proxy allowed to an
origin sending without end, wrote into them and read nothing; each tunnel
buffered about 3.7 MiB in the kernel's process (a 256 KiB read, a reader
pausing only past 512 KiB, a 1 MiB write buffer, both ways), and the real
kernel grew from 56 to 1,011 MiB, outside every limit of the sandbox. The
buffers are now 64 KiB and the tunnels 64 at once: the same cell makes the
proxy hold a few tens of MiB.

The proxy runs in a process of its own here, so that its resident size is
what it holds; the origin is on 127.0.0.1, reached through the tests'
name override.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sandbox_kernel.network import EgressProxy

#: what the proxy may grow by with every tunnel it allows held open unread
BOUND_MIB = 96

PROXY = """
import asyncio, sys
from pathlib import Path
from sandbox_kernel.network import EgressLog, EgressPolicy, EgressProxy

async def main():
    proxy = EgressProxy(
        Path(sys.argv[1]),
        EgressPolicy(allow=["*.test"], allow_addresses=["127.0.0.1"], connect_ports=[int(sys.argv[2])]),
        EgressLog(),
        name_overrides={"big.test": ["127.0.0.1"]}, token="t0ken",
    )
    await proxy.start()
    print("ready", proxy.max_connections, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class _Blaster:
    """An origin on 127.0.0.1 that sends without end and reads nothing."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        data = b"x" * (1 << 20)
        with conn:
            conn.settimeout(1)
            while not self.stop.is_set():
                try:
                    conn.sendall(data)
                except TimeoutError:
                    continue
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def test_tunnels_nobody_reads_hold_little_of_the_proxys_memory(tmp_path: Path) -> None:
    assert EgressProxy.__init__.__kwdefaults__["max_connections"] <= 64
    path = tmp_path / "egress.sock"
    origin = _Blaster()
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(path), str(origin.port)], stdout=subprocess.PIPE, text=True
    )
    clients: list[socket.socket] = []
    try:
        assert proxy.stdout is not None
        ready, cap = proxy.stdout.readline().split()
        assert ready == "ready"
        before = _rss_mib(proxy.pid)
        for _ in range(int(cap)):
            client = socket.socket(socket.AF_UNIX)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(str(path))
            client.sendall(b"SK-EGRESS t0ken\r\n" + f"CONNECT big.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
            client.setblocking(False)
            clients.append(client)
        # write upward as long as the proxy takes it (the origin reads
        # nothing), read nothing downward, until the proxy stops growing
        blob, sizes = b"u" * 65536, [before]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for client in clients:
                try:
                    client.send(blob)
                except OSError:
                    pass
            time.sleep(0.2)
            sizes.append(_rss_mib(proxy.pid))
            if len(sizes) > 15 and sizes[-1] - sizes[-15] < 1:
                break
        grown = max(sizes) - before
        assert grown < BOUND_MIB, f"{cap} unread tunnels made the proxy grow by {grown:.0f} MiB"
        assert len(os.listdir(f"/proc/{proxy.pid}/fd")) >= int(cap)  # (they were all open)
    finally:
        proxy.kill()
        proxy.wait()
        for client in clients:
            client.close()
        origin.close()
