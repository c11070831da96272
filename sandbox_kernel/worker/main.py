"""The worker's process tree: anchor, state holder, one forked child per request.

anchor (first process, subreaper, never runs user code)
  └─ holder (owns the channel while idle; its namespace is the last good state)
       └─ child (forked per cell; on success it takes over as the new holder)

A cell whose process dies (os._exit, segfault, OOM, killed on timeout)
leaves the holder untouched: the next cell forks from the last good state.

Threads do not follow a fork. When earlier cells left threads running (a
``ThreadPoolExecutor``, a ``multiprocessing.Pool``, a client's event loop),
a forked child would find their objects without their threads and wait on
them forever, so the roles turn round: the request runs in the holder, where
the threads are, and the forked child (the backup) keeps the state from
before it, watches it as the holder watches a child, and takes over if the
holder dies (``Holder._spawn_backup``). The same holds while tasks of cells
wait on the event loop requests run in (``cell_loop``): the holder runs the
loop while idle, so they go on between cells, as in ipykernel.
"""

from __future__ import annotations

import builtins
import fcntl
import gc
import getpass
import itertools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import cell_loop, deaths, hot_pages, inflight, interrupts, proxy_forward, warmup
from .channel import Channel, ChannelClosed, frame_lock_fd
from .protocol import LATE_OPS, Msg, Op
from .streams import (
    FdCapture,
    Sink,
    adopt_captures,
    begin_request,
    flusher_running,
    hand_over_captures,
    quiesce,
    reclaim_captures,
    stop_captures,
)

SHUTDOWN_EXIT = 99
#: how the worker's own notes in a cell's output begin (as the host's)
NOTICE = "[sandbox_kernel]"
#: a holder's exit status when the host's channel closed (the host is gone):
#: the anchor then leaves at once rather than wait for processes cells left
#: running, so a container ends even when the CLI could not forward a signal
CHANNEL_CLOSED_EXIT = 98
#: a holder's exit status when it cannot go on (an error of its own, a broken
#: frame): the anchor leaves at once too, and the host replaces the sandbox.
#: Its standby or backup must not take over: it would meet the same error,
#: and the next one after it.
BROKEN_EXIT = 97
_PR_SET_CHILD_SUBREAPER = 36


