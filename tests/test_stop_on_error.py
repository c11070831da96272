"""A failed cell aborts the requests queued behind it, and only those.

ipykernel posts its "stop aborting" marker after the error's reply, so a
client that sends its next request as soon as it reads that reply (nbclient
with ``allow_errors``, an agent) sometimes had it aborted unrun
(ipython/ipykernel#609; ``sandbox_kernel/stop_on_error.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel, reply_to


@pytest.fixture(scope="module")
def logging_kernel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A kernel logging at DEBUG, as one does to find a problem: the log of
    each reply widens the window between the reply and ipykernel's marker
    (without the fix, 11 of 300 second cells were aborted)."""
    handle = bwrap_kernel(tmp_path_factory.mktemp("stop-on-error"), "--log-level=DEBUG")
    yield handle
    handle.shutdown()


def test_a_request_sent_after_the_error_reply_runs(logging_kernel: SandboxKernelHandle) -> None:
    outcomes = []
    for _ in range(200):
        assert reply_to(logging_kernel, logging_kernel.kc.execute("1/0"), 60)["ename"] == "ZeroDivisionError"
        outcomes.append(reply_to(logging_kernel, logging_kernel.kc.execute("1+1"), 60)["status"])
    assert outcomes.count("ok") == len(outcomes), f"{outcomes.count('aborted')} of {len(outcomes)} aborted"


def test_requests_queued_behind_a_failed_cell_are_aborted(logging_kernel: SandboxKernelHandle) -> None:
    """Run All: what was sent before the error was seen does not run."""
    failing = logging_kernel.kc.execute("import time\ntime.sleep(0.5)\n1/0")
    queued = [logging_kernel.kc.execute(f"ran_{i} = True") for i in range(3)]
    assert reply_to(logging_kernel, failing, 60)["status"] == "error"
    assert [reply_to(logging_kernel, msg_id, 60)["status"] for msg_id in queued] == ["aborted"] * 3
    assert logging_kernel.run("sorted(n for n in dir() if n.startswith('ran_'))").result == {"text/plain": "[]"}
    # and the queue is open again
    assert logging_kernel.run("ran_after = 1; ran_after").result == {"text/plain": "1"}


def test_a_silent_or_non_stopping_failure_aborts_nothing(tmp_path: Path) -> None:
    handle = bwrap_kernel(tmp_path)
    try:
        for options in ({"silent": True}, {"stop_on_error": False}):
            failing = handle.kc.execute("import time\ntime.sleep(0.5)\n1/0", **options)
            queued = handle.kc.execute("x = 1")
            assert reply_to(handle, failing, 60)["status"] == "error"
            assert reply_to(handle, queued, 60)["status"] == "ok", options
    finally:
        handle.shutdown()
