"""The host kernel's stdout/stderr and the barrier before replies, on ipykernel's
real IO thread and a real zmq socket pair."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from sandbox_kernel.host_streams import HostOutStream, iopub_barrier


@pytest.fixture
def iopub() -> Iterator[tuple[IOPubThread, zmq.Socket, Session]]:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    session = Session(key=b"")
    thread = IOPubThread(pub, session=session)
    thread.start()
    time.sleep(0.2)  # a PUB socket drops what it sends before the SUB is connected
    try:
        yield thread, sub, session
    finally:
        # ipykernel's stop() leaves its pipe-gc task pending ("Task was destroyed
        # but it is pending!" at exit): end it on the IO thread first
        task = getattr(thread, "_event_pipe_gc_task", None)
        if task is not None:
            thread.schedule(task.cancel)
            iopub_barrier(thread, timeout=5)
            iopub_barrier(thread, timeout=5)  # one more turn of the loop: the task sees its cancel
        thread.stop()
        thread.close()
        sub.close(linger=0)
        ctx.term()


def _streams(sub: zmq.Socket, session: Session, timeout: float = 5.0) -> list[dict]:
    found = []
    while sub.poll(int(timeout * 1000)):
        _, frames = session.feed_identities(sub.recv_multipart())
        msg = session.deserialize(frames)
        if msg["msg_type"] == "stream":
            found.append(msg["content"])
        timeout = 0.2
    return found


def test_the_barrier_returns_only_after_what_was_scheduled_before_it(iopub) -> None:
    thread, _, _ = iopub
    ran: list[str] = []

    def slow_send() -> None:  # an output the IO thread is still sending
        time.sleep(0.3)
        ran.append("sent")

    thread.schedule(slow_send)
    assert iopub_barrier(thread) is True
    assert ran == ["sent"]


def test_the_barrier_does_not_wait_forever_on_a_stuck_io_thread(iopub) -> None:
    thread, _, _ = iopub
    release = threading.Event()
    thread.schedule(lambda: release.wait(5))
    started = time.monotonic()
    assert iopub_barrier(thread, timeout=0.2) is False
    assert time.monotonic() - started < 4
    release.set()


def test_what_host_code_writes_still_reaches_the_frontend(iopub) -> None:
    thread, sub, session = iopub
    stream = HostOutStream(session, thread, "stderr", watchfd=False)
    stream.write("a host-side warning\n")
    stream.flush()
    assert _streams(sub, session) == [{"name": "stderr", "text": "a host-side warning\n"}]


def test_a_flush_with_nothing_written_costs_no_round_trip(iopub) -> None:
    thread, sub, session = iopub
    stream = HostOutStream(session, thread, "stdout", watchfd=False)
    scheduled: list[object] = []
    original = thread.schedule

    def counting(f: object) -> None:
        scheduled.append(f)
        original(f)

    thread.schedule = counting  # type: ignore[method-assign]
    stream.flush()
    stream.flush()
    assert scheduled == []
    stream.write("x")
    stream.flush()
    assert scheduled  # something written: flushed as ipykernel would
    assert _streams(sub, session) == [{"name": "stdout", "text": "x"}]
