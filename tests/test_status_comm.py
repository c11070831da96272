"""The status comm: validation and routing, driven through real ipykernel comms.

The comms here are real ``ipykernel.comm.Comm`` objects created by a real
``ipykernel.comm.CommManager`` from ``comm_open`` / ``comm_msg`` /
``comm_close`` shell messages, exactly as a kernel's shell handlers call it.
Only two things are replaced: ``Comm.publish_msg`` (which would need a running
kernel's iopub socket) records what would have gone to the frontend, and the
provider is a fake (the privacy model has its own tests).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import comm as comm_pkg
import pytest
from ipykernel.comm import CommManager
from ipykernel.comm import comm as ipykernel_comm_module

from sandbox_kernel.status_comm import (
    LEVELS,
    TARGET,
    ProtocolError,
    StatusComm,
    StatusProvider,
    parse_request,
    validate_state,
)

# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


class FakeProvider:
    """A provider with a ratchet that only goes up, recording its callers."""

    def __init__(self) -> None:
        self.level = "PUBLIC"
        self.datasets: list[dict[str, Any]] = []
        self.backend = "bwrap"
        #: what the provider says of its backend's network cut (None: not said)
        self.enforces_network: bool | None = None
        self.egress: dict[str, Any] | None = None
        self.warnings: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.threads: list[str] = []
        self.fail_status: Exception | None = None
        self.fail_mark: Exception | None = None
        self.gate: asyncio.Event | None = None

    def status(self) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        if self.fail_status is not None:
            raise self.fail_status
        private = self.level != "PUBLIC"
        state: dict[str, Any] = {
            "private": private,
            "level": self.level,
            "network": "none" if private else "full",
            "datasets": list(self.datasets),
            "error": None,
            "backend": self.backend,
            "warnings": list(self.warnings),
            "user_id": "alice",
            "session_id": "nb-1",
        }
        if self.enforces_network is not None:
            state["enforces_network"] = self.enforces_network
        if self.egress is not None:
            state["egress"] = self.egress
        return state

    async def mark_private(self, level: str, reason: str) -> None:
        self.threads.append(threading.current_thread().name)
        self.calls.append((level, reason))
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        if self.fail_mark is not None:
            raise self.fail_mark
        if LEVELS.index(level) < LEVELS.index(self.level):
            raise ValueError(f"cannot lower {self.level} to {level}")
        if level != self.level:
            self.level = level
            self.datasets.append(
                {"name": "widget", "level": level, "source": "widget", "added_at": "2026-01-01T00:00:00Z"}
            )


class Frontend:
    """Plays the frontend: sends shell messages into the CommManager and
    collects what the kernel published back on each comm."""

    def __init__(self, manager: CommManager, published: list[tuple[str, str, Any]]) -> None:
        self.manager = manager
        self.published = published
        self._n = 0

    def open(self, data: Any = None, comm_id: str | None = None) -> str:
        self._n += 1
        comm_id = comm_id or f"comm-{self._n}"
        if data is None:
            data = {"version": 1, "type": "hello"}
        self.manager.comm_open(None, None, {"content": {"comm_id": comm_id, "target_name": TARGET, "data": data}})
        return comm_id

    def send(self, comm_id: str, data: Any) -> None:
        self.manager.comm_msg(None, None, {"content": {"comm_id": comm_id, "data": data}})

    def close(self, comm_id: str) -> None:
        self.manager.comm_close(None, None, {"content": {"comm_id": comm_id, "data": {}}})

    def received(self, comm_id: str) -> list[dict[str, Any]]:
        return [data for cid, kind, data in self.published if cid == comm_id and kind == "comm_msg"]

    def last(self, comm_id: str) -> dict[str, Any]:
        msgs = self.received(comm_id)
        assert msgs, f"nothing was sent on {comm_id}"
        return msgs[-1]

    def clear(self) -> None:
        self.published.clear()


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CommManager, list[tuple[str, str, Any]]]]:
    # Comms of earlier tests that are still waiting for the garbage collector
    # close themselves when collected; collect them now, before publish_msg is
    # patched, so they cannot publish into this test's list.
    gc.collect()
    manager = CommManager()
    published: list[tuple[str, str, Any]] = []

    def publish_msg(
        self: Any, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
    ) -> None:
        published.append((self.comm_id, msg_type, data))

    monkeypatch.setattr(ipykernel_comm_module.BaseComm, "publish_msg", publish_msg)
    # Comm.close() unregisters itself from the global manager, as in a kernel.
    monkeypatch.setattr(comm_pkg, "get_comm_manager", lambda: manager)
    yield manager, published


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def setup(
    manager: Any, provider: FakeProvider, loop: asyncio.AbstractEventLoop
) -> tuple[StatusComm, Frontend, FakeProvider, asyncio.AbstractEventLoop]:
    mgr, published = manager
    status = StatusComm(mgr, provider, loop=loop)
    return status, Frontend(mgr, published), provider, loop


def run_until(loop: asyncio.AbstractEventLoop, predicate: Any, timeout: float = 5.0) -> None:
    async def wait() -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the kernel's reply")
            await asyncio.sleep(0.001)

    loop.run_until_complete(wait())


def assert_error(msg: dict[str, Any], *words: str, request: str | None = "__any__") -> None:
    assert msg["version"] == 1
    assert msg["type"] == "error", msg
    assert isinstance(msg["message"], str) and msg["message"]
    for word in words:
        assert word in msg["message"], (word, msg["message"])
    if request != "__any__":
        assert msg.get("request") == request, msg


# --------------------------------------------------------------------------
# opening, state, routing
# --------------------------------------------------------------------------


def test_target_is_registered_on_the_given_manager(setup: Any) -> None:
    status, fe, _, _ = setup
    assert TARGET == "sandbox_kernel.status" == StatusComm.TARGET
    assert TARGET in fe.manager.targets


def test_provider_satisfies_protocol() -> None:
    assert isinstance(FakeProvider(), StatusProvider)


def test_open_with_hello_replies_with_state(setup: Any) -> None:
    status, fe, _, _ = setup
    cid = fe.open()
    msgs = fe.received(cid)
    assert len(msgs) == 1
    msg = msgs[0]
    assert msg == {
        "version": 1,
        "type": "state",
        "changed": False,
        "state": {
            "private": False,
            "level": "PUBLIC",
            "network": "full",
            "datasets": [],
            "error": None,
            "backend": "bwrap",
            "enforces_network": True,
            "warnings": [],
            "user_id": "alice",
            "session_id": "nb-1",
        },
    }
    assert status.open_comm_ids == [cid]
    # The comm is a real ipykernel Comm, registered with the manager.
    assert type(fe.manager.comms[cid]).__name__ == "Comm"


def test_request_state(setup: Any) -> None:
    _, fe, provider, _ = setup
    cid = fe.open()
    provider.warnings = ["subprocess backend: no isolation"]
    provider.backend = "subprocess"
    fe.clear()
    fe.send(cid, {"version": 1, "type": "request_state"})
    msg = fe.last(cid)
    assert msg["type"] == "state" and msg["changed"] is False
    assert msg["state"]["backend"] == "subprocess"
    assert msg["state"]["warnings"] == ["subprocess backend: no isolation"]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({}, ["version"]),
        ({"version": 2, "type": "hello"}, ["version 2"]),
        ({"version": 1, "type": "request_state"}, ["must be a hello"]),
        ([1, 2], ["JSON object", "list"]),
    ],
)
def test_open_with_bad_hello_errors_then_sends_state(setup: Any, data: Any, words: list[str]) -> None:
    status, fe, _, _ = setup
    cid = fe.open(data)
    msgs = fe.received(cid)
    assert [m["type"] for m in msgs] == ["error", "state"]
    assert_error(msgs[0], "comm_open", *words)
    assert status.open_comm_ids == [cid]


def test_push_reaches_every_open_comm_marked_changed(setup: Any) -> None:
    status, fe, provider, _ = setup
    a, b = fe.open(), fe.open()
    fe.clear()
    provider.level = "CONFIDENTIAL"
    status.push(notice="Network cut: private data (CONFIDENTIAL) entered this session")
    for cid in (a, b):
        msg = fe.last(cid)
        assert msg["type"] == "state" and msg["changed"] is True
        assert msg["state"]["level"] == "CONFIDENTIAL"
        assert msg["state"]["network"] == "none"
        assert msg["notice"].startswith("Network cut")


def test_push_without_frontend_is_a_noop(setup: Any) -> None:
    status, fe, provider, _ = setup
    status.push()
    assert fe.published == []
    assert provider.threads == []  # not even the provider was asked


def test_closed_comm_is_forgotten(setup: Any) -> None:
    status, fe, _, _ = setup
    a, b = fe.open(), fe.open()
    fe.close(a)
    assert status.open_comm_ids == [b]
    fe.clear()
    status.push()
    assert fe.received(a) == []
    assert fe.last(b)["changed"] is True
    # A message to the closed comm goes nowhere and breaks nothing.
    fe.send(a, {"version": 1, "type": "request_state"})
    assert fe.received(a) == []


def test_status_comm_close_unregisters_and_closes_comms(setup: Any) -> None:
    status, fe, _, _ = setup
    cid = fe.open()
    status.close()
    assert TARGET not in fe.manager.targets
    assert status.open_comm_ids == []
    assert (cid, "comm_close", {}) in fe.published
    status.push()  # no-op after close


def test_send_failure_forgets_that_comm_only(setup: Any) -> None:
    status, fe, _, _ = setup
    a, b = fe.open(), fe.open()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("iopub is gone")

    fe.manager.comms[a].send = broken
    fe.clear()
    status.push()
    assert status.open_comm_ids == [b]
    assert fe.last(b)["type"] == "state"


# --------------------------------------------------------------------------
# validation: every bad message gets an error and changes nothing
# --------------------------------------------------------------------------

BAD_MESSAGES = [
    pytest.param(None, ["JSON object", "NoneType"], None, id="null"),
    pytest.param("hello", ["JSON object", "str"], None, id="string"),
    pytest.param([{"version": 1}], ["JSON object", "list"], None, id="list"),
    pytest.param({"type": "request_state"}, ["missing 'version'"], "request_state", id="no-version"),
    pytest.param(
        {"version": 2, "type": "request_state"}, ["unsupported version 2", "version 1"], "request_state", id="version-2"
    ),
    pytest.param(
        {"version": "1", "type": "request_state"}, ["unsupported version '1'"], "request_state", id="version-str"
    ),
    pytest.param(
        {"version": True, "type": "request_state"}, ["unsupported version True"], "request_state", id="version-bool"
    ),
    pytest.param(
        {"version": 1.0, "type": "request_state"}, ["unsupported version 1.0"], "request_state", id="version-float"
    ),
    pytest.param({"version": 1}, ["missing 'type'"], None, id="no-type"),
    pytest.param({"version": 1, "type": 7}, ["'type' must be a string"], None, id="type-int"),
    pytest.param({"version": 1, "type": "lower"}, ["unknown type 'lower'", "mark_private"], "lower", id="unknown-type"),
    pytest.param(
        {"version": 1, "type": "state", "state": {}}, ["unknown type 'state'"], "state", id="kernel-type-echoed"
    ),
    pytest.param(
        {"version": 1, "type": "request_state", "x": 1}, ["unexpected field", "x"], "request_state", id="extra-field"
    ),
    pytest.param({"version": 1, "type": "mark_private"}, ["needs 'level'"], "mark_private", id="no-level"),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "TOPSECRET"},
        ["unknown level 'TOPSECRET'", "INTERNAL"],
        "mark_private",
        id="unknown-level",
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "secret"},
        ["unknown level 'secret'"],
        "mark_private",
        id="lowercase-level",
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": 3}, ["unknown level 3"], "mark_private", id="numeric-level"
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": None}, ["unknown level None"], "mark_private", id="null-level"
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "PUBLIC"},
        ["'PUBLIC' cannot be requested", "never goes down"],
        "mark_private",
        id="public",
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "SECRET", "reason": 5},
        ["'reason' must be a string"],
        "mark_private",
        id="reason-int",
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "SECRET", "reason": "x" * 1001},
        ["1001 characters"],
        "mark_private",
        id="reason-long",
    ),
    pytest.param(
        {"version": 1, "type": "mark_private", "level": "SECRET", "private": False},
        ["unexpected field", "private"],
        "mark_private",
        id="mark-extra",
    ),
]


@pytest.mark.parametrize(("data", "words", "request_type"), BAD_MESSAGES)
def test_bad_message_gets_error_and_changes_nothing(
    setup: Any, data: Any, words: list[str], request_type: str | None
) -> None:
    status, fe, provider, loop = setup
    provider.level = "INTERNAL"
    cid = fe.open()
    fe.clear()
    fe.send(cid, data)
    run_until(loop, lambda: fe.received(cid))
    msgs = fe.received(cid)
    assert len(msgs) == 1
    assert_error(msgs[0], *words, request=request_type)
    assert provider.calls == []
    assert provider.level == "INTERNAL"
    # ...and the comm stays usable.
    fe.clear()
    fe.send(cid, {"version": 1, "type": "request_state"})
    assert fe.last(cid)["type"] == "state"
    assert status.open_comm_ids == [cid]


def test_message_without_content_data(setup: Any) -> None:
    _, fe, _, _ = setup
    cid = fe.open()
    fe.clear()
    comm = fe.manager.comms[cid]
    comm.handle_msg({"content": "garbage"})
    assert_error(fe.last(cid), "JSON object")


def test_error_messages_do_not_echo_huge_junk(setup: Any) -> None:
    _, fe, _, _ = setup
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "A" * 100_000})
    msg = fe.last(cid)
    assert msg["type"] == "error"
    assert len(msg["message"]) < 300


def test_parse_request_accepts_the_contract() -> None:
    assert parse_request({"version": 1, "type": "hello"}).type == "hello"
    assert parse_request({"version": 1, "type": "request_state"}).type == "request_state"
    for level in ("INTERNAL", "CONFIDENTIAL", "SECRET"):
        req = parse_request({"version": 1, "type": "mark_private", "level": level})
        assert (req.level, req.reason) == (level, "")
    req = parse_request({"version": 1, "type": "mark_private", "level": "SECRET", "reason": "HR file"})
    assert req.reason == "HR file"
    req = parse_request({"version": 1, "type": "mark_private", "level": "SECRET", "reason": None})
    assert req.reason == ""
    with pytest.raises(ProtocolError) as info:
        parse_request({"version": 1, "type": "nope"})
    assert info.value.request == "nope"


# --------------------------------------------------------------------------
# mark_private
# --------------------------------------------------------------------------


def test_mark_private_raises_level_and_broadcasts(setup: Any) -> None:
    status, fe, provider, loop = setup
    a, b = fe.open(), fe.open()
    fe.clear()
    fe.send(a, {"version": 1, "type": "mark_private", "level": "CONFIDENTIAL", "reason": "payroll"})
    # Nothing yet: the provider's coroutine runs on the loop.
    assert fe.received(a) == []
    run_until(loop, lambda: fe.received(a) and fe.received(b))
    assert provider.calls == [("CONFIDENTIAL", "payroll")]
    for cid in (a, b):
        msg = fe.last(cid)
        assert msg["type"] == "state" and msg["changed"] is True
        assert msg["state"]["private"] is True
        assert msg["state"]["level"] == "CONFIDENTIAL"
        assert msg["state"]["network"] == "none"
        assert msg["state"]["datasets"][0]["source"] == "widget"
        assert "CONFIDENTIAL" in msg["notice"]


def test_mark_private_on_an_unisolated_backend_does_not_claim_a_cut(setup: Any) -> None:
    """On the subprocess fallback nothing cuts the network (Sandbox.enforces_network
    is False; the engine refuses every later cell instead): the rise's notice
    and the state must say so, not "its sandbox has no network from now on"."""
    _, fe, provider, loop = setup
    provider.backend = "subprocess"
    cid = fe.open()
    assert fe.last(cid)["state"]["enforces_network"] is False
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "CONFIDENTIAL"})
    run_until(loop, lambda: fe.received(cid))
    msg = fe.last(cid)
    assert msg["changed"] is True and msg["state"]["network"] == "none"
    assert msg["state"]["enforces_network"] is False
    assert "no network from now on" not in msg["notice"]
    assert "NOT cut" in msg["notice"] and "NOT sandboxed" in msg["notice"] and "no more code" in msg["notice"]


def test_mark_private_on_a_sandboxing_backend_says_the_network_is_gone(setup: Any) -> None:
    _, fe, _, loop = setup
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "SECRET"})
    run_until(loop, lambda: fe.received(cid))
    msg = fe.last(cid)
    assert msg["state"]["enforces_network"] is True
    assert msg["notice"].endswith("its sandbox has no network from now on.") and "NOT" not in msg["notice"]


def test_mark_private_same_level_replies_unchanged_to_requester_only(setup: Any) -> None:
    _, fe, provider, loop = setup
    provider.level = "SECRET"
    a, b = fe.open(), fe.open()
    fe.clear()
    fe.send(a, {"version": 1, "type": "mark_private", "level": "SECRET"})
    run_until(loop, lambda: fe.received(a))
    assert provider.calls == [("SECRET", "")]
    assert fe.last(a)["type"] == "state" and fe.last(a)["changed"] is False
    assert "notice" not in fe.last(a)
    assert fe.received(b) == []


@pytest.mark.parametrize("current", ["CONFIDENTIAL", "SECRET"])
def test_mark_private_lower_is_refused_before_the_provider(setup: Any, current: str) -> None:
    status, fe, provider, loop = setup
    provider.level = current
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "INTERNAL"})
    assert_error(fe.last(cid), f"cannot lower the session from {current} to INTERNAL", request="mark_private")
    assert provider.calls == [] and provider.level == current
    fe.clear()
    fe.send(cid, {"version": 1, "type": "request_state"})
    assert fe.last(cid)["state"]["level"] == current


def test_mark_private_provider_value_error_is_shown(setup: Any) -> None:
    _, fe, provider, loop = setup
    provider.fail_mark = ValueError("the privacy store is read-only")
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "SECRET"})
    run_until(loop, lambda: fe.received(cid))
    assert_error(fe.last(cid), "the privacy store is read-only", request="mark_private")
    fe.clear()
    fe.send(cid, {"version": 1, "type": "request_state"})
    assert fe.last(cid)["type"] == "state"


def test_mark_private_provider_crash_is_reported_not_raised(setup: Any) -> None:
    _, fe, provider, loop = setup
    provider.fail_mark = RuntimeError("disk on fire")
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "SECRET"})
    run_until(loop, lambda: fe.received(cid))
    assert_error(fe.last(cid), "RuntimeError", "disk on fire", request="mark_private")


def test_mark_private_sync_provider_is_reported(manager: Any, loop: asyncio.AbstractEventLoop) -> None:
    mgr, published = manager

    class SyncProvider(FakeProvider):
        def mark_private(self, level: str, reason: str) -> None:  # type: ignore[override]
            return None

    StatusComm(mgr, SyncProvider(), loop=loop)
    fe = Frontend(mgr, published)
    cid = fe.open()
    fe.clear()
    fe.send(cid, {"version": 1, "type": "mark_private", "level": "SECRET"})
    assert_error(fe.last(cid), "mark_private failed", request="mark_private")


def test_comm_closed_while_mark_private_runs(setup: Any) -> None:
    status, fe, provider, loop = setup
    provider.gate = asyncio.Event()
    a, b = fe.open(), fe.open()
    fe.clear()
    fe.send(a, {"version": 1, "type": "mark_private", "level": "SECRET"})
    fe.close(a)
    loop.call_soon(provider.gate.set)
    run_until(loop, lambda: fe.received(b))
    assert fe.received(a) == []
    assert fe.last(b)["state"]["level"] == "SECRET"


# --------------------------------------------------------------------------
# failing closed
# --------------------------------------------------------------------------


def test_unreadable_state_is_shown_private_with_error(setup: Any) -> None:
    _, fe, provider, _ = setup
    provider.fail_status = OSError("store corrupt")
    cid = fe.open()
    state = fe.last(cid)["state"]
    assert state["private"] is True and state["level"] == "SECRET" and state["network"] == "none"
    assert "store corrupt" in state["error"]


def test_invalid_provider_state_fails_closed_keeping_last_good_fields(setup: Any) -> None:
    _, fe, provider, _ = setup
    cid = fe.open()
    original = provider.status

    def contradictory() -> dict[str, Any]:
        s = original()
        s["private"], s["network"], s["level"] = True, "full", "SECRET"
        return s

    provider.status = contradictory  # type: ignore[method-assign]
    fe.clear()
    fe.send(cid, {"version": 1, "type": "request_state"})
    state = fe.last(cid)["state"]
    assert (state["private"], state["level"], state["network"]) == (True, "SECRET", "none")
    assert "network is not 'none'" in state["error"]
    assert state["backend"] == "bwrap" and state["user_id"] == "alice"


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"level": "HIGH"}, "state.level"),
        ({"network": "bridge"}, "state.network"),
        ({"backend": "vm"}, "state.backend"),
        ({"private": "yes"}, "state.private"),
        ({"warnings": "w"}, "state.warnings"),
        ({"datasets": [{"name": "x"}]}, "datasets[0] is missing level"),
        ({"private": False, "level": "SECRET", "network": "none"}, "contradicts"),
    ],
)
def test_validate_state_names_the_problem(provider: FakeProvider, patch: dict[str, Any], words: str) -> None:
    state = {**provider.status(), **patch}
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        validate_state(state)


@pytest.mark.parametrize(
    ("backend", "claimed", "expected"),
    [
        ("bwrap", None, True),
        ("docker", None, True),
        ("bwrap", False, False),  # a provider may say less than its backend class
        ("subprocess", None, False),
        ("subprocess", True, False),  # never more: the subprocess fallback cuts nothing
    ],
)
def test_state_says_whether_the_backend_cuts_the_network(
    provider: FakeProvider, backend: str, claimed: bool | None, expected: bool
) -> None:
    provider.backend, provider.enforces_network = backend, claimed
    assert validate_state(provider.status())["enforces_network"] is expected


def test_validate_state_refuses_a_non_bool_enforces_network(provider: FakeProvider) -> None:
    with pytest.raises(ValueError, match=r"state\.enforces_network"):
        validate_state({**provider.status(), "enforces_network": "yes"})


def test_unreadable_state_does_not_claim_a_network_cut(setup: Any) -> None:
    _, fe, provider, _ = setup
    provider.fail_status = OSError("store corrupt")
    cid = fe.open()
    assert fe.last(cid)["state"]["enforces_network"] is False


EGRESS_ENTRY = {"time": "t", "host": "10.1.2.3", "port": 1, "allowed": False, "rule": "private address"}


def egress(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"allowed": 0, "refused": 1235, "bytes_up": 0, "bytes_down": 0, "domains": [], "recent": list(entries)}


def test_egress_entries_keep_their_count(setup: Any) -> None:
    """The egress log writes identical refusals as one entry with a ``count``
    (network/egress_log.py): the widget must get it, not one refusal where
    there were 1234."""
    _, fe, provider, _ = setup
    provider.egress = egress({**EGRESS_ENTRY, "count": 1234}, {**EGRESS_ENTRY, "host": "example.org"})
    cid = fe.open()
    recent = fe.last(cid)["state"]["egress"]["recent"]
    assert [(e["host"], e["count"]) for e in recent] == [("10.1.2.3", 1234), ("example.org", 1)]
    assert fe.last(cid)["state"]["error"] is None


def test_egress_count_is_bounded(provider: FakeProvider) -> None:
    provider.egress = egress({**EGRESS_ENTRY, "count": 10**30})
    assert validate_state(provider.status())["egress"]["recent"][0]["count"] == 10**9


@pytest.mark.parametrize("count", [0, -5, True, 2.5, "1234", None])
def test_a_bad_egress_count_is_refused(provider: FakeProvider, count: object) -> None:
    provider.egress = egress({**EGRESS_ENTRY, "count": count})
    with pytest.raises(ValueError, match="count must be a positive integer"):
        validate_state(provider.status())


def test_validate_state_drops_unknown_keys(provider: FakeProvider) -> None:
    state = {**provider.status(), "secret_token": "x"}
    assert "secret_token" not in validate_state(state)


# --------------------------------------------------------------------------
# threads: ipykernel may call comm handlers off the kernel loop (subshells)
# --------------------------------------------------------------------------


def test_messages_from_another_thread_run_on_the_kernel_loop(manager: Any, provider: FakeProvider) -> None:
    mgr, published = manager
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=run, name="kernel-loop", daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        status = StatusComm(mgr, provider, loop=loop)
        fe = Frontend(mgr, published)
        cid = fe.open()  # called from the main thread, as a subshell would
        deadline = time.monotonic() + 5
        while not fe.received(cid):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        fe.clear()
        fe.send(cid, {"version": 1, "type": "mark_private", "level": "SECRET", "reason": "r"})
        while not fe.received(cid):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert fe.last(cid)["state"]["level"] == "SECRET"
        fe.clear()
        status.push()
        while not fe.received(cid):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert set(provider.threads) == {"kernel-loop"}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_loop_defaults_to_running_loop(manager: Any, provider: FakeProvider) -> None:
    mgr, published = manager

    async def main() -> None:
        StatusComm(mgr, provider)  # built inside the kernel's loop
        fe = Frontend(mgr, published)
        cid = fe.open()
        fe.clear()
        fe.send(cid, {"version": 1, "type": "mark_private", "level": "INTERNAL"})
        for _ in range(1000):
            if fe.received(cid):
                break
            await asyncio.sleep(0.001)
        assert fe.last(cid)["state"]["level"] == "INTERNAL"

    asyncio.run(main())
