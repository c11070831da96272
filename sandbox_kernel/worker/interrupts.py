"""An interrupt sent for a request reaches that request's code.

The holder passes SIGINT to a request's process as soon as the host asks,
which may be before the request's code has begun: in the new child before it
runs at all, or while IPython prepares the cell. Two things could lose it:

- before ``interruptible``, the child's disposition would ignore it: SIGINT
  is only recorded there, and raised as the request starts;
- while IPython prepares a cell, a KeyboardInterrupt can be swallowed:
  its ``EventManager.trigger`` catches it in a ``pre_execute`` callback
  (IPython's own clears the warning registry of every module), printing
  "Error in callback" (so can a finaliser, or any library code that catches
  BaseException). The cell then ran on, its one interrupt spent, until the
  host killed it 5 s later: about one interrupt in 900 sent with its request.

A third delayed it past the host's patience: a SIGINT that comes just
before a blocking call (``time.sleep``) begins is recorded by Python, but the
call does not return to let Python act on it, so the cell slept on until
the host killed it (about one interrupt in 10,000 sent with its request; a
SIGINT that another thread receives does the same). Python acts on it as
soon as any signal it handles interrupts the call: the holder sends
``NUDGE`` while the request runs on after an interrupt (``install_nudge``).

So until the cell's code starts, an interrupt is recorded as it is raised,
and the shell's ``run_code`` stops the cell there if it never arrived
(``stop_before_code``). While code runs the handler is Python's own
``default_int_handler``, as under ipykernel: ``asyncio.run`` in a cell takes
SIGINT over only from that one, and no frame of ours shows in a traceback.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the signal that wakes a request's process from a blocking call so that
#: Python acts on a SIGINT already recorded: one whose default is to be
#: ignored (so a process that has no handler for it, a program a cell
#: exec'd, is not harmed) and that Python programs leave alone (Go's runtime
#: chose it for the same reasons)
NUDGE = signal.SIGURG

#: a SIGINT came for this request and no request code has run since
_undelivered = False
#: inside ``interruptible(before_code=True)``: a cell's ``run_cell``, not a
#: warm-up's (``warmup``), which must leave a recorded interrupt alone
_in_cell = False


def _record(signum: int, frame: Any) -> None:
    global _undelivered
    _undelivered = True


def _record_and_raise(signum: int, frame: Any) -> None:
    global _undelivered
    _undelivered = True
    raise KeyboardInterrupt


def _nudged(signum: int, frame: Any) -> None:
    """Nothing to do: the signal only interrupted a blocking call."""


def install_nudge() -> None:
    """Once, in the first worker process: every process forked from it
    inherits the handler. A handler Python runs, not SIG_IGN, since only a
    handled signal interrupts a blocking call."""
    signal.signal(NUDGE, _nudged)


def record_stops() -> None:
    """In a new child, before SIGINT is unblocked: the holder signals it only
    once it has passed it a request, so a stop that comes before the
    request's code begins is kept for that code (a flag inherited from the
    holder's own past is cleared). SIGINT is unblocked too: a cell that
    blocked it in the main thread would otherwise have made every later
    interrupt of the session a kill."""
    global _undelivered
    _undelivered = False
    signal.signal(signal.SIGINT, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def note_raised() -> None:
    """For a SIGINT handler of the request's own (an awaiting cell's), or a
    catcher of KeyboardInterrupt before the code (``CellEvents``): the
    interrupt is kept for ``stop_before_code``."""
    global _undelivered
    _undelivered = True


@contextmanager
def interruptible(before_code: bool = False) -> Iterator[None]:
    """Let SIGINT raise KeyboardInterrupt in a request's code, and raise it at
    once for an interrupt that came between the request's arrival and here.
    ``before_code``: IPython prepares the cell first, and an interrupt is
    recorded there too until ``run_code`` starts the code."""
    global _in_cell
    signal.signal(signal.SIGINT, _record_and_raise if before_code else signal.default_int_handler)
    _in_cell = before_code
    try:
        if _undelivered:
            raise KeyboardInterrupt
        yield
    finally:
        _in_cell = False
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_before_code() -> bool:
    """At the start of a code object's run (``InteractiveShell.run_code``):
    whether an interrupt came since the request's code last ran (IPython's
    preparation caught it on its way), so the cell must stop here. If not,
    the code runs under Python's own handler."""
    global _undelivered
    if not _in_cell:
        return False
    if _undelivered:
        _undelivered = False
        return True
    if signal.getsignal(signal.SIGINT) is _record_and_raise:  # an awaiting cell's handler stays
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return False


def delivered() -> None:
    """After a code object's run: an interrupt that came during it was
    raised in it (a cell that catches KeyboardInterrupt and runs another
    cell must not see it again)."""
    global _undelivered
    if _in_cell:
        _undelivered = False
