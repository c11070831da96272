"""The cut watchdog's thread (``engine/cut_watchdog.py``) serves every session
of the process: nothing one session does may end it for the others.

The sessions here are stand-ins that record the calls: the thread's own
rules are under test. Its cuts of real sandboxes are attacked in
tests/test_ratchet_side_doors.py, tests/docker/test_docker_kernel.py and
tests/tools/test_shell_rise.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sandbox_kernel.engine.cut_watchdog import LATE_POLLS, CutWatchdog


class Session:
    def __init__(self, lag: float | None, fail: str | None = None) -> None:
        self.lag = lag
        self.fail = fail
        self.cuts = 0

    def poll_lag(self) -> float | None:
        if self.fail == "lag":
            raise RuntimeError("a session in a bad state")
        return self.lag

    def cut_from_thread(self) -> bool:
        self.cuts += 1
        if self.fail == "cut":
            raise OSError("the daemon went away")
        return True


def _wait_for(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_failing_session_does_not_end_the_thread_for_the_others() -> None:
    watchdog = CutWatchdog()
    interval = 0.05
    bad_lag, bad_cut = Session(None, fail="lag"), Session(1.0, fail="cut")
    late, on_time, never = Session(LATE_POLLS * interval * 4), Session(interval / 2), Session(None)
    for session in (bad_lag, bad_cut, late, on_time, never):
        watchdog.watch(session, interval)
    try:
        assert _wait_for(lambda: late.cuts >= 3 and bad_cut.cuts >= 3), (late.cuts, bad_cut.cuts)
        assert watchdog._thread is not None and watchdog._thread.is_alive()
        # only a late poll makes the thread act
        assert on_time.cuts == 0 and never.cuts == 0
        # a session that rose later is still served
        on_time.lag = 1.0
        assert _wait_for(lambda: on_time.cuts >= 1)
    finally:
        for session in (bad_lag, bad_cut, late, on_time, never):
            watchdog.unwatch(session)
    assert _wait_for(lambda: watchdog._thread is None), "the thread outlived its last session"


def test_a_dropped_session_is_forgotten() -> None:
    watchdog = CutWatchdog()
    sessions = [Session(1.0)]
    watchdog.watch(sessions[0], 0.05)
    assert _wait_for(lambda: sessions[0].cuts >= 1)
    sessions.clear()  # a session that went without unwatch (its kernel ended)
    assert _wait_for(lambda: watchdog._thread is None), "the thread still holds a session nobody has"