def _high_fd(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def _set_subreaper() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # pragma: no cover - non-Linux dev machines
        pass


def _describe_status(status: int, who: str = "the cell's process") -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return {"signal": sig, "reason": f"{who} was killed by {name}"}
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return {"exitcode": code, "reason": f"{who} exited with code {code}"}


class Holder:
    def __init__(self, channel: Channel, shell: Any) -> None:
        self.channel = channel
        self.shell = shell
        #: backups not yet reaped (this process is their parent)
        self.backups: list[int] = []

    # ---- the serving loop --------------------------------------------------------
    standby: _Child | None = None
    #: this process's end of the pipe from the holder it took over from,
    #: which exits once it is closed (``_let_old_holder_go``)
    _old_holder_fd: int | None = None
    #: how many requests the holder chain has run (tags the hot-page list)
    generation = 0
    #: this process, as a standby, waited long enough to warm up: its request
    #: came after a pause
    warmed = False
    #: the ``random`` module's state when the last request ended (``_random_state``)
    random_state: object = None
    #: a request the holder read but could not start (its backup was gone)
    pending: dict[str, Any] | None = None
    #: this process is a forked child (a standby, a backup, a query's) that
    #: does not hold the state (yet): an error of its own ends it alone
    forked_child = False
    #: objects there were after the last full garbage collection, and how
    #: many requests' processes kept since (``_collect_if_due``)
    collected_at = 0
    grown = 0

    def serve(self) -> None:
        fork_error: str | None = None
        while True:
            self._reap_backups()
            if self.standby is None:
                try:
                    self.standby = self._spawn_backup() if _background_of_cells() else self._spawn_standby()
                except OSError as exc:  # e.g. the process limit, held by earlier cells' processes
                    fork_error = f"cannot start a process for the cell: {exc}"
                else:
                    fork_error = None
                    if self.standby is None:
                        continue  # this process just ran a cell and is now the holder
            msg, self.pending = self.pending, None
            if msg is None:
                if self.standby is not None and self.standby.backup and cell_loop.busy():
                    # tasks of cells go on while idle, as in ipykernel
                    cell_loop.run_until_readable(self.channel.read_fd)
                try:
                    msg = self.channel.recv()
                except ChannelClosed:
                    os._exit(CHANNEL_CLOSED_EXIT)
            op = msg.get("op")
            if op in USER_CODE_OPS:
                inflight.taken(str(op), str(msg.get("id")))
            if op == Op.SHUTDOWN:
                self._kill_standby()
                os._exit(SHUTDOWN_EXIT)
            elif op in USER_CODE_OPS and self.standby is None:
                self.channel.send(
                    {
                        "type": Msg.DONE,
                        "id": msg.get("id"),
                        "status": "error",
                        "ename": "ProcessLimitError",
                        "evalue": f"{fork_error}; stop processes started by earlier cells",
                        "traceback": [],
                    }
                )
                inflight.passed()
            elif op in USER_CODE_OPS and self.standby is not None:
                child, self.standby = self.standby, None
                if child.backup:
                    self._run_here(child, msg)
                    continue
                try:
                    child.ctl.send(msg)
                except OSError:
                    pass  # it died while waiting: reported as a died cell
                inflight.passed()
                hot_pages.started(self.generation)  # a list for that standby is of no use now
                self._supervise(child, msg, takeover=True)
            elif op == Op.COMPLETE:
                warmed = warmup.warm_completer()
                self.fork(msg, self._complete)
                if warmed and self.standby is not None and not self.standby.backup:
                    self._kill_standby()  # forked before the warm-up: the next one, from here, has it
            elif op == Op.INSPECT:
                self.fork(msg, self._inspect)
            elif op == Op.CHECKPOINT:
                self.checkpoint(msg)
            elif op in LATE_OPS:
                continue  # nothing is running: a late message for a finished cell
            else:
                self.channel.send(
                    {"type": Msg.REPLY, "id": msg.get("id"), "status": "error", "evalue": f"unknown op {op!r}"}
                )

    # ---- fork and supervise ----------------------------------------------------------
    def _fork_child(self) -> _Child | None:
        """Fork; in the parent return the child's record, in the child None
        (with ``self._ctl`` set to its end of the private pipes)."""
        # Move every object to the permanent generation: the child's garbage
        # collector then never walks (and so never copies) the inherited heap.
        gc.freeze()
        delay, deadline = 0.05, time.monotonic() + 10
        # SIGINT blocked across the fork: the holder may pass the child a
        # request and an interrupt before the child has run at all, and with
        # the holder's disposition (ignore) that interrupt would be lost. A
        # blocked signal stays pending until the child records it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        pid = -1
        # for the child, if this process dies before it: who, and the
        # deaths seen so far (only the anchor can wait for this process)
        self._parent = (os.getpid(), deaths.mark())
        try:
            while True:
                to_child_r, to_child_w = os.pipe()
                to_holder_r, to_holder_w = os.pipe()
                try:
                    pid = os.fork()
                    break
                except BlockingIOError:  # EAGAIN: a process limit; processes may still exit
                    for fd in (to_child_r, to_child_w, to_holder_r, to_holder_w):
                        os.close(fd)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
        finally:
            if pid != 0:  # the child unblocks it once it records stops
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if pid == 0:
            self.forked_child = True
            self._let_old_holder_go()  # the copy of the pipe it inherited
            interrupts.record_stops()
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked - {signal.SIGINT})
            os.close(to_child_w)
            os.close(to_holder_r)
            self._ctl = Channel(to_child_r, to_holder_w)
            return None
        os.close(to_child_r)
        os.close(to_holder_w)
        self._let_old_holder_go()
        return _Child(pid, Channel(to_holder_r, to_child_w))

    def _finish_child(self, result: dict[str, Any], takeover: bool, request_id: Any = None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _end_host_requests()
        # ``warmed``: whether the request came after a pause, for the old
        # holder (no list of hot pages after one sent back to back)
        try:
            self._ctl.send({"result": result, "warmed": self.warmed})
            sent = True
        except OSError:  # the holder died while the request ran
            sent = False
        if takeover:
            # The old holder may be reading a late frame (an interrupt sent as
            # the cell ended): this process, the next holder, must not read the
            # channel before the old one says it has stopped, or the two could
            # split a frame between them.
            released = False
            while sent:
                try:
                    if self._ctl.recv().get("released"):
                        released = True
                        break
                except (ChannelClosed, ValueError, OSError):
                    break  # the old holder is gone: nobody else reads
            adopt_captures()
            if not released:
                # What watched this request died before letting go, and may
                # not have said the request ended (the host ignores a second
                # DONE). A standby's holder (the cell's code, or a process it
                # started, killed it): this process has the only state left,
                # with the request's changes. A holder's backup: nothing is lost.
                if self._parent[0] != os.getpid():
                    self._note(f"{self._parent_death()} while this cell ran; this cell's process holds the state now")
                self.channel.send({"type": Msg.DONE, "id": request_id, **result})
        os.close(self._ctl.read_fd)
        if not takeover:
            if not sent:  # a query whose holder died (its standby took over): its answer all the same
                self.channel.send({"type": Msg.DONE, "id": request_id, **result})
            os._exit(0)
        # kept until this process forks again: the old holder exits then
        self._old_holder_fd = self._ctl.write_fd
        self.generation += 1
        self.standby = None  # this process is now the holder; the old one exits
        self.forked_child = False

    def _let_old_holder_go(self) -> None:
        """Tell the old holder, which waits for it, that this process forked
        (its next standby or backup), and close the pipe to it; the forked
        process says it too, on the copy it inherited: it takes over if this
        one dies, so the old holder must not (``_successor_died``). Not a
        bare end of file: a process a cell forked holds a copy of the pipe too.

        Tearing the old holder's address space down and forking this one's
        are each a walk of every page table (3-4 ms each with pandas loaded,
        on a 2-core VM), and done at once they took turns on the same locks
        (the anon_vma trees the two processes share) and CPUs: back to back,
        a trivial cell took up to 18% longer (interleaved runs; the noise of
        a 2-core VM hides it in some) than with the exit put after the fork."""
        fd, self._old_holder_fd = self._old_holder_fd, None
        if fd is None:
            return
        try:
            os.write(fd, b"\0")
        except OSError:
            pass  # it is gone already
        os.close(fd)

    def _spawn_standby(self) -> _Child | None:
        """Fork the child that will run the next cell now, while idle, so the
        fork and the stream set-up are off the cell's critical path."""
        if self.warmed and flusher_running():
            # The last request came after a pause (this process warmed up),
            # so the next may too. The flusher must end before the fork
            # (quiesce); ending it, and the fork, at once cost a spaced cell
            # 0.4 ms: they competed for the CPU with the host sending the last
            # reply. Unless a request comes sooner, wait until that is done.
            select.select([self.channel.read_fd], [], [], REPLY_WINDOW)
        self._collect_if_due()
        quiesce()  # no thread of ours may be alive, or mid-exit, in what the child inherits
        child = self._fork_child()
        if child is not None:
            return child
        out, err, capture = self._open_streams()
        self._prepare(out, err)
        msg, death = self._request_or_holder_death()
        if msg is None:
            stop_captures(capture)
            self._take_over_from_dead_holder("")
            return None
        if death is not None:  # a holder dead by now is seen by its pipe (_finish_child)
            os.close(death)
        if msg.get("op") in (Op.EXECUTE, Op.COMM):
            _set_random_state(self.random_state)
        self._run_request(msg, out, err, capture)
        return None

    def _run_request(self, msg: dict[str, Any], out: Any, err: Any, capture: FdCapture | None) -> None:
        """Run a request of user code in this process and take over as the
        holder once the process that watched it has let go of the channel."""
        from .streams import start_captures

        try:
            if capture is None:  # try again now that the cell is here; fail the cell, not the sandbox
                capture = start_captures(out, err)
            if msg.get("op") == Op.EXECUTE:
                result = self._execute(msg, self._ctl, out, err, capture)
            elif msg.get("op") == Op.COMM:
                result = self._comm(msg, self._ctl, out, err, capture)
            else:
                sys.stdout = sys.stderr = Sink()  # as before the set-up: a replayed import's prints are dropped
                result = self._restore(msg, self._ctl)
                stop_captures(capture)
        except BaseException as exc:
            result = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        self.random_state = _random_state()
        # sys.stdout and sys.stderr stay the request's streams, as ipykernel's
        # stay its own: what threads and tasks of cells print between requests
        # goes out at once (the host publishes it under the last request), and
        # the request's output budget still holds for it.
        self._finish_child(result, takeover=True, request_id=msg.get("id"))

    def _spawn_backup(self) -> _Child | None:
        """Fork the copy that keeps the state from before the next request,
        when earlier cells left threads running here (see the module's
        docstring): the request will run in this process, with its threads.

        In the holder, the backup's record. The backup waits; when the holder
        passes it the request, it watches it as the holder watches a child
        (``_supervise``: interrupts, input replies, the result, a death). It
        exits once the request ended well, and takes over as the holder,
        returning None, if the holder dies (a death while idle too: a
        background thread's segfault)."""
        if self.warmed:  # as for a standby: let the last reply go out first
            select.select([self.channel.read_fd], [], [], REPLY_WINDOW)
        self._collect_if_due()
        quiesce()
        threads = _thread_names()
        child = self._fork_child()
        if child is not None:
            child.backup = True
            self._warm_up_here()
            return child
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the holder's request
        self.backups = []  # the holder's children, not this process's
        msg, death = self._request_or_holder_death()
        if msg is None:
            self._take_over_from_dead_holder(threads)
            return None
        # returns only if the holder died as it was passed the request, or
        # running it (said as the request's end): this process holds the state now
        self._supervise(
            _Child(self._parent[0], self._ctl),
            msg,
            takeover=True,
            watching_holder=(self._parent[1], threads),
            holder_death=death,
        )
        self._hold_after_dead_holder()
        return None

    def _request_or_holder_death(self) -> tuple[dict[str, Any] | None, int | None]:
        """In a standby or a backup: the request its holder passes on, with a
        watch on the holder's death (``_death_watch``; the caller closes it),
        or (None, None) once the holder died first, while idle (a process a
        cell started killed it, or the OOM killer chose it): this process, a
        copy of the state, then takes over. It exits if the holder let it go.

        Before, a standby exited with its holder, and the session's state was
        gone with both: the sandbox was replaced, and without a checkpoint
        every variable was lost.

        A request the holder passed before it died is taken all the same: it
        died running it (this is its backup) or before this standby ran it,
        and the host waits for the request's end either way. Found in CI (2
        cores, cells back to back): a backup not yet scheduled when its holder
        passed it the request and died of it looked only afterwards, took
        over as if the holder had died between cells, and left the request in
        its pipe; the host waited for the cell timeout and replaced the
        sandbox."""
        holder, ctl = self._parent[0], self._ctl
        death = _death_watch(holder)
        msg: dict[str, Any] | None = None
        try:
            if death is not None:
                select.select([ctl.read_fd, death], [], [])
            elif os.getppid() == holder:  # no watch: a request, or the pipe's end
                select.select([ctl.read_fd], [], [])
            if select.select([ctl.read_fd], [], [], 0)[0]:
                try:
                    msg = ctl.recv()
                except (ChannelClosed, ValueError):
                    pass
            if msg is not None:
                inflight.passed()  # (the holder may have died before it said so)
                return msg, death
            # The pipe's end, or the holder's death (a process the holder
            # forked since may hold a copy of the pipe, which then never ends)
            died = bool(select.select([death], [], [], 1.0)[0]) if death is not None else _reparented(holder, 1.0)
        finally:
            if msg is None and death is not None:
                os.close(death)
        if not died:
            os._exit(0)  # the holder let it go
        os.close(ctl.read_fd)
        os.close(ctl.write_fd)
        return None, None

    def _take_over_from_dead_holder(self, threads: str) -> None:
        """In a standby or a backup whose holder died while idle: hold the
        state from here on, and say so under the last request; or, if the
        holder died having taken a request it never passed on (``inflight``),
        as that request's end: the host waits for it."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.backups = []
        self._hold_after_dead_holder()
        lost = inflight.left()
        if lost is not None:
            self.channel.send(
                {
                    "type": Msg.DONE,
                    "id": lost[1],
                    "status": "died",
                    "reason": f"{self._parent_death()} as it took this request, before it ran",
                    "threads_lost": threads,
                }
            )
            return
        self._note(
            f"{self._parent_death()} between cells. A copy of the state taken after the last "
            f"request holds it now: every variable is kept{_threads_ended(threads)}"
        )

    def _hold_after_dead_holder(self) -> None:
        """This copy of the state (a standby or a backup) holds it from here
        on: its holder died, idle or running the request it watched."""
        self.forked_child = False
        hot_pages.forget()
        adopt_captures()

    def _parent_death(self) -> str:
        """How the process this one was forked from ended (it has)."""
        pid, mark = self._parent
        who = "The process that held the session's state"
        status = deaths.status_of(pid, mark)
        return f"{who} ended" if status is None else str(_describe_status(status, who)["reason"])

    @staticmethod
    def _note(text: str) -> None:
        """A note of the worker's own in the output of the request running
        (or, between requests, the last one)."""
        try:
            sys.stderr.write(f"{NOTICE} {text}.\n")
            sys.stderr.flush()
        except Exception:  # a stream a cell replaced: the note is all that is lost
            pass

    def _collect_if_due(self) -> None:
        """A full garbage collection in the holder, before it forks, when
        CPython would have made one by now.

        Every fork freezes the heap (``_fork_child``), so a cell's process
        never collects what it inherited: cycles that earlier cells dropped (a
        figure, an exception's frames, objects that point at each other) were
        never freed, in any later process (200 MB of them stayed after
        ``del``). CPython collects the oldest generation once the objects that
        reached it grew by a quarter since the last full collection; the
        objects each request's process kept are that measure here. Then the
        holder, whose heap every later process inherits, collects (as
        ipykernel would have, during some cell), and the next processes fork
        from the cleaned heap."""
        # What this process made and kept: the objects not frozen at its
        # fork (its cell's, its set-up's). Counting the frozen ones walks
        # the whole heap (gc.get_freeze_count is a list walk: 100,000
        # objects with pandas loaded, and back-to-back cells took 1.6x as
        # long); the young generations are as small as what the cell kept.
        self.grown += sum(len(gc.get_objects(generation)) for generation in range(3))
        if not self.collected_at:  # the worker's own start-up: nothing of cells to free
            gc.freeze()
            self.collected_at, self.grown = gc.get_freeze_count(), 0
            return
        if self.grown <= self.collected_at // 4:
            return
        gc.unfreeze()
        _collect_all(2)
        gc.freeze()
        self.collected_at, self.grown = gc.get_freeze_count(), 0

    def _warm_up_here(self) -> None:
        """In the holder, once its backup is forked and no request came for
        WARM_UP_AFTER: copy in the pages the last request wrote (the backup
        listed them, ``hot_pages``), as a standby does, so the next request
        does not fault on them one by one (they are shared with the backup)."""
        self.warmed = False
        if select.select([self.channel.read_fd], [], [], WARM_UP_AFTER)[0]:
            return
        self.warmed = True
        hot_pages.prefault(self.generation, self.channel.read_fd, clip=True)

    def _run_here(self, backup: _Child, msg: dict[str, Any]) -> None:
        """Run a request in this process (the holder), watched by its backup."""
        self.backups.append(backup.pid)
        hot_pages.started(self.generation)  # the list the last backup may still be making is of no use
        interrupts.record_stops()  # from here an interrupt is kept for the request's code
        try:
            backup.ctl.send(msg)
        except OSError:  # the backup was killed from outside: a new one, then the request
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.close(backup.ctl.read_fd)
            os.close(backup.ctl.write_fd)
            self.pending = msg
            return
        inflight.passed()
        self._ctl = backup.ctl
        self._run_request(msg, *self._open_streams())

    def _open_streams(self) -> tuple[Any, Any, FdCapture | None]:
        """A request's stdout and stderr, and the capture of fds 1 and 2
        (None when its reader thread cannot start: the request tries again)."""
        from .streams import OutStream, start_captures

        out = OutStream("stdout", self.channel, 1)
        err = OutStream("stderr", self.channel, 2)
        try:
            return out, err, start_captures(out, err)
        except RuntimeError:  # "can't start new thread": the sandbox's process cap is spent now
            return out, err, None

    def _reap_backups(self) -> None:
        for pid in list(self.backups):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0]
            except ChildProcessError:  # reaped by a cell's own os.wait()
                done = pid
            if done:
                self.backups.remove(pid)

    def _prepare(self, out: Any, err: Any) -> None:
        """Do now, while idle, the set-up every request repeats before its code runs.

        This process shares every page with the holder until it writes to it,
        and each first write is a copy-on-write fault: a trivial cell's set-up
        took 130 of them (0.4 ms on a 2-core VM), 30 once done here; the
        warm-ups (``warmup``) do the same for ``run_cell``, and ``hot_pages``
        for the pages the last request wrote. Everything is done
        again with the request's own values; none of it runs user code or is
        seen outside this process. The warm-ups wait until no request came for
        WARM_UP_AFTER: cells and widget messages sent back to back (nbclient,
        a dragged slider) arrive sooner, and a warm-up already under way
        (about 1 ms) would only delay them."""
        from . import comms
        from .streams import start_flusher

        sys.stdout, sys.stderr = out, err
        _install_host_requests(self.channel, self._ctl, False, out, err)
        comms.set_parent("", "execute_request")
        self.channel.set_output_budget(None)
        self.shell.payload_manager.clear_payload()
        self.shell._last_error = None
        self.warmed = False
        wait = WARM_UP_AFTER
        shell = self.shell
        steps = (
            start_flusher,
            lambda: warmup.warm_compiler(shell),
            lambda: warmup.warm_run_cell(shell),
            lambda: hot_pages.prefault(self.generation, self._ctl.read_fd),
        )
        for step in steps:
            if select.select([self._ctl.read_fd], [], [], wait)[0]:
                return
            wait = 0
            self.warmed = True
            step()

    def _kill_standby(self) -> None:
        if self.standby is not None:
            _signal(self.standby.pid, signal.SIGKILL)
            os.waitpid(self.standby.pid, 0)
            os.close(self.standby.ctl.read_fd)
            os.close(self.standby.ctl.write_fd)
            self.standby = None

    def fork(self, msg: dict[str, Any], body: Callable[[dict[str, Any], Channel], dict[str, Any]]) -> None:
        """Run a query (completion, inspection, checkpoint) in a throw-away child."""
        child = self._fork_child()
        if child is None:
            sys.stdout = sys.stderr = Sink()  # a completer's prints are no cell's output
            try:
                result = body(msg, self._ctl)
            except BaseException as exc:
                result = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            self._finish_child(result, takeover=False, request_id=msg.get("id"))
        else:
            self._supervise(child, msg, takeover=False)

    def _supervise(
        self,
        child: _Child,
        msg: dict[str, Any],
        takeover: bool,
        watching_holder: tuple[int, str] | None = None,
        holder_death: int | None = None,
    ) -> None:
        """Relay the host's messages about a request to the process running
        it, and report its end. ``watching_holder``: this is a backup and the
        process is the holder, its parent, whose exit status only the anchor
        can wait for (the ``deaths`` mark taken before the fork), and the
        names of the threads that die with it; ``holder_death`` the watch on
        its death taken while it was the parent (a pidfd opened now could
        name another process, or none: the holder may be dead and reaped by
        the time this process runs), which this closes."""
        pid = child.pid
        result_channel = child.ctl
        res_r = result_channel.read_fd
        ctl_w = result_channel.write_fd
        pidfd: int | None
        if watching_holder is not None:
            pidfd = holder_death
        else:
            try:
                pidfd = os.pidfd_open(pid)
            except (AttributeError, OSError):  # pragma: no cover
                pidfd = None
        watch = [res_r, self.channel.read_fd] + ([pidfd] if pidfd is not None else [])
        result: dict[str, Any] | None = None
        after_pause = True
        last_interrupt = -INTERRUPT_SPACING
        nudge_at: float | None = None  # after an interrupt, while the request runs on
        while result is None:
            timeout = 0.1 if pidfd is None else None
            if nudge_at is not None:
                if time.monotonic() >= nudge_at:
                    _signal(pid, interrupts.NUDGE)
                    nudge_at = time.monotonic() + NUDGE_EVERY
                timeout = max(0.0, min(timeout or NUDGE_EVERY, nudge_at - time.monotonic()))
            ready, _, _ = select.select(watch, [], [], timeout)
            if res_r in ready:
                try:
                    report = result_channel.recv()
                    result, after_pause = report["result"], report.get("warmed") is not False
                except (ChannelClosed, ValueError, KeyError):
                    break  # the child died while (or before) reporting
                continue
            if pidfd is not None:
                ended = pidfd in ready
            else:  # no watch: looked at every 0.1 s (the holder is not this process's child)
                ended = os.getppid() != pid if watching_holder is not None else bool(os.waitpid(pid, os.WNOHANG)[0])
            if ended:
                # drain a result written just before the exit
                if select.select([res_r], [], [], 0)[0]:
                    continue
                break
            if self.channel.read_fd in ready:
                try:
                    incoming = self.channel.recv()
                except ChannelClosed:
                    os.kill(pid, signal.SIGKILL)
                    os._exit(CHANNEL_CLOSED_EXIT)
                op = incoming.get("op")
                if op == Op.INTERRUPT:
                    if time.monotonic() - last_interrupt >= INTERRUPT_SPACING:
                        last_interrupt = time.monotonic()
                        _signal(pid, signal.SIGINT)
                        nudge_at = nudge_at or last_interrupt + NUDGE_EVERY
                elif op == Op.KILL:
                    _signal(pid, signal.SIGKILL)
                elif op in (Op.INPUT_REPLY, Op.RATCHET_REPLY):
                    try:
                        result_channel.send(incoming)
                    except OSError:
                        pass
                elif op == Op.SHUTDOWN:
                    _signal(pid, signal.SIGKILL)
                    self._kill_standby()
                    os._exit(SHUTDOWN_EXIT)
                elif isinstance(incoming.get("id"), str):
                    # The host sends one request at a time (it waits for one
                    # whose caller was cancelled, ``Session._settle``): one
                    # that came anyway is answered, not dropped, so its caller
                    # is not left waiting for ever.
                    self.channel.send(
                        {
                            "type": Msg.DONE,
                            "id": incoming["id"],
                            "status": "error",
                            "ename": "SandboxBusy",
                            "evalue": f"the sandbox was still busy with request {msg.get('id')!r}",
                            "traceback": [],
                        }
                    )
        if result is not None and takeover:
            # DONE first: "released" wakes the child, which then forks the next
            # standby at once, and on a busy or small machine this process
            # would wait for a CPU behind that fork (1.3 ms measured) with
            # the cell's DONE unsent. The host's next frames wait in the pipe
            # until the child, now the reader, reads them.
            self.channel.send({"type": Msg.DONE, "id": msg.get("id"), **result})
            hand_over_captures()  # the child reads on what processes of cells write
            try:  # this process reads the channel no more: the child may
                result_channel.send({"released": True})
            except OSError:
                pass  # it died: told below
            # Threads earlier cells left here may be writing a frame: it
            # must be whole, and no other begun, before this process goes.
            self.channel.stop_sending()
            died = self._successor_died(pid, res_r, pidfd, watching_holder)
            if died is not None:
                for fd in (res_r, ctl_w) + ((pidfd,) if pidfd is not None else ()):
                    os.close(fd)
                self._hold_again(died, msg, watching_holder[1] if watching_holder else "")
                return
            # The child now holds the state. Tearing this address space
            # down costs CPU just when the host handles DONE: done last, at
            # the lowest priority, and only once the child forked
            # (``_let_old_holder_go``).
            try:
                os.nice(19)
            except OSError:
                pass
        os.close(res_r)
        os.close(ctl_w)
        if pidfd is not None:
            os.close(pidfd)
        if result is not None and takeover:
            # Last, and only if the machine has a moment: the pages the child
            # wrote, for its standby to copy in while it waits (hot_pages).
            # Not after a request sent back to back: the next will likely be
            # too, and its standby has no time to copy anything in (listing
            # took 1.5-4 ms of CPU per cell with pandas loaded, of 20-25 ms
            # for the whole kernel).
            if after_pause:
                hot_pages.record(self.generation + 1, pid)
            os._exit(0)
        if result is not None:
            os.waitpid(pid, 0)
            self.channel.send({"type": Msg.DONE, "id": msg.get("id"), **result})
            return
        if watching_holder is None:
            _, status = os.waitpid(pid, 0)
            death = _describe_status(status)
        else:
            mark, threads = watching_holder
            seen = deaths.status_of(pid, mark)
            death = _describe_status(seen) if seen is not None else {"reason": "the cell's process ended"}
            death["threads_lost"] = threads  # what used them (an executor, a pool) would wait forever: said
        self.channel.send({"type": Msg.DONE, "id": msg.get("id"), "status": "died", **death})

    @staticmethod
    def _successor_died(pid: int, res_r: int, pidfd: int | None, watching_holder: tuple[int, str] | None) -> int | None:
        """In the old holder, once the child that ran a request was released:
        None if it, or a process it forked (its standby or backup, which
        takes over if it dies), holds the state now; each writes a byte on
        the pipe (``_let_old_holder_go``). The child's wait status if it
        died and the pipe ended with no byte: nothing has the request's
        state, and this process must hold its own again. A child alive but
        slow to fork (a full garbage collection first) holds it; so, as far
        as this process can tell, does a dead one whose pipe a process its
        cell forked keeps open (no end comes): it goes, as before. A backup
        does the same for the holder that ran the request in place.
        ``watching_holder`` as for ``_supervise``."""
        watch = [res_r] + ([pidfd] if pidfd is not None else [])
        deadline = time.monotonic() + OLD_HOLDER_WAIT
        while True:
            ready = select.select(watch, [], [], max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                return None
            if res_r in ready:
                try:
                    if os.read(res_r, 1):
                        return None
                except OSError:
                    return None
                # The end with no byte: the child closed its end only by
                # dying, which it may not have finished (fds close before a
                # process is a zombie: waitpid said "alive" then).
                if pidfd is None or not select.select([pidfd], [], [], OLD_HOLDER_WAIT)[0]:
                    return None  # (no pidfd: it goes, as before)
                if watching_holder is not None:  # not this process's child: the anchor waits for it
                    status = deaths.status_of(pid, watching_holder[0])
                    return status if status is not None else int(signal.SIGKILL)  # (as killed, when unknown)
                return os.waitpid(pid, 0)[1]
            watch = [res_r]  # it died: a process it forked may still say it took over

    def _hold_again(self, status: int, msg: dict[str, Any], threads: str) -> None:
        """In the old holder: the child that ran ``msg`` died after it
        reported, before anything took over from it (killed at that moment,
        or by an at-fork hook its cell registered). This process's state,
        from before that request, is the session's again, and the note says
        so under the request, which was reported as ended well. Before, the
        old holder exited all the same, and the session's state was gone."""
        self.channel.resume_sending()
        reclaim_captures()
        hot_pages.forget()
        begin_request(str(msg.get("parent_id") or ""))
        reason = _describe_status(status, "This cell's process")["reason"]
        self._note(
            f"{reason} right after the cell ended, before it held the session's state: the session goes "
            f"on from the state before this cell, and what this cell changed is lost{_threads_ended(threads)}"
        )

    # ---- request bodies (run in the forked child) -------------------------------------------
    def _execute(
        self, msg: dict[str, Any], ctl: Channel, out: Any, err: Any, capture: FdCapture | None
    ) -> dict[str, Any]:
        shell = self.shell
        sys.stdout, sys.stderr = out, err
        allow_stdin = bool(msg.get("allow_stdin"))
        _install_host_requests(self.channel, ctl, allow_stdin, out, err)
        shell.execution_count = int(msg.get("execution_count") or shell.execution_count)
        from . import comms

        parent_id = str(msg.get("parent_id") or "")
        comms.set_parent(parent_id, "execute_request")
        begin_request(parent_id)
        budget = msg.get("max_output_bytes")
        self.channel.set_output_budget(budget if isinstance(budget, int) else None)
        shell.payload_manager.clear_payload()
        shell._last_error = None
        shell._error_in_displayhook = False
        shell.exit_now = False
        res = None
        try:
            with interrupts.interruptible(before_code=True):
                res = cell_loop.run_cell(
                    shell,
                    str(msg.get("code", "")),
                    store_history=bool(msg.get("store_history", True)),
                    silent=bool(msg.get("silent", False)),
                )
        except KeyboardInterrupt:  # before IPython runs the code (its own handlers catch it there)
            pass
        if res is None:  # stopped before its code began: shown as an interrupted cell
            shell.showtraceback((KeyboardInterrupt, KeyboardInterrupt(), None), exception_only=True)
        # a result whose formatting raised (a ``_repr_html_`` that fails) fails its cell, as in ipykernel
        succeeded = res is not None and res.success and not shell._error_in_displayhook
        reply: dict[str, Any] = {"status": "ok" if succeeded else "error", "execution_count": shell.execution_count}
        if res is None:
            error = shell._last_error or {}
            reply.update(ename="KeyboardInterrupt", evalue="", traceback=error.get("traceback") or [])
        elif succeeded:
            expressions = msg.get("user_expressions") or {}
            reply["user_expressions"] = shell.user_expressions(expressions) if isinstance(expressions, dict) else {}
        else:
            error = shell._last_error or {}
            exc = res.error_in_exec or res.error_before_exec
            reply["ename"] = error.get("ename") or (type(exc).__name__ if exc else "Error")
            reply["evalue"] = error.get("evalue") or (str(exc) if exc else "")
            reply["traceback"] = error.get("traceback") or []
        reply["payload"] = shell.payload_manager.read_payload()
        shell.payload_manager.clear_payload()
        reply["exit_now"] = bool(shell.exit_now)  # exit, quit, kernel.do_shutdown: the host ends the kernel
        out.flush()
        err.flush()
        stop_captures(capture)
        out.flush()
        err.flush()
        reply["dropped_output"] = self.channel.dropped_output
        return reply

    def _comm(self, msg: dict[str, Any], ctl: Channel, out: Any, err: Any, capture: FdCapture | None) -> dict[str, Any]:
        """A frontend's widget message: its handlers (a slider's observer, an
        ``interact`` function) run here as a cell would, and their changes are
        kept (this child becomes the holder)."""
        from . import comms

        sys.stdout, sys.stderr = out, err
        _install_host_requests(self.channel, ctl, False, out, err)
        begin_request(str(msg.get("parent_id") or ""))
        budget = msg.get("max_output_bytes")
        self.channel.set_output_budget(budget if isinstance(budget, int) else None)
        status: dict[str, Any] = {"status": "ok"}
        self.shell.exit_now = False
        try:
            with interrupts.interruptible():
                cell_loop.call(lambda: comms.handle(msg))
        except KeyboardInterrupt:
            status = {"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
        for stream in (out, err):
            stream.flush()
        stop_captures(capture)
        out.flush()
        err.flush()
        status["dropped_output"] = self.channel.dropped_output
        status["exit_now"] = bool(self.shell.exit_now)  # a handler's kernel.do_shutdown ends the kernel too
        return status

    def _restore(self, msg: dict[str, Any], ctl: Channel) -> dict[str, Any]:
        from .state import restore

        result = restore(self.shell, msg.get("path"), list(msg.get("imports") or []), list(msg.get("defs") or []))
        return {"status": "ok", **result}

    def _complete(self, msg: dict[str, Any], ctl: Channel) -> dict[str, Any]:
        from IPython.core.completer import provisionalcompleter, rectify_completions

        code = str(msg.get("code", ""))
        cursor = int(msg.get("cursor_pos", len(code)))
        with provisionalcompleter():
            raw = self.shell.Completer.completions(code, cursor)
            comps = list(rectify_completions(code, raw))
        if comps:
            start, end = comps[0].start, comps[0].end
        else:
            start = end = cursor
        return {
            "status": "ok",
            "matches": [c.text for c in comps],
            "cursor_start": start,
            "cursor_end": end,
            "metadata": {
                "_jupyter_types_experimental": [
                    {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature}
                    for c in comps
                ]
            },
        }

    def _inspect(self, msg: dict[str, Any], ctl: Channel) -> dict[str, Any]:
        from IPython.utils.tokenutil import token_at_cursor

        code = str(msg.get("code", ""))
        cursor = int(msg.get("cursor_pos", len(code)))
        name = token_at_cursor(code, cursor)
        try:
            bundle = self.shell.object_inspect_mime(name, detail_level=int(msg.get("detail_level", 0)))
            bundle.pop("text/html", None)
            return {"status": "ok", "found": True, "data": bundle, "metadata": {}}
        except KeyError:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}

    def checkpoint(self, msg: dict[str, Any]) -> None:
        """Write the namespace to the state dir from a forked snapshot.

        Background (the default): a grandchild does it at low priority and the
        anchor reaps it; nothing is sent, the host reads the manifest. With
        ``wait`` the holder waits and reports, used before a sandbox is replaced.
        """
        from .state import checkpoint_failed, write_checkpoint

        args = (self.shell, str(msg.get("path")), int(msg.get("cell", 0)), list(msg.get("def_names") or []))
        random_state = self.random_state  # the forks below are reseeded (_random_state)
        if msg.get("wait"):
            self.fork(msg, lambda m, c: {"status": "ok", **write_checkpoint(*args, random_state)})
            return
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                sys.stdout = sys.stderr = Sink()  # what pickling prints is no cell's output
                try:
                    os.nice(10)
                    write_checkpoint(*args, random_state)
                except OSError as exc:  # a full or read-only disk: the host tells the user
                    checkpoint_failed(args[1], exc)
                finally:
                    os._exit(0)
            os._exit(0)
        os.waitpid(pid, 0)


class _Child:
    """A forked child and the private pipes to it."""

    def __init__(self, pid: int, ctl: Channel) -> None:
        self.pid = pid
        self.ctl = ctl
        #: a backup (``Holder._spawn_backup``), not a standby: requests run in the holder
        self.backup = False


_collect_all = gc.collect


def _collect(generation: int = 2) -> int:
    """``gc.collect`` for cells: a full collection takes in what the process
    inherited (frozen at the fork, and never looked at otherwise), as a cell
    that drops a large structure and calls ``gc.collect()`` expects."""
    if generation == 2:
        gc.unfreeze()
    return _collect_all(generation)


def _background_of_cells() -> bool:
    """Whether threads that cells started are alive in this process (the
    holder), or tasks they started wait on its event loop: a forked child
    would find the threads missing and the tasks frozen. Threads started
    with ``_thread`` alone (ours, in ``streams``) are not counted."""
    main = threading.main_thread()
    return _pidfd_works() and (
        any(
            thread is not main and not isinstance(thread, threading._DummyThread) and thread.is_alive()
            for thread in threading.enumerate()
        )
        or cell_loop.busy()
    )


def _threads_ended(threads: str) -> str:
    """The end of a note on a holder's death: the threads that ended with it (``_thread_names``)."""
    return f"; the threads earlier cells started ended with it ({threads})" if threads else ""


def _death_watch(parent: int) -> int | None:
    """A file descriptor that becomes readable once ``parent``, the process
    this one was forked from, has died: its pidfd, opened while it was still
    this process's parent (so it names that process, not a later one given
    its pid); if it has died already, one that is ready at once (an
    eventfd). None when no descriptor can be had (no pidfd, or a cell
    reached the fd limit): the caller watches ``os.getppid()`` then."""
    fd: int | None = None
    try:
        if os.getppid() == parent:
            fd = os.pidfd_open(parent)
    except ProcessLookupError:
        pass
    except (AttributeError, OSError):
        return None
    if fd is not None:
        if os.getppid() == parent:
            return fd
        os.close(fd)
    try:
        return os.eventfd(1, os.EFD_CLOEXEC)
    except (AttributeError, OSError):
        return None


def _reparented(pid: int, timeout: float) -> bool:
    """Whether this process's parent, ``pid``, died within ``timeout`` (its
    orphans go to the anchor, the subreaper)."""
    deadline = time.monotonic() + timeout
    while os.getppid() == pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _thread_names(most: int = 8, length: int = 60) -> str:
    """The threads of cells alive here, for the message if they die (their
    names are the cells', so only a few, and short)."""
    names = sorted(t.name[:length] for t in threading.enumerate() if t is not threading.main_thread())
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


_pidfd: bool | None = None


def _pidfd_works() -> bool:
    """A backup can watch the holder, its parent, only through a pidfd (Linux 5.3)."""
    global _pidfd
    if _pidfd is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _pidfd = True
        except (AttributeError, OSError):
            _pidfd = False
    return _pidfd


#: how long a standby waits for its request before warming up (see Holder._prepare)
WARM_UP_AFTER = 0.01
#: time for the host to send a cell's reply and idle status once it has the
#: cell's result (3 ms was enough on a 2-core VM): work the sandbox can put
#: off until then should not compete with it for the CPU
REPLY_WINDOW = 0.003
#: requests whose code runs in the sandbox: the host waits for their end
#: without a limit (no cell timeout by default), so one lost is reported
USER_CODE_OPS = frozenset({Op.EXECUTE, Op.COMM, Op.RESTORE})

#: the longest the old holder waits for the new one to fork before it exits
#: (a full garbage collection may come first, ``Holder._collect_if_due``)
OLD_HOLDER_WAIT = 0.5

#: the least time between two SIGINTs the holder passes to one request's process:
#: a burst of interrupts (the button pressed again and again) could otherwise
#: raise a second KeyboardInterrupt while the first is being handled outside
#: the cell's code, where nothing catches it, and the process would die
#: instead of reporting the interrupt
INTERRUPT_SPACING = 0.05
#: how often the holder wakes a request's process from a blocking call while
#: it runs on after an interrupt (``interrupts.NUDGE``); the host kills it
#: once its grace (5 s by default) is over
NUDGE_EVERY = 0.5


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _random_state() -> object:
    """The ``random`` module's state at the end of a request, for the next one.

    CPython reseeds that module in every forked child (``random`` registers its
    ``seed`` as an at-fork hook), so after ``random.seed(42)`` the next cell,
    in a process forked from this one, drew other numbers than in ipykernel.
    Taken in the request's process: a ``getstate`` a cell replaced runs there,
    never in the holder. None when the module is not imported or says nothing."""
    module = sys.modules.get("random")
    try:
        return module.getstate() if module is not None else None
    except Exception:
        return None


def _set_random_state(state: object) -> None:
    """Put back, before a request's code runs, what ``_random_state`` took
    when the last request ended (the at-fork reseed, and anything a warm-up
    drew, are undone)."""
    module = sys.modules.get("random")
    if state is None or module is None:
        return
    try:
        module.setstate(state)
    except Exception:
        pass  # a module a cell replaced, or an odd state: the reseeded one stays


_input_ids = itertools.count(1)


#: the request whose host requests (input(), the ratchet) can be answered
#: now; None between requests (``_install_host_requests``)
_answerable: object | None = None
#: held by the one thread reading the private pipe for an answer (a new lock
#: per request: one a thread held when this process forked stays locked)
_pipe_reader = threading.Lock()
#: whether the running request's client answers input() (``_breakpoint_hook``)
_stdin_allowed = False


def _end_host_requests() -> None:
    """The request ended: its private pipe is closed (its fd may be another
    pipe's soon), and nothing relays answers until the next request.

    A thread of the cell still waiting for an answer (an ``input()`` the
    user has not answered) reads the pipe under ``_pipe_reader``: once this
    returns it reads no more, and this process reads the pipe alone."""
    global _answerable
    _answerable = None
    with _pipe_reader:
        pass


def _install_host_requests(channel: Channel, ctl: Channel, allow_stdin: bool, out: Any, err: Any) -> None:
    """Route what a cell asks of the host (input(), getpass, the ratchet) over the
    channel, with the answers relayed by the holder on the private pipe.

    Only while that request runs: a thread or a task of the cell that asks
    later gets an error that says so, and nothing is sent. Before, its
    frame went to the host, which answers no request between cells, and it
    read the closed pipe (EBADF) or whatever pipe had taken its fd number
    since (a standby's: it could take the standby's messages). One still
    waiting when the cell ends gets an error then, and leaves the pipe to
    the process (before, it could take the frame that hands the state over)."""
    global _answerable, _pipe_reader, _stdin_allowed
    from IPython.core.error import StdinNotImplementedError

    token = _answerable = object()
    lock = _pipe_reader = threading.Lock()
    _stdin_allowed = allow_stdin
    ended = "was called after its cell ended (from a thread or a task of it): the host answers only while the cell runs"
    cut = "was still waiting when its cell ended (a thread or a task of it asked): the host answers only while the cell runs"

    def answer(wanted: Callable[[dict[str, Any]], bool], failure: Callable[[], BaseException]) -> dict[str, Any]:
        """The first answer on the pipe ``wanted`` accepts (others, an
        interrupted prompt's, are dropped), read by one waiting thread at a
        time; ``failure()`` is raised once the request has ended."""
        while True:
            with lock:
                if _answerable is not token:
                    raise failure()
                if select.select([ctl.read_fd], [], [], 0.1)[0]:
                    reply = ctl.recv()
                    if wanted(reply):
                        return reply

    def ask(prompt: Any = "", password: bool = False) -> str:
        caller = "getpass" if password else "input()"  # named as ipykernel names them
        if _answerable is not token:
            raise StdinNotImplementedError(f"{caller} {ended}")
        if not allow_stdin:
            raise StdinNotImplementedError(
                f"{caller} was called, but this frontend does not support input requests "
                "(the client did not set allow_stdin)."
            )
        out.flush()
        err.flush()
        req = next(_input_ids)
        channel.send({"type": Msg.INPUT_REQUEST, "prompt": str(prompt), "password": password, "req": req})
        # a reply to an earlier, interrupted prompt is not this one's
        reply = answer(
            lambda a: a.get("op") == Op.INPUT_REPLY and a.get("req") in (req, None),
            lambda: StdinNotImplementedError(f"{caller} {cut}"),
        )
        value = reply.get("value", "")
        if not isinstance(value, str):
            value = str(value)
        if value == "\x04":
            raise EOFError
        return value

    builtins.input = lambda prompt="": ask(prompt)
    getpass.getpass = lambda prompt="Password: ", stream=None: ask(prompt, password=True)

    def ratchet(payload: dict[str, Any]) -> dict[str, Any]:
        if _answerable is not token:
            raise RuntimeError(f"sandbox_kernel.private {ended}")
        out.flush()
        err.flush()
        channel.send({"type": Msg.RATCHET, **payload})
        return answer(lambda a: a.get("op") == Op.RATCHET_REPLY, lambda: RuntimeError(f"sandbox_kernel.private {cut}"))

    from . import private

    private._request = ratchet
    if sys.breakpointhook is sys.__breakpointhook__:  # ours, unless a cell set its own
        sys.breakpointhook = _breakpoint_hook


def _breakpoint_hook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` in the worker (a hook a cell sets stays; Python's
    own, put back, is replaced again at the next request).

    ipykernel's hook (debugpy's) does nothing while no debugger is attached,
    so a ``breakpoint()`` left in a notebook runs through under nbclient and
    papermill, which answer no ``input()``; so it does here, and after its
    cell ended. Where the frontend answers ``input()``, pdb stops in the
    caller's frame, as in IPython."""
    if _answerable is None or not _stdin_allowed:
        return None
    # PYTHONBREAKPOINT as Python reads it (the worker's interpreter runs
    # with -I, so sys.__breakpointhook__ would not see a cell's setting)
    chosen = os.environ.get("PYTHONBREAKPOINT", "")
    if chosen == "0":
        return None
    if chosen not in ("", "pdb.set_trace"):
        import importlib
        import warnings

        module, _, name = chosen.rpartition(".")
        try:
            hook = getattr(importlib.import_module(module or "builtins"), name)
        except (ImportError, AttributeError):
            warnings.warn(f'Ignoring unimportable $PYTHONBREAKPOINT: "{chosen}"', RuntimeWarning, stacklevel=2)
            return None
        return hook(*args, **kwargs)
    import pdb  # noqa: T100  (the debugger breakpoint() asks for)

    pdb.Pdb().set_trace(sys._getframe(1))  # in the caller's frame, not this one
    return None


def main() -> None:
    read_fd, write_fd = _high_fd(0), _high_fd(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    channel = Channel(read_fd, write_fd, frame_lock_fd())
    hot_pages.share()
    deaths.share()
    inflight.share()
    gc.collect = _collect
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupts.install_nudge()
    started = time.monotonic()
    from .shell import make_shell

    shell = make_shell(channel)
    from . import comms, private

    comms.install(channel)

    private.install(shell)
    warmup.remember(shell)
    warmup.copy_font_list()
    sys.stdout = sys.stderr = Sink()
    _set_subreaper()
    # PROXIED sandboxes: the forwarder's port is bound before the first cell
    # can run, and served by the anchor (which never runs user code).
    forwarder = proxy_forward.start_from_env()
    channel.send(
        {
            "type": Msg.READY,
            "python": sys.version.split()[0],
            "pid": os.getpid(),
            "startup_seconds": round(time.monotonic() - started, 3),
        }
    )
    pid = os.fork()
    if pid == 0:
        if forwarder is not None:
            forwarder.close()  # the anchor's; cells must not accept on it
        holder = Holder(channel, shell)
        try:
            holder.serve()
        except BaseException:
            # A forked child that does not hold the state (a cell's process)
            # ends alone, and its holder reports the death, as before.
            try:
                import traceback

                traceback.print_exc(file=sys.__stderr__)  # fd 2: the host's log (a request's, while one runs)
                if not holder.forked_child:
                    holder._kill_standby()
            finally:
                os._exit(1 if holder.forked_child else BROKEN_EXIT)
        os._exit(0)
    os.close(write_fd)
    if forwarder is not None:
        proxy_forward.serve(
            forwarder, os.environ[proxy_forward.SOCKET_ENV], os.environ.get(proxy_forward.TOKEN_ENV, "")
        )
    _anchor(read_fd)


def _leave_on_hangup(read_fd: int) -> None:
    """Leave once the host's end of the channel is closed (the host, or the
    Docker CLI attached for it, is gone). The holder reads that EOF too, but
    a cell can SIGSTOP its holder; the anchor runs no user code and, as
    PID 1 of a Docker sandbox (``SandboxSpec.own_init``), cannot be stopped
    from inside. Only POLLHUP is asked for: the anchor never reads a byte
    meant for the holder."""
    poller = select.poll()
    poller.register(read_fd, 0)

    def watch() -> None:
        while True:
            for _, events in poller.poll():
                if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(0)

    threading.Thread(target=watch, name="channel-hangup", daemon=True).start()


def _anchor(read_fd: int) -> None:
    """Reap every orphan; leave when the holder asked to shut down, when it lost
    the host's channel, when that channel hangs up, on SIGTERM, or when none
    is left. Leaving ends the sandbox (the init of its PID namespace, bwrap's,
    docker-init or the anchor itself, kills what remains)."""
    # As PID 1 (Docker), SIGTERM (docker stop, the CLI forwarding the
    # kernel's death) would be ignored without a handler.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    _leave_on_hangup(read_fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:  # pragma: no cover
            continue
        deaths.record(pid, status)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (SHUTDOWN_EXIT, CHANNEL_CLOSED_EXIT, BROKEN_EXIT):
            os._exit(0)


if __name__ == "__main__":
    main()
