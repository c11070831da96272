"""The egress proxy against origins on 127.0.0.1: what goes, what is refused, the log, the cut.

Refused addresses (10.x, 169.254.169.254...) are refused before any connect,
and the tests that name public IP literals divert the proxy's connect to the
loopback origin (the ``diverted`` fixture), so no test ever sends a packet
beyond loopback.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import Forwarder, OriginServer, ProxyThread, iter_setup, raw_request

from sandbox_kernel.network import EgressEntry, EgressLog, EgressPolicy
from sandbox_kernel.network.egress_rules import IPAddress
from sandbox_kernel.network.proxy import CUT_RULE, FOREIGN_RULE
from sandbox_kernel.worker import proxy_forward

Setup = tuple[OriginServer, ProxyThread, Forwarder]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    yield from iter_setup(tmp_path)


def opener(forwarder: Forwarder) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": forwarder.url, "https": forwarder.url}))


def get(forwarder: Forwarder, url: str) -> tuple[int, bytes, str]:
    try:
        with opener(forwarder).open(url, timeout=10) as response:
            return response.status, response.read(), ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("X-Sandbox-Egress-Rule", "")


def test_allowed_name_through_forwarder_and_proxy(setup: Setup) -> None:
    origin, proxy, fwd = setup
    status, body, _ = get(fwd, f"http://files.example:{origin.port}/small")
    assert status == 200 and body == b"hello from the origin"
    status, body, _ = get(fwd, f"http://pkgs.test:{origin.port}/small?x=1")
    assert status == 200
    # a POST body goes through unchanged
    request = urllib.request.Request(f"http://files.example:{origin.port}/echo", data=b"abc123", method="POST")
    with opener(fwd).open(request, timeout=10) as response:
        assert response.read() == b"321cba"


def test_connect_tunnel_carries_bytes(setup: Setup) -> None:
    origin, _, fwd = setup
    request = (
        f"CONNECT files.example:{origin.port} HTTP/1.1\r\nHost: files.example\r\n\r\n"
        f"GET /small HTTP/1.1\r\nHost: files.example\r\nConnection: close\r\n\r\n"
    ).encode()
    reply = raw_request(fwd.port, request)
    assert reply.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.")
    assert reply.endswith(b"hello from the origin")


def test_requests_library_uses_the_proxy(setup: Setup) -> None:
    requests = pytest.importorskip("requests")
    origin, _, fwd = setup
    session = requests.Session()
    session.trust_env = False
    proxies = {"http": fwd.url, "https": fwd.url}
    r = session.get(f"http://files.example:{origin.port}/small", proxies=proxies, timeout=10)
    assert r.status_code == 200 and r.text == "hello from the origin"
    r = session.get(f"http://blocked.test:{origin.port}/small", proxies=proxies, timeout=10)
    assert r.status_code == 403 and r.headers["X-Sandbox-Egress-Rule"] == "deny list: blocked.test"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_uses_the_proxy(setup: Setup) -> None:
    origin, _, fwd = setup
    env = {"PATH": "/usr/bin:/bin", "http_proxy": fwd.url, "HTTPS_PROXY": fwd.url}
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", f"http://files.example:{origin.port}/small"],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    assert out.stdout == "hello from the origin", out.stderr
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
            f"http://meta.test:{origin.port}/",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    assert out.stdout == "403"


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("blocked.test", "deny list: blocked.test"),
        ("other.example", "not in the allow list"),
        ("localhost", "not in the allow list"),
        ("meta.test", "cloud metadata address 169.254.169.254"),
        ("rebind.test", "resolves to a refused address: private address (RFC 1918) 10.1.2.3"),
        ("127.0.0.2", "loopback address 127.0.0.2"),
        ("[::1]", "loopback address ::1"),
        ("10.0.0.1", "private address (RFC 1918) 10.0.0.1"),
        ("169.254.169.254", "cloud metadata address"),
        ("[::ffff:127.0.0.1]", "loopback address ::ffff:7f00:1"),
        ("0.0.0.0", "unspecified"),
        # allow_addresses lifts the loopback class for the allowed names that resolve there,
        # but a literal needs the allow list ('files.example', '*.test') to name it
        ("127.0.0.1", "IP literal 127.0.0.1 is not in the allow list (files.example, *.test)"),
    ],
)
def test_refused_with_a_clear_rule_never_a_hang(setup: Setup, host: str, rule: str) -> None:
    origin, proxy, fwd = setup
    started = time.monotonic()
    status, body, header = get(fwd, f"http://{host}:{origin.port}/small")
    assert status == 403 and rule in header and rule in body.decode()
    assert time.monotonic() - started < 5
    # the same through CONNECT (HTTPS)
    reply = raw_request(fwd.port, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403 ") and rule.encode() in reply
    entry = proxy.log.tail(1)[0]
    assert entry["allowed"] is False and rule in entry["rule"]


def test_unresolvable_malformed_and_oversized(setup: Setup) -> None:
    origin, _, fwd = setup
    status, body, _ = get(fwd, f"http://nowhere.test:{origin.port}/")
    assert status == 502 and b"cannot resolve nowhere.test" in body
    assert raw_request(fwd.port, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_request(fwd.port, b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_request(fwd.port, b"CONNECT files.example HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    for bad_port in (b"99999999", b"x", b"+80"):  # a 400, not an exception that drops the connection unanswered
        request = b"GET http://files.example:" + bad_port + b"/ HTTP/1.1\r\n\r\n"
        assert raw_request(fwd.port, request).startswith(b"HTTP/1.1 400 "), bad_port
    assert raw_request(fwd.port, b"CONNECT files.example:+443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    # an unclosed bracket: urlsplit's own ValueError went unanswered, with a traceback in the kernel's log
    reply = raw_request(fwd.port, b"GET http://[::1/ HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ") and b"Invalid IPv6 URL" in reply, reply
    assert raw_request(fwd.port, b"GET http://files.example/ HTTP/1.1x\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    flood = b"GET http://files.example/ HTTP/1.1\r\n" + b"X-A: " + b"a" * 100_000 + b"\r\n\r\n"
    assert raw_request(fwd.port, flood).startswith(b"HTTP/1.1 431 ")


def test_every_connection_is_logged_with_bytes(setup: Setup, tmp_path: Path) -> None:
    origin, proxy, fwd = setup
    get(fwd, f"http://files.example:{origin.port}/big?size=3000000")
    get(fwd, f"http://blocked.test:{origin.port}/small")
    deadline = time.monotonic() + 10  # a connection is logged when the proxy has closed it, just after the reply
    while len(proxy.log.tail(2)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    allowed, refused = sorted(proxy.log.tail(2), key=lambda entry: not entry["allowed"])
    assert allowed["allowed"] and allowed["host"] == "files.example" and allowed["address"] == "127.0.0.1"
    assert allowed["bytes_down"] >= 3_000_000 and allowed["bytes_up"] == 0 and allowed["method"] == "GET"
    assert not refused["allowed"] and refused["rule"] == "deny list: blocked.test"
    summary = proxy.log.summary()
    assert summary["allowed"] == 1 and summary["refused"] == 1 and summary["domains"] == ["files.example"]
    lines = (tmp_path / "egress.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["host"] for line in lines) == ["blocked.test", "files.example"]
    assert (tmp_path / "egress.jsonl").stat().st_mode & 0o777 == 0o600


def test_a_tunnel_still_open_when_the_proxy_stops_is_logged(setup: Setup, tmp_path: Path) -> None:
    """A connection is logged when it ends, and a tunnel its origin kept open
    ended after the session had closed the log: 20 MiB sent through it, and
    the session's egress log was empty (an attack review, in a kernel)."""
    import socket

    origin, proxy, fwd = setup
    tunnel = socket.create_connection(("127.0.0.1", fwd.port), timeout=10)
    try:
        tunnel.sendall(f"CONNECT files.example:{origin.port} HTTP/1.1\r\n\r\n".encode())
        assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
        tunnel.sendall(b"GET /small HTTP/1.1\r\nHost: files.example\r\n\r\n")
        answer = b""
        while b"hello from the origin" not in answer:
            chunk = tunnel.recv(65536)
            assert chunk, answer
            answer += chunk
        assert proxy.log.tail(5) == []  # still open: nothing logged yet

        async def as_the_session_closes() -> None:  # engine/session.py: the log is closed right after
            await proxy.proxy.stop()
            proxy.log.close()

        proxy.call(as_the_session_closes())
    finally:
        tunnel.close()
    lines = [json.loads(line) for line in (tmp_path / "egress.jsonl").read_text().splitlines()]
    assert [(line["method"], line["host"], line["allowed"]) for line in lines] == [("CONNECT", "files.example", True)]
    assert lines[0]["bytes_up"] > 0 and lines[0]["bytes_down"] > 0, lines


