"""Cut a risen session's network even while its event loop is busy.

The privacy poll runs on the kernel's (or the agent tools') event loop, and
so does the cleaning of everything a sandbox sends: its outputs, widget
states, and the pages and expressions of its replies. A cell that sent tens of
MB of HTML or SVG built to be slow to clean (an attack review: three 20 MB
pages in one reply) kept the loop busy for seconds, and a rise made meanwhile
by another process was acted on only afterwards: the sandbox kept its network
about 5 s after the rise instead of one poll interval, by its own doing.

This thread does not clean anything and needs no loop: when a watched
session's poll is late (``LATE_POLLS`` intervals), it reads the session's
level itself and, once private, removes the sandbox's ways out at once
(``Session.cut_from_thread``). The loop's poll does the rest when it runs
(reaps, records the cut, stops the cell, replaces the sandbox). A loop that is
not late costs the thread a clock read per session per half interval.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

#: how many poll intervals late a session's poll may be before the thread acts
LATE_POLLS = 2.0


class Watched(Protocol):
    """What the thread needs of a session (``engine.session.Session``)."""

    def poll_lag(self) -> float | None:
        """Seconds since its poll last began (None: not polled yet)."""

    def cut_from_thread(self) -> bool:
        """Read its level; once private, cut what still has network. Whether it cut."""


class CutWatchdog:
    """One daemon thread for every watched session of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: weakref.WeakKeyDictionary[Watched, float] = weakref.WeakKeyDictionary()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, session: Watched, interval: float) -> None:
        """Watch ``session``, whose poll runs every ``interval`` seconds."""
        if interval <= 0:
            return  # no poll to be late (a deployment that turned it off)
        with self._lock:
            self._sessions[session] = interval
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sandbox-cut-watchdog", daemon=True)
                self._thread.start()
        self._wake.set()  # a shorter interval takes effect now

    def unwatch(self, session: Watched) -> None:
        with self._lock:
            self._sessions.pop(session, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._sessions:
                    self._thread = None
                    return
                period = min(self._sessions.values()) / 2
            self._wake.wait(period)
            self._wake.clear()
            try:
                self._check()
            except Exception as exc:  # never end the thread: every session of the process relies on it
                log.error("the cut watchdog's round failed: %s", exc)

    def _check(self) -> None:
        """One round. The sessions are held only for it, not while the thread
        waits: a session dropped meanwhile must be finalised by its own
        thread (its transports close on their loop), not by this one."""
        with self._lock:
            watched = list(self._sessions.items())
        for session, interval in watched:
            try:
                lag = session.poll_lag()
                if lag is None or lag <= LATE_POLLS * interval:
                    continue
                if session.cut_from_thread():
                    log.warning("network cut by the watchdog: the poll was %.1f s late (the loop is busy)", lag)
            except Exception as exc:  # the loop's poll still follows
                log.error("the cut watchdog could not check a session: %s", exc)


#: the process's watchdog
WATCHDOG = CutWatchdog()
