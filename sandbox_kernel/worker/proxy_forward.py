"""Inside a PROXIED sandbox: a TCP port on the sandbox's own loopback that
forwards to the egress proxy's unix socket. Stdlib only (it runs in the sandbox).

The sandbox has no interface but ``lo``, so ``requests``, ``pip``, ``git``
and ``curl`` reach the internet only through ``HTTP(S)_PROXY`` =
``http://127.0.0.1:<port>``; every byte is carried unchanged to the host's
proxy, which decides, logs and can cut. The listener is bound before the
first cell runs, in the worker's anchor process (which never runs user code).
"""

from __future__ import annotations

import os
import socket
import threading

#: where the host's proxy socket appears inside the sandbox
SOCKET_ENV = "SANDBOX_KERNEL_EGRESS_SOCKET"
PORT_ENV = "SANDBOX_KERNEL_EGRESS_PORT"
#: the session's secret, sent first on each connection (see :func:`preamble`)
TOKEN_ENV = "SANDBOX_KERNEL_EGRESS_TOKEN"
DEFAULT_PORT = 3128
_CHUNK = 256 * 1024


def proxy_env(port: int) -> dict[str, str]:
    """What makes HTTP clients use the proxy: requests/httpx/urllib/pandas read
    HTTP(S)_PROXY (either case), curl the lower-case http_proxy and either
    https_proxy, pip and git the same variables; NO_PROXY keeps the
    sandbox's own loopback direct."""
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        env[name] = env[name.upper()] = url
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1,::1"
    return env


def listen(port: int = DEFAULT_PORT) -> socket.socket:
    """Bind the forwarder's port on the sandbox's loopback (before the first cell)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    server.set_inheritable(False)
    return server


def preamble(token: str) -> bytes:
    """The line that opens each connection to the host's proxy. Every
    session's proxy socket lives under the host's /tmp, and a sandbox that
    can see another session's socket (a workspace that was /tmp, an attack
    review) must not reach the internet through it: each proxy serves only
    the sandbox that holds its secret."""
    return b"SK-EGRESS " + token.encode("ascii") + b"\r\n"


def serve(server: socket.socket, socket_path: str, token: str) -> threading.Thread:
    """Accept connections in a daemon thread; each gets two pump threads."""
    opening = preamble(token)

    def accept_loop() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_bridge, args=(client, socket_path, opening), daemon=True).start()

    thread = threading.Thread(target=accept_loop, name="egress-forwarder", daemon=True)
    thread.start()
    return thread


def _bridge(client: socket.socket, socket_path: str, opening: bytes) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)
        upstream.sendall(opening)
    except OSError:
        client.close()
        upstream.close()
        return
    reverse = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    reverse.start()
    _pump(client, upstream)
    reverse.join()
    client.close()
    upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def start_from_env() -> socket.socket | None:
    """Bind the port named by the environment, if this sandbox is PROXIED."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    return listen(int(os.environ.get(PORT_ENV, DEFAULT_PORT)))


__all__ = [
    "DEFAULT_PORT",
    "PORT_ENV",
    "SOCKET_ENV",
    "TOKEN_ENV",
    "listen",
    "preamble",
    "proxy_env",
    "serve",
    "start_from_env",
]