def test_cut_stops_a_download_midway_and_refuses_new_connections(setup: Setup) -> None:
    origin, proxy, fwd = setup
    received: list[int] = []
    ended = threading.Event()
    error: list[BaseException] = []

    def download() -> None:
        try:
            with opener(fwd).open(f"http://files.example:{origin.port}/slow", timeout=20) as response:
                while True:
                    data = response.read(65536)
                    if not data:
                        break
                    received.append(len(data))
        except Exception as exc:  # the cut shows as an incomplete read
            error.append(exc)
        finally:
            ended.set()

    thread = threading.Thread(target=download)
    thread.start()
    deadline = time.monotonic() + 10
    while sum(received) < 5 * 65536 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(received) >= 5 * 65536
    cut_at = time.monotonic()
    assert proxy.cut() == 1
    assert ended.wait(5)
    elapsed = time.monotonic() - cut_at
    thread.join(5)
    assert sum(received) < 100 * 65536, "the download finished despite the cut"
    assert elapsed < 1.0
    status, _, rule = get(fwd, f"http://files.example:{origin.port}/small")
    assert status == 403 and rule == CUT_RULE
    assert proxy.proxy.is_cut


def test_many_concurrent_connections(setup: Setup) -> None:
    origin, _, fwd = setup
    results: list[int] = []

    def one() -> None:
        results.append(get(fwd, f"http://files.example:{origin.port}/big?size=200000")[0])

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200] * 20


