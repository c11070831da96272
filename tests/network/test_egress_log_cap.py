"""The egress log against a sandbox that asks for refused connections in a loop
(guarantee 7: what a sandbox controls must not grow the host without bound).
An audit saw a cell write 2.1 MB of egress.jsonl in 20 s, one line per refusal.
Now identical refusals are counted, the file is capped, and no refusal goes
uncounted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_helpers import Forwarder, OriginServer, ProxyThread, iter_setup, raw_request

from sandbox_kernel.network import EgressEntry, EgressLog

Setup = tuple[OriginServer, ProxyThread, Forwarder]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    yield from iter_setup(tmp_path)


def use_log(proxy: ProxyThread, log: EgressLog) -> None:
    """Swap the proxy's log for ``log`` (before any request; ``proxy.close()`` closes it)."""
    proxy.log.close()
    proxy.log = proxy.proxy.log = log


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def refuse(fwd: Forwarder, target: str) -> None:
    reply = raw_request(fwd.port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403 "), reply[:200]


def wait_refused(proxy: ProxyThread, n: int) -> None:
    """A connection is logged just after the proxy closed it: wait for the last one."""
    deadline = time.monotonic() + 10
    while proxy.log.summary()["refused"] < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_repeated_refusals_are_counted_not_written_one_line_each(setup: Setup, tmp_path: Path) -> None:
    """300 identical refused CONNECTs (the audit's loop): the old log wrote 300
    lines; now one line is written at once and the repeats are one more line
    with their count, and memory's summary and recent entries say 300."""
    _, proxy, fwd = setup
    n = 300
    for _ in range(n):
        refuse(fwd, "10.1.2.3:1")
    wait_refused(proxy, n)
    summary = proxy.log.summary()
    assert summary["refused"] == n and summary["allowed"] == 0
    recent = proxy.log.tail(5)
    assert len(recent) == 1 and recent[0]["count"] == n and recent[0]["host"] == "10.1.2.3"
    path = tmp_path / "egress.jsonl"
    written = lines(path)
    assert len(written) == 1, f"{len(written)} lines for {n} identical refusals"
    assert written[0]["allowed"] is False and "10.1.2.3" in written[0]["rule"]  # on disk at once
    proxy.log.close()  # the repeats still being counted are written
    written = lines(path)
    assert len(written) == 2 and sum(entry.get("count", 1) for entry in written) == n
    assert all(entry["host"] == "10.1.2.3" and entry["allowed"] is False for entry in written)


def test_the_file_is_capped_when_refusals_vary(setup: Setup, tmp_path: Path) -> None:
    """Varying the target defeats the counting, not the cap: past ``max_bytes`` the
    file is rotated to ``.1`` once, so the disk holds at most twice the cap, the
    newest refusal is in the file and the summary counts them all."""
    _, proxy, fwd = setup
    cap = 4096
    use_log(proxy, EgressLog(tmp_path / "egress.jsonl", max_bytes=cap))
    n = 120  # about 300 bytes a line: some 36 KB uncapped
    for port in range(1, n + 1):
        refuse(fwd, f"10.1.2.3:{port}")
    wait_refused(proxy, n)
    path, older = tmp_path / "egress.jsonl", tmp_path / "egress.jsonl.1"
    assert path.stat().st_size <= cap and older.stat().st_size <= cap
    assert not (tmp_path / "egress.jsonl.2").exists()
    assert older.stat().st_mode & 0o777 == 0o600 and path.stat().st_mode & 0o777 == 0o600
    assert lines(path)[-1]["port"] == n
    ports = [entry["port"] for entry in lines(older) + lines(path)]
    assert ports == sorted(ports) and ports[-1] == n and len(ports) > 10
    assert proxy.log.summary()["refused"] == n


def test_counting_windows_and_what_each_line_stands_for(tmp_path: Path) -> None:
    """A window of counting closes after ``repeat_window`` seconds: its repeats are
    written as one line (at the next entry or read), and the next refusal opens a
    new window with a line of its own. Allowed connections are never merged."""
    now = [0.0]
    path = tmp_path / "egress.jsonl"
    log = EgressLog(path, repeat_window=10, clock=lambda: now[0])

    def refused(t: str) -> EgressEntry:
        return EgressEntry(time=t, method="CONNECT", host="10.1.2.3", port=1, allowed=False, rule="private address")

    for i in range(5):
        log.record(refused(f"t{i}"))
    log.record(EgressEntry(time="a", method="GET", host="files.example", port=80, allowed=True, rule="allow"))
    log.record(EgressEntry(time="b", method="GET", host="files.example", port=80, allowed=True, rule="allow"))
    assert [(e["time"], e["count"]) for e in lines(path)] == [("t0", 1), ("a", 1), ("b", 1)]
    now[0] = 11.0
    assert log.summary()["refused"] == 5  # a read writes the window that has passed
    assert [(e["time"], e["count"]) for e in lines(path)][-1] == ("t4", 4)
    log.record(refused("t5"))
    log.close()
    counted = [(e["time"], e["count"]) for e in lines(path)]
    assert counted == [("t0", 1), ("a", 1), ("b", 1), ("t4", 4), ("t5", 1)]
    assert sum(c for t, c in counted if t.startswith("t")) == 6


def test_bad_limits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        EgressLog(tmp_path / "a.jsonl", max_bytes=10)
    with pytest.raises(ValueError, match="repeat_window"):
        EgressLog(tmp_path / "b.jsonl", repeat_window=-1)
