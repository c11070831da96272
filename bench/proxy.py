"""The egress proxy's costs, on loopback (PROXIED mode).

    .venv/bin/python bench/proxy.py

1. Latency a small HTTP GET pays for the proxy: median over 500 requests,
   direct to the origin vs through the in-sandbox forwarder and the proxy
   (the path a cell's request takes), each on a new connection.
2. Throughput of one large download (1 GiB) through forwarder + proxy.
3. The ratchet's cut: from ``cut()`` to the moment a client in the middle of
   a streaming download sees its connection end.

The forwarder runs here on the host's loopback (in a sandbox it is the same
code on the sandbox's own loopback). Nothing is asserted: the figures go into
the notes, next to the goals (<= 2 ms, >= 300 MB/s, <= 50 ms).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from sandbox_kernel.network import EgressPolicy, EgressProxy
from sandbox_kernel.worker import proxy_forward

CHUNK = b"\0" * (1 << 20)


def origin() -> tuple[socket.socket, int]:
    """A minimal HTTP origin: /small (21 bytes), /big?N (N bytes), /stream (slow, endless)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(512)

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            path = head.split(b" ", 2)[1].decode()
            if path.startswith("/big"):
                size = int(path.split("?", 1)[1])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                sent = 0
                while sent < size:
                    n = min(len(CHUNK), size - sent)
                    conn.sendall(CHUNK[:n])
                    sent += n
            elif path.startswith("/stream"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                try:
                    while True:
                        conn.sendall(b"s" * 16384)
                        time.sleep(0.001)
                except OSError:
                    return
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 21\r\nConnection: close\r\n\r\nhello from the origin")

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def get(port: int, request: bytes, until_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        out = bytearray()
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return bytes(out)
            out += data


def main() -> None:
    server, port = origin()
    tmp = Path(tempfile.mkdtemp(prefix="sk-bench-", dir="/tmp"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def call(coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop)
        return fut.result(60)

    policy = EgressPolicy(allow=["files.example"], allow_addresses=["127.0.0.1"])
    proxy = EgressProxy(tmp / "proxy.sock", policy, name_overrides={"files.example": ["127.0.0.1"]})
    call(proxy.start())
    listener = proxy_forward.listen(0)
    fport = listener.getsockname()[1]
    proxy_forward.serve(listener, str(proxy.socket_path))

    direct_req = b"GET /small HTTP/1.1\r\nHost: files.example\r\nConnection: close\r\n\r\n"
    proxied_req = f"GET http://files.example:{port}/small HTTP/1.1\r\nHost: files.example\r\n\r\n".encode()
    for _ in range(50):  # warm up
        get(port, direct_req)
        get(fport, proxied_req)
    direct, proxied = [], []
    for _ in range(500):
        t = time.perf_counter()
        get(port, direct_req)
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        reply = get(fport, proxied_req)
        proxied.append(time.perf_counter() - t)
    assert reply.endswith(b"hello from the origin"), reply[:200]
    d, p = statistics.median(direct) * 1000, statistics.median(proxied) * 1000
    print(f"1. small GET: direct {d:.3f} ms, through forwarder + proxy {p:.3f} ms: added {p - d:.3f} ms (goal <= 2 ms)")

    size = 1 << 30
    for label, target, req in (
        ("direct", port, b"GET /big?%d HTTP/1.1\r\nHost: x\r\n\r\n" % size),
        (
            "through forwarder + proxy",
            fport,
            b"GET http://files.example:%d/big?%d HTTP/1.1\r\nHost: x\r\n\r\n" % (port, size),
        ),
    ):
        t = time.perf_counter()
        with socket.create_connection(("127.0.0.1", target)) as sock:
            sock.sendall(req)
            got = 0
            while got < size:
                data = sock.recv(1 << 20)
                if not data:
                    break
                got += len(data)
        elapsed = time.perf_counter() - t
        print(f"2. 1 GiB download {label}: {got / elapsed / 1e6:.0f} MB/s ({elapsed:.2f} s)")

    times = []
    for _ in range(5):
        proxy2 = EgressProxy(tmp / f"cut{len(times)}.sock", policy, name_overrides={"files.example": ["127.0.0.1"]})
        call(proxy2.start())
        lst = proxy_forward.listen(0)
        proxy_forward.serve(lst, str(proxy2.socket_path))
        sock = socket.create_connection(("127.0.0.1", lst.getsockname()[1]))
        sock.sendall(f"GET http://files.example:{port}/stream HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = 0
        while received < 1 << 20:
            received += len(sock.recv(65536))

        async def cut(p: EgressProxy = proxy2) -> float:
            t0 = time.perf_counter()
            p.cut()
            return t0

        t0 = call(cut())
        while True:
            try:
                data = sock.recv(1 << 20)
            except OSError:
                break
            if not data:
                break
        times.append((time.perf_counter() - t0) * 1000)
        sock.close()
        lst.close()
        call(proxy2.stop())
    print(
        f"3. cut to the client's end of a streaming download: median {statistics.median(times):.2f} ms, "
        f"max {max(times):.2f} ms over 5 (goal <= 50 ms)"
    )
    call(proxy.stop())
    server.close()


if __name__ == "__main__":
    main()