def test_a_sandbox_cannot_hold_unbounded_connections(setup: Setup) -> None:
    """Each open connection costs the host's process descriptors: beyond the cap, 503."""
    origin, proxy, fwd = setup
    proxy.proxy.max_connections = 5
    import socket

    held = [socket.create_connection(("127.0.0.1", fwd.port)) for _ in range(5)]
    try:
        deadline = time.monotonic() + 5
        while proxy.proxy.stats()["open"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        reply = raw_request(fwd.port, f"GET http://files.example:{origin.port}/small HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 503 ") and b"more than 5 connections at once" in reply
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while proxy.proxy.stats()["open"] and time.monotonic() < deadline:
        time.sleep(0.01)
    status, _, _ = get(fwd, f"http://files.example:{origin.port}/small")
    assert status == 200


def test_refusals_over_the_cap_hold_no_descriptor_for_long(setup: Setup) -> None:
    """A connection over the cap waited up to a second for its request before
    its 503, holding a descriptor of the proxy's process (the kernel's): a
    sandbox opening idle connections in a loop took that process past 8,000
    (an attack review). At most as many refusals as the cap wait; the rest
    are closed at once."""
    import socket

    _, proxy, _ = setup
    proxy.proxy.max_connections = 5
    path = str(proxy.proxy.socket_path)

    def connected() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    held = [connected() for _ in range(5)]
    try:
        deadline = time.monotonic() + 5
        while proxy.proxy.stats()["open"] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        idle = [connected() for _ in range(100)]  # over the cap, sending nothing
        time.sleep(0.5)  # (under the second a refusal waits for its request)
        closed = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass  # still held by the proxy
            except ConnectionResetError:
                closed += 1
            sock.close()
        assert closed >= 95, f"the proxy still held {100 - closed} of 100 idle connections over its cap"
    finally:
        for sock in held:
            sock.close()


def unix_request(path: Path, data: bytes) -> bytes:
    """Send raw bytes straight to the proxy's socket (as a process seeing it does)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(data)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_the_proxy_serves_only_the_sandbox_holding_its_secret(setup: Setup, tmp_path: Path) -> None:
    """Every session's proxy socket is under the host's /tmp: a sandbox that
    could see another session's socket sent a private session's data out
    through it (an attack review, with a workspace that was /tmp). Each
    connection now opens with the session's secret, which only its own
    sandbox's environment holds."""
    origin, proxy, fwd = setup
    socket_path = tmp_path / "egress.sock"
    request = f"GET http://files.example:{origin.port}/small HTTP/1.1\r\nHost: files.example\r\n\r\n".encode()
    connect = f"CONNECT files.example:{origin.port} HTTP/1.1\r\nHost: files.example\r\n\r\n".encode()
    other = ProxyThread(tmp_path / "other.sock", proxy.proxy.policy, {"files.example": ["127.0.0.1"]})
    try:
        assert other.proxy.token != proxy.proxy.token and len(proxy.proxy.token) >= 32
        refused = [
            unix_request(socket_path, request),  # no secret
            unix_request(socket_path, connect),
            unix_request(socket_path, proxy_forward.preamble(other.proxy.token) + request),  # another session's
            unix_request(socket_path, proxy_forward.preamble(proxy.proxy.token[:-1]) + request),
            unix_request(socket_path, proxy_forward.preamble(proxy.proxy.token).rstrip() + b"x\r\n" + request),
        ]
        for reply in refused:
            assert reply.startswith(b"HTTP/1.1 403 ") and FOREIGN_RULE.encode() in reply, reply[:200]
        ok = unix_request(socket_path, proxy_forward.preamble(proxy.proxy.token) + request)
        assert ok.startswith(b"HTTP/1.") and ok.endswith(b"hello from the origin")
        status, body, _ = get(fwd, f"http://files.example:{origin.port}/small")  # its own sandbox's forwarder
        assert status == 200 and body == b"hello from the origin"
    finally:
        other.close()
    deadline = time.monotonic() + 10  # (logged as each connection closes; repeated refusals are counted)
    while proxy.log.summary()["allowed"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    entries = proxy.log.tail(10)
    assert sum(e.get("count", 1) for e in entries if e["rule"] == FOREIGN_RULE) == 5, entries
    assert proxy.log.summary()["refused"] == 5 and proxy.log.summary()["allowed"] == 2


# ---- IP literals against a domain allow list --------------------------------------------

PUBLIC_V4 = "93.184.216.34"
PUBLIC_V6 = "2606:2800:220:1::1"
Diverted = tuple[OriginServer, ProxyThread, Forwarder, list[str]]


@pytest.fixture
def diverted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Diverted]:
    """A proxy (allow list: pypi.org, *.pythonhosted.org; a test may replace it)
    whose connects are diverted to the loopback origin.

    The diversion records every address the proxy decided to reach and connects
    to 127.0.0.1 instead: a public literal the policy lets through (rightly or,
    on the old code, wrongly) reaches the test's origin, and no packet leaves
    loopback whatever the code under test decides."""
    origin = OriginServer()
    proxy = ProxyThread(tmp_path / "egress.sock", EgressPolicy(allow=["pypi.org", "*.pythonhosted.org"]), {})
    attempts: list[str] = []
    real_connect = proxy.proxy._connect

    async def divert(addresses: list[IPAddress], port: int, entry: EgressEntry) -> Any:
        attempts.extend(str(address) for address in addresses)
        return await real_connect([ipaddress.ip_address("127.0.0.1")], port, entry)

    monkeypatch.setattr(proxy.proxy, "_connect", divert)
    forwarder = Forwarder(tmp_path / "egress.sock", proxy.proxy.token)
    try:
        yield origin, proxy, forwarder, attempts
    finally:
        forwarder.close()
        proxy.close()
        origin.close()


def tunnel_get(fwd: Forwarder, authority: str) -> bytes:
    """CONNECT to ``authority``, then a plain GET /small inside the tunnel."""
    request = f"CONNECT {authority} HTTP/1.1\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    return raw_request(fwd.port, request.encode())


@pytest.mark.parametrize(("host", "address"), [(PUBLIC_V4, PUBLIC_V4), (f"[{PUBLIC_V6}]", PUBLIC_V6)])
def test_a_public_ip_literal_does_not_bypass_the_domain_allow_list(diverted: Diverted, host: str, address: str) -> None:
    """allow=['pypi.org', '*.pythonhosted.org']: a sandbox must not reach any
    server by naming its address, through CONNECT or an absolute URL."""
    origin, proxy, fwd, attempts = diverted
    rule = f"IP literal {address} is not in the allow list (pypi.org, *.pythonhosted.org)"
    reply = tunnel_get(fwd, f"{host}:{origin.port}")
    assert reply.startswith(b"HTTP/1.1 403 ") and rule.encode() in reply, reply[:300]
    status, body, header = get(fwd, f"http://{host}:{origin.port}/small")
    assert status == 403 and header == rule and rule in body.decode()
    # a Host header naming an allowed domain changes nothing: the URL's host is the destination
    raw = f"GET http://{host}:{origin.port}/small HTTP/1.1\r\nHost: pypi.org\r\n\r\n"
    assert raw_request(fwd.port, raw.encode()).startswith(b"HTTP/1.1 403 ")
    assert attempts == [], "the proxy tried to connect"
    entries = proxy.log.tail(3)  # the two identical GET refusals are one entry counting both
    assert [(e["method"], e["host"], e["allowed"], e["rule"], e["count"]) for e in entries] == [
        ("CONNECT", address, False, rule, 1),
        ("GET", address, False, rule, 2),
    ]


@pytest.mark.parametrize(
    ("allow", "rule_v4", "rule_v6"),
    [
        ([PUBLIC_V4, f"[{PUBLIC_V6}]"], f"allow list: {PUBLIC_V4}", f"allow list: {PUBLIC_V6}"),
        (["*"], "allow list: *", "allow list: *"),
    ],
)
def test_a_listed_literal_or_star_still_goes(diverted: Diverted, allow: list[str], rule_v4: str, rule_v6: str) -> None:
    origin, proxy, fwd, attempts = diverted
    proxy.proxy.update_policy(EgressPolicy(allow=allow, connect_ports=[origin.port]))
    status, body, _ = get(fwd, f"http://{PUBLIC_V4}:{origin.port}/small")
    assert status == 200 and body == b"hello from the origin"
    reply = tunnel_get(fwd, f"[{PUBLIC_V6}]:{origin.port}")
    assert reply.startswith(b"HTTP/1.1 200 Connection established") and reply.endswith(b"hello from the origin")
    assert attempts == [PUBLIC_V4, PUBLIC_V6]
    deadline = time.monotonic() + 5  # logged when the proxy has closed the connection
    while len(proxy.log.tail(2)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    rules = sorted((e["host"], e["allowed"], e["rule"]) for e in proxy.log.tail(2))
    assert rules == sorted([(PUBLIC_V4, True, rule_v4), (PUBLIC_V6, True, rule_v6)])


# ---- what a sandbox can write into the egress log ----------------------------------------

#: request heads a sandbox can send: forged log lines (LF, TAB), terminal escapes
#: (ESC, OSC, BEL), a C1 line break (NEL, 0x85), and overlong host, zone or method
INJECTIONS = {
    "lf-tab-osc": b"CONNECT x\n2099-01-01T00:00:00.000Z\tallowed\tCONNECT\tpypi.org:443\x1b]0;pwned\x07\x1b[31m:443",
    "esc-in-url": b"GET http://a\x1b[2J.test/small",
    "c1-line-break": b"CONNECT files.example\x85forged.test:443",
    "overlong-host": b"CONNECT " + b"a" * 60_000 + b".test:443",
    "overlong-zone": b"CONNECT [fe80::1%" + b"A" * 60_000 + b"]:443",
    "overlong-method": b"X" * 60_000 + b" http://files.example:1/small",
}


@pytest.mark.parametrize("cut", [False, True], ids=["open", "after-the-cut"])
@pytest.mark.parametrize("line", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_a_request_cannot_write_lines_or_escapes_into_the_log(
    setup: Setup, tmp_path: Path, line: bytes, cut: bool
) -> None:
    """The request is refused with 400 before its text is logged, and what is logged
    (and replied) is escaped and bounded, before and after the ratchet's cut: a
    private sandbox must not fill the host's egress.jsonl with 64 KiB entries."""
    _, proxy, fwd = setup
    if cut:
        proxy.cut()
    reply = raw_request(fwd.port, line + b" HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    body = reply.split(b"\r\n\r\n", 1)[1].decode("latin-1").rstrip("\n")
    assert body.isprintable() and len(body) < 1000
    logged = (tmp_path / "egress.jsonl").read_text().splitlines()
    assert len(logged) == 1 and len(logged[0]) < 2000
    entry = json.loads(logged[0])
    assert entry["allowed"] is False and entry["rule"]
    for key in ("time", "method", "host", "rule", "address", "status"):
        assert entry[key].isprintable(), (key, entry[key][:200])
    assert len(entry["host"]) <= 260 and len(entry["method"]) <= 20


def test_the_log_escapes_and_bounds_what_it_is_given(tmp_path: Path) -> None:
    """Second wall: whatever the proxy hands it, the log keeps no control character
    and no overlong field (an entry's text comes from a sandbox)."""
    log = EgressLog(tmp_path / "egress.jsonl")
    forged = "x\n2099 allowed GET pypi.org\x1b]0;pwned\x07\u202e\x85"
    log.record(EgressEntry(time="t", method="GET\n", host=forged + "a" * 1000, port=1, allowed=False, rule=forged))
    log.close()
    entry = json.loads((tmp_path / "egress.jsonl").read_text())
    assert entry["host"].startswith("x\\n2099 allowed GET pypi.org\\x1b]0;pwned\\x07\\u202e\\x85aaa")
    assert entry["host"].endswith("...") and len(entry["host"]) < 300
    assert (
        entry["rule"] == "x\\n2099 allowed GET pypi.org\\x1b]0;pwned\\x07\\u202e\\x85" and entry["method"] == "GET\\n"
    )


def test_the_origin_gets_the_host_that_was_checked_and_one_request_only(setup: Setup) -> None:
    """``GET http://files.example/`` with ``Host: blocked.test`` reached the
    denied name on a shared host, logged as the allowed one; a bare LF in a
    header kept the origin's connection open for an unlogged second request
    (an attack review)."""
    origin, _, fwd = setup
    fronted = raw_request(
        fwd.port, f"GET http://files.example:{origin.port}/host HTTP/1.1\r\nHost: blocked.test\r\n\r\n".encode()
    )
    assert fronted.startswith(b"HTTP/1.1 200") and fronted.endswith(f"files.example:{origin.port}".encode()), fronted
    smuggled = raw_request(
        fwd.port,
        f"GET http://files.example:{origin.port}/small HTTP/1.1\r\nX: a\nConnection: keep-alive\r\n\r\n"
        f"GET /host HTTP/1.1\r\nHost: blocked.test\r\n\r\n".encode(),
    )
    assert smuggled.startswith(b"HTTP/1.1 400") and b"bare line break" in smuggled, smuggled
    assert b"hello from the origin" not in smuggled


def test_a_tunnel_goes_only_to_the_listed_ports(setup: Setup) -> None:
    """What passes inside a tunnel is not read: ``CONNECT files.example:80``
    carried plain requests with ``Host: blocked.test``, as many as it liked,
    logged as one allowed CONNECT (an attack review). Tunnels go to 443 by
    default (``egress_connect_ports``); a plain request to that port still
    goes, checked and one at a time."""
    origin, proxy, fwd = setup
    rules = proxy.proxy.policy
    proxy.proxy.update_policy(EgressPolicy(allow=rules.allow, deny=rules.deny, allow_addresses=rules.allow_addresses))
    fronted = (
        f"CONNECT files.example:{origin.port} HTTP/1.1\r\n\r\n"
        "GET /host HTTP/1.1\r\nHost: blocked.test\r\n\r\nGET /host HTTP/1.1\r\nHost: blocked.test\r\n\r\n"
    )
    reply = raw_request(fwd.port, fronted.encode())
    rule = f"CONNECT only to port 443 (egress_connect_ports), not {origin.port}"
    assert reply.startswith(b"HTTP/1.1 403 ") and rule.encode() in reply and b"blocked.test" not in reply, reply
    status, body, _ = get(fwd, f"http://files.example:{origin.port}/host")
    assert status == 200 and body == f"files.example:{origin.port}".encode()
    deadline = time.monotonic() + 5
    while len(proxy.log.tail(2)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(e["method"], e["allowed"], e["rule"]) for e in proxy.log.tail(2)] == [
        ("CONNECT", False, rule),
        ("GET", True, "allow list: files.example"),
    ]


def test_a_cut_while_a_name_resolves_opens_no_connection(tmp_path: Path) -> None:
    """The rise came while the proxy resolved a name: it then connected
    anyway (the connection was aborted at once, but the origin heard it)."""
    import asyncio
    import socket as sockets

    heard: list[float] = []
    listener = sockets.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def accept() -> None:
        listener.settimeout(5)
        try:
            conn, _ = listener.accept()
            heard.append(time.monotonic())
            conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    proxy = ProxyThread(tmp_path / "egress.sock", EgressPolicy(allow=["slow.test"], allow_addresses=["127.0.0.1"]), {})
    fwd = Forwarder(tmp_path / "egress.sock", proxy.proxy.token)

    async def slow_dns(host: str, port: int) -> list[IPAddress]:
        await asyncio.sleep(1.0)
        return [ipaddress.ip_address("127.0.0.1")]

    proxy.proxy._resolver = slow_dns  # (the resolver is the proxy's hook for names; the helper's resolves none)
    try:
        answer: list[bytes] = []
        asking = threading.Thread(
            target=lambda: answer.append(
                raw_request(fwd.port, f"GET http://slow.test:{port}/ HTTP/1.1\r\n\r\n".encode())
            )
        )
        asking.start()
        time.sleep(0.4)  # resolving
        proxy.cut()
        asking.join(10)
        time.sleep(1.5)  # the name has resolved: the proxy has decided what to do next
        assert answer and not answer[0].startswith(b"HTTP/1.1 200"), answer  # (the cut closed the client)
        assert heard == [], "the origin was connected to after the cut"
    finally:
        fwd.close()
        proxy.close()
        listener.close()


def test_a_cut_drops_what_the_proxy_had_queued_for_the_origin(tmp_path: Path) -> None:
    """The cut closed the upstream socket, and the host's kernel went on
    sending what the sandbox had queued in it before the cut (up to its
    4 MiB send buffer): an origin reading slowly was still receiving it 10 s
    after the cut (an attack review). The upstream is reset now: the origin
    gets at most what already sat in its own receive buffer, then a reset."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got: dict[str, Any] = {"after": 0, "end": None}
    cut_at: list[float] = []

    def slow_origin() -> None:
        conn, _ = server.accept()
        with conn:
            time.sleep(1.5)  # reads nothing meanwhile: the proxy's upstream queue fills
            conn.settimeout(8)
            try:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        got["end"] = "closed after its queue was sent"
                        return
                    if cut_at:
                        got["after"] += len(data)
            except ConnectionResetError:
                got["end"] = "reset"
            except TimeoutError:
                got["end"] = "still open"

    origin = threading.Thread(target=slow_origin, daemon=True)
    origin.start()
    policy = EgressPolicy(allow=["slow.test"], allow_addresses=["127.0.0.1"], connect_ports=[port])
    proxy = ProxyThread(tmp_path / "p.sock", policy, {"slow.test": ["127.0.0.1"]})
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(tmp_path / "p.sock"))
        client.sendall(
            f"SK-EGRESS {proxy.proxy.token}\r\nCONNECT slow.test:{port} HTTP/1.1\r\nHost: slow.test\r\n\r\n".encode()
        )
        assert client.recv(4096).startswith(b"HTTP/1.1 200"), "the tunnel did not open"
        client.settimeout(0.2)
        chunk = b"x" * 65536
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the sandbox writes: the proxy relays what it can
            try:
                client.send(chunk)
            except TimeoutError:
                pass
        assert proxy.cut() == 1
        cut_at.append(time.monotonic())
        origin.join(12)
        client.close()
    finally:
        proxy.close()
        server.close()
    assert got["end"] == "reset", got
    assert got["after"] <= 1 << 20, f"the origin received {got['after']:,} bytes after the cut"
