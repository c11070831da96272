"""Loopback-only fixtures for the egress proxy: origin servers on 127.0.0.1,
a proxy on a unix socket in its own event loop thread, and the in-sandbox
forwarder. Names reach the origins only through the proxy's test-only
``name_overrides``; unknown names fail without any DNS query."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from kernel_helpers import LoopbackHTTPServer

from sandbox_kernel.network import EgressLog, EgressPolicy, EgressProxy
from sandbox_kernel.network.egress_rules import IPAddress
from sandbox_kernel.worker import proxy_forward

BIG = 64 * 1024 * 1024


class Origin(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/small"):
            body = b"hello from the origin"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/host"):
            body = str(self.headers.get("Host")).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/big"):
            size = int(self.path.split("=", 1)[1]) if "=" in self.path else BIG
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            sent = 0
            while sent < size:
                n = min(len(chunk), size - sent)
                self.wfile.write(chunk[:n])
                sent += n
        elif self.path.startswith("/slow"):
            # 100 chunks of 64 KiB, 20 ms apart: a download a cut can stop midway
            self.send_response(200)
            self.send_header("Content-Length", str(100 * 65536))
            self.end_headers()
            for _ in range(100):
                try:
                    self.wfile.write(b"s" * 65536)
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.02)
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[::-1])


class OriginServer(LoopbackHTTPServer):
    def __init__(self) -> None:
        super().__init__(Origin)


async def no_dns(host: str, port: int) -> list[IPAddress]:
    raise socket.gaierror(socket.EAI_NONAME, f"{host}: no such name (tests never query DNS)")


class ProxyThread:
    """An EgressProxy in an event loop of its own thread (clients here are blocking)."""

    def __init__(self, socket_path: Path, policy: EgressPolicy, overrides: dict[str, list[str]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.log = EgressLog(socket_path.parent / "egress.jsonl")
        self.proxy = EgressProxy(socket_path, policy, self.log, resolver=no_dns, name_overrides=overrides)
        self.call(self.proxy.start())

    def call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(10)

    def cut(self) -> int:
        async def do() -> int:
            return self.proxy.cut()

        return int(self.call(do()))

    def close(self) -> None:
        self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.log.close()


class Forwarder:
    """The in-sandbox forwarder, here on the host's loopback, port chosen by the kernel."""

    def __init__(self, socket_path: Path, token: str) -> None:
        self.server = proxy_forward.listen(0)
        self.port = self.server.getsockname()[1]
        proxy_forward.serve(self.server, str(socket_path), token)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.close()


def raw_request(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes to the forwarder and read until the proxy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def iter_setup(tmp_path: Path) -> Iterator[tuple[OriginServer, ProxyThread, Forwarder]]:
    origin = OriginServer()
    policy = EgressPolicy(
        allow=["files.example", "*.test"],
        deny=["blocked.test"],
        allow_addresses=["127.0.0.1"],
        connect_ports=[443, origin.port],
    )
    overrides = {
        "files.example": ["127.0.0.1"],
        "pkgs.test": ["127.0.0.1"],
        "blocked.test": ["127.0.0.1"],
        "rebind.test": ["127.0.0.1", "10.1.2.3"],
        "meta.test": ["169.254.169.254"],
        "other.example": ["127.0.0.1"],
    }
    proxy = ProxyThread(tmp_path / "egress.sock", policy, overrides)
    forwarder = Forwarder(tmp_path / "egress.sock", proxy.proxy.token)
    try:
        yield origin, proxy, forwarder
    finally:
        forwarder.close()
        proxy.close()
        origin.close()
