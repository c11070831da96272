"""The host-side egress proxy of a PROXIED sandbox: HTTP CONNECT and plain HTTP forwarding.

It listens on a unix socket only (bind-mounted into the sandbox; never a TCP
port of the host), resolves names itself (the sandbox has no DNS), decides
each connection with an :class:`~.egress_rules.EgressPolicy`, connects only
to the addresses it checked (no second resolution a rebinding DNS could
answer differently), pumps bytes, and logs every connection.

``cut()`` is the ratchet's instant, lossless cut: every open tunnel and
forward is aborted at once and every later request is refused with 403;
the sandbox and every object in it stay as they were. There is no way back.

A small asyncio proxy rather than a library: proxy.py and mitmproxy listen
on TCP, bring plug-in systems and TLS interception we must not have, and
would still need this policy, pinning and cut; aiohttp is not a dependency.
Plain HTTP requests are forwarded with ``Connection: close`` toward the
origin (one request per proxy connection: clients see the close and open a
new connection, which keeps the parser small and every request logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .egress_log import EgressEntry, EgressLog, now_iso
from .egress_rules import Decision, EgressPolicy, IPAddress, normalise_name, parse_address

log = logging.getLogger("sandbox_kernel.network")

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

MAX_HEADER = 64 * 1024
#: a tunnel's read size, reader limit (it pauses past twice this) and write
#: buffer, each way: what it may hold in the kernel's process. At 256 KiB and
#: a 1 MiB write buffer, 256 tunnels a cell opened and never read held about
#: 1 GB there (an attack review); at 64 KiB, 64 tunnels hold about 32 MiB
CHUNK = 64 * 1024
#: dropped toward the origin (the body is passed through unchanged, so
#: Transfer-Encoding stays: its chunks are still the client's)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "upgrade"}
)
CUT_RULE = "no network: the session holds private data"
#: a connection that did not open with the proxy's secret: another sandbox's
FOREIGN_RULE = "refused: this egress proxy serves another sandbox"
#: what a request's method may be (the log shows it; HTTP methods are short tokens)
_METHOD = re.compile(r"[A-Z]{1,20}\Z")
#: the characters a host name may have (IDNA names arrive as xn--)
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]{1,253}\Z")
#: the characters an IP literal may have (never a zone id: ``%`` is refused)
_ADDRESS_CHARS = re.compile(r"[0-9A-Fa-f:.]{2,45}\Z")
#: how much of a refused request's text the log and the reply quote
SHOWN = 200


class _BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for ``host`` (TCP)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[IPAddress] = []
    for info in infos:
        address = parse_address(str(info[4][0]))
        if address is not None and address not in out:
            out.append(address)
    return out


class _Connection:
    """One client connection and, once connected, its upstream."""

    def __init__(self, client: asyncio.StreamWriter, entry: EgressEntry) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        #: what the egress log will say of it, and whether it said it
        self.entry = entry
        self.started = time.monotonic()
        self.recorded = False

    def abort(self) -> None:
        """Close both ends now. The upstream is reset, not closed: a plain
        close lets the host's kernel go on sending what the sandbox had
        queued in the socket (up to its 4 MiB send buffer), and an origin
        reading slowly was still receiving it 10 s after the cut (an attack
        review). With a zero linger the kernel drops the queue and resets."""
        if self.upstream is not None:
            sock = self.upstream.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass  # (closed already)
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class EgressProxy:
    """One session's proxy (see the module docstring)."""

    def __init__(
        self,
        socket_path: Path,
        policy: EgressPolicy | None = None,
        egress_log: EgressLog | None = None,
        *,
        resolver: Resolver | None = None,
        name_overrides: Mapping[str, Sequence[str]] | None = None,
        connect_timeout: float = 10.0,
        header_timeout: float = 30.0,
        socket_mode: int = 0o666,
        max_connections: int = 64,
        token: str | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        #: the secret that opens each connection (``proxy_forward.preamble``):
        #: the socket is reachable by any process of the sandboxes' uid that
        #: can see the folder, and serves only the sandbox given the secret
        self.token = token or secrets.token_hex(16)
        self._preamble = b"SK-EGRESS " + self.token.encode("ascii") + b"\r\n"
        self.policy = policy or EgressPolicy()
        self.log = egress_log or EgressLog()
        self._resolver = resolver or system_resolver
        #: fixed answers for names (tests point names at 127.0.0.1 servers; a
        #: deployment may pin a mirror); the policy still checks them
        self.name_overrides = {k.lower().rstrip("."): list(v) for k, v in (name_overrides or {}).items()}
        self.connect_timeout = connect_timeout
        self.header_timeout = header_timeout
        self.socket_mode = socket_mode
        #: open connections a sandbox may hold at once: each costs the host's
        #: process two descriptors, and a sandbox must not exhaust them
        self.max_connections = max_connections
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()
        #: connections over the cap being answered 503 (at most as many again)
        self._refusing = 0
        self._cut = False
        self.cut_at: float | None = None

    # ---- life cycle ------------------------------------------------------------------
    async def start(self) -> None:
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path), limit=MAX_HEADER)
        os.chmod(self.socket_path, self.socket_mode)  # the sandbox's uid connects to it

    async def stop(self) -> None:
        """Close the listener and every connection (the session ends). The
        connections still open are written in the egress log first: their
        handlers end after the session closed the log, and a tunnel kept open
        by its origin (20 MiB sent through it, in an attack review) was in no
        log at all."""
        for conn in list(self._connections):
            self._record(conn)
            conn.abort()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> int:
        """Abort every open connection now and refuse every later one; the
        number of connections closed. One-way: nothing re-opens the proxy."""
        self._cut = True
        if self.cut_at is None:
            self.cut_at = time.monotonic()
        connections = list(self._connections)
        for conn in connections:
            conn.abort()
        return len(connections)

    def update_policy(self, policy: EgressPolicy) -> None:
        self.policy = policy

    def stats(self) -> dict[str, Any]:
        return {"open": len(self._connections), "cut": self._cut, **self.log.summary()}

    # ---- one connection -------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.max_connections:
            if self._refusing >= self.max_connections:
                # Refusals are bounded too: each waited up to a second for the
                # client's request, holding its descriptor, and a sandbox
                # opening idle connections in a loop took the proxy's process
                # (the kernel's) past 8,000 descriptors (an attack review).
                writer.transport.abort()
                return
            self._refusing += 1
            try:
                rule = f"more than {self.max_connections} connections at once"
                # what the forwarder sent at once (its opening line, the request)
                # is read first: closing a unix socket with unread bytes resets
                # it, and the client lost the 503 to the reset
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
                await self._respond(writer, 503, rule, rule)
                writer.transport.abort()
            finally:
                self._refusing -= 1
            return
        entry = EgressEntry(time=now_iso(), method="?", host="", port=0, allowed=False, rule="")
        conn = _Connection(writer, entry)
        self._connections.add(conn)
        try:
            await self._serve(conn, reader, writer, entry)
        except _BadRequest as exc:
            entry.rule = entry.rule or str(exc)
            await self._respond(writer, exc.status, str(exc), entry.rule)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # either side went away (or cut() aborted it)
        except Exception:  # never let one connection take the proxy down
            log.exception("egress proxy: connection failed")
        finally:
            self._connections.discard(conn)
            if self._cut:
                conn.abort()
            else:
                self._close(conn)
            self._record(conn)

    def _record(self, conn: _Connection) -> None:
        """Write the connection's line in the egress log, once."""
        if conn.recorded:
            return
        conn.recorded = True
        conn.entry.duration = round(time.monotonic() - conn.started, 4)
        if conn.entry.method != "?" or conn.entry.rule:
            self.log.record(conn.entry)

    @staticmethod
    def _close(conn: _Connection) -> None:
        for w in (conn.client, conn.upstream):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.close()

    async def _serve(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, entry: EgressEntry
    ) -> None:
        if not await self._opened_by_owner(reader, entry):
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.header_timeout)
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, f"request headers larger than {MAX_HEADER} bytes") from None
        except asyncio.TimeoutError:
            raise _BadRequest(408, f"no complete request within {self.header_timeout:g} s") from None
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return  # connected and left
            raise _BadRequest(400, "the request ended before its headers did") from None
        method, target, version, headers = _parse_head(head)
        entry.method = method
        try:
            host, port = _destination(method, target)
        except _BadRequest:
            entry.host = _shown(target)  # what was asked, escaped and bounded: never raw text of the sandbox's
            raise
        entry.host, entry.port = host, port
        if self._cut:
            entry.rule = CUT_RULE
            await self._respond(writer, 403, CUT_RULE, CUT_RULE)
            return
        decision, addresses = await self._decide(host, port)
        if decision.allowed and method == "CONNECT":  # (the destination's own rule first: it says more)
            decision = self.policy.check_tunnel(port) or decision
        entry.allowed, entry.rule = decision.allowed, decision.rule
        if not decision.allowed:
            await self._respond(writer, 403, f"connection to {host}:{port} refused: {decision.rule}", decision.rule)
            return
        if self._cut:  # the ratchet rose while the name resolved: no connection is even opened
            entry.allowed, entry.rule = False, CUT_RULE
            await self._respond(writer, 403, CUT_RULE, CUT_RULE)
            return
        upstream_reader, upstream_writer = await self._connect(addresses, port, entry)
        if self._cut:  # the ratchet rose while we connected
            upstream_writer.transport.abort()
            entry.allowed, entry.rule = False, CUT_RULE
            await self._respond(writer, 403, CUT_RULE, CUT_RULE)
            return
        conn.upstream = upstream_writer
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            entry.status = "200"
            await writer.drain()
            await self._pump(reader, writer, upstream_reader, upstream_writer, entry)
        else:
            upstream_writer.write(_origin_request(method, target, version, headers))

            async def relay_head() -> None:
                await self._relay_response_head(upstream_reader, writer, entry)

            await self._pump(reader, writer, upstream_reader, upstream_writer, entry, before_down=relay_head)

    async def _opened_by_owner(self, reader: asyncio.StreamReader, entry: EgressEntry) -> bool:
        """Whether the connection opens with this proxy's secret (False: it
        was answered, or the client left before a line)."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.header_timeout)
        except asyncio.LimitOverrunError:
            line = b""
        except asyncio.TimeoutError:
            raise _BadRequest(408, f"no complete request within {self.header_timeout:g} s") from None
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return False
            line = b""
        if hmac.compare_digest(line, self._preamble):
            return True
        entry.rule = FOREIGN_RULE
        raise _BadRequest(403, FOREIGN_RULE)

    async def _relay_response_head(
        self, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter, entry: EgressEntry
    ) -> None:
        """Pass the origin's response head on with ``Connection: close``, so the
        client does not send a second request on this (one-request) connection."""
        try:
            head = await asyncio.wait_for(upstream.readuntil(b"\r\n\r\n"), self.header_timeout)
        except asyncio.LimitOverrunError:
            raise _BadRequest(502, f"the origin's response headers exceed {CHUNK} bytes") from None
        except (asyncio.TimeoutError, asyncio.IncompleteReadError):
            raise _BadRequest(502, f"{entry.host} sent no complete response") from None
        lines = head.decode("latin-1").split("\r\n")
        entry.status = lines[0].split(" ")[1] if lines[0].count(" ") >= 1 else ""
        kept = [
            line for line in lines[1:] if line and line.split(":", 1)[0].strip().lower() not in HOP_BY_HOP - {"upgrade"}
        ]
        out = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        entry.bytes_down += len(head)
        writer.write(out)

    async def _decide(self, host: str, port: int) -> tuple[Decision, list[IPAddress]]:
        literal = parse_address(host)
        if literal is not None:
            addresses = [literal]
        else:
            try:  # a refused name is never even resolved
                by_name = self.policy.check_name(normalise_name(host))
            except ValueError as exc:
                raise _BadRequest(400, str(exc)) from None
            if not by_name.allowed:
                return by_name, []
            try:  # the name checked is the name resolved (its IDNA 2008 form)
                addresses = await self._resolve(normalise_name(host), port)
            except (OSError, UnicodeError, ValueError) as exc:
                raise _BadRequest(502, f"cannot resolve {host}: {exc}") from None
        try:
            return self.policy.check(host, addresses), addresses
        except ValueError as exc:
            raise _BadRequest(400, str(exc)) from None

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        override = self.name_overrides.get(host.lower().rstrip("."))
        if override is not None:
            return [a for a in (parse_address(x) for x in override) if a is not None]
        return await asyncio.wait_for(self._resolver(host, port), self.connect_timeout)

    async def _connect(
        self, addresses: list[IPAddress], port: int, entry: EgressEntry
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        last: BaseException | None = None
        for address in addresses:  # only addresses the policy checked
            try:
                r, w = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=CHUNK), self.connect_timeout
                )
            except asyncio.TimeoutError:
                last = TimeoutError(f"no answer within {self.connect_timeout:g} s")
                continue
            except OSError as exc:
                last = exc
                continue
            entry.address = str(address)
            return r, w
        status = 504 if isinstance(last, TimeoutError) else 502
        raise _BadRequest(status, f"cannot connect to {entry.host}:{port}: {last}")

    @staticmethod
    async def _pump(
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        entry: EgressEntry,
        before_down: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        for w in (client_w, up_w):
            w.transport.set_write_buffer_limits(high=CHUNK)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                if not up and before_down is not None:
                    await before_down()
                while True:
                    data = await src.read(CHUNK)
                    if not data:
                        break
                    dst.write(data)
                    if up:
                        entry.bytes_up += len(data)
                    else:
                        entry.bytes_down += len(data)
                    await dst.drain()
            finally:
                with contextlib.suppress(Exception):
                    if dst.can_write_eof():
                        dst.write_eof()

        up = asyncio.ensure_future(pipe(client_r, up_w, True))
        down = asyncio.ensure_future(pipe(up_r, client_w, False))
        try:
            # The origin finishing ends the exchange; the client finishing
            # sending (a half-close) still waits for the origin's answer.
            done, _ = await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
            if down not in done:
                await asyncio.wait([down])
            error = down.exception() if not down.cancelled() else None
            if isinstance(error, _BadRequest):
                raise error
        finally:
            for task in (up, down):
                task.cancel()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, message: str, rule: str) -> None:
        reasons = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 431: "Request Header Fields Too Large"}
        reasons.update({502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"})
        body = f"sandbox_kernel egress proxy: {message}\n".encode()
        head = (
            f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Sandbox-Egress-Rule: {_header_safe(rule)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        with contextlib.suppress(Exception):
            writer.write(head + body)
            await writer.drain()


def _header_safe(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)[:300]


def _shown(text: str) -> str:
    """``text`` quoted, every non-ASCII or control character escaped and at most
    :data:`SHOWN` characters of it: how a refused request appears in the log and
    the reply, so a sandbox cannot write lines or terminal escapes into either."""
    return ascii(text[:SHOWN]) + ("..." if len(text) > SHOWN else "")


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        raise _BadRequest(400, "the request is not text") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(400, f"malformed request line {_shown(lines[0])}")
    method, target, version = parts
    if not _METHOD.match(method):
        raise _BadRequest(400, f"malformed method {_shown(method)}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if "\n" in line or "\r" in line or "\x00" in line:
            # an origin reading a bare LF as a line end saw headers this proxy
            # did not (a second "Connection: keep-alive" kept the connection
            # open for an unlogged second request: an attack review)
            raise _BadRequest(400, f"bare line break or NUL in header line {_shown(line)}")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(400, f"malformed header line {_shown(line)}")
        headers.append((name, value.strip()))
    return method, target, version, headers


def _destination(method: str, target: str) -> tuple[str, int]:
    """The host and port a request asks for, checked to be a host name or an IP
    literal before anything is logged or decided (400 otherwise)."""
    if not target.isprintable():
        raise _BadRequest(400, "control or non-printable character in the request target")
    if method == "CONNECT":
        host, port = _split_authority(target, None)
    else:
        try:  # (an unclosed ``[`` is a ValueError of urlsplit's own)
            url = urlsplit(target)
        except ValueError as exc:
            raise _BadRequest(400, f"{exc} in {_shown(target)}") from None
        try:
            host, port = url.hostname or "", url.port or 80
        except ValueError:
            raise _BadRequest(400, f"bad port in {_shown(target)}") from None
        if url.scheme.lower() != "http" or not host:
            raise _BadRequest(
                400,
                "only absolute http:// URLs (plain HTTP) and CONNECT (HTTPS and other TLS) go through this proxy",
            )
    return _checked_host(host, target), port


def _checked_host(host: str, target: str) -> str:
    """``host`` if it is a host name or an IP literal; anything else (control
    characters, spaces, ``%`` zones, overlong text) is a 400 naming it, escaped."""
    if _NAME_CHARS.match(host):
        with contextlib.suppress(ValueError):
            normalise_name(host)
            return host
    elif _ADDRESS_CHARS.match(host):
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return host
    raise _BadRequest(400, f"not a host name or IP address in {_shown(target)}")


def _split_authority(target: str, default_port: int | None) -> tuple[str, int]:
    host, sep, port_text = target.rpartition(":")
    if not sep:
        host, port_text = target, ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text and default_port is None:
        raise _BadRequest(400, f"CONNECT needs host:port, got {_shown(target)}")
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise _BadRequest(400, f"bad port in {_shown(target)}")
    port = int(port_text) if port_text else int(default_port or 0)
    if not host or not 0 < port < 65536:
        raise _BadRequest(400, f"bad host or port in {_shown(target)}")
    return host, port


def _origin_request(method: str, target: str, version: str, headers: list[tuple[str, str]]) -> bytes:
    url = urlsplit(target)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    # The Host the origin gets is the one checked and logged: the client's own
    # (``GET http://files.example/`` with ``Host: blocked.test``) reached a
    # denied site on a shared host, logged as the allowed one.
    kept = [
        (k, v)
        for k, v in headers
        if k.lower() not in HOP_BY_HOP and not k.lower().startswith("proxy-") and k.lower() != "host"
    ]
    kept.insert(0, ("Host", url.netloc.rsplit("@", 1)[-1]))
    lines = [f"{method} {path} {version}", *(f"{k}: {v}" for k, v in kept), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


__all__ = ["CUT_RULE", "EgressProxy", "system_resolver"]
