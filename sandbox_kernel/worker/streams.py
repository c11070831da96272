"""stdout/stderr of a running cell, streamed to the host while the cell runs.

Python-level writes go through ``OutStream`` (in-process, so they stay in
order with display messages); bytes written to fds 1 and 2 by subprocesses
(``!ls``) or C code are captured through pipes by a reader thread.

Threads here are started with ``_thread``, not ``threading.Thread``: in a
freshly forked process of a large namespace, ``Thread.start()`` (which waits
for the new thread to run, and writes threading's bookkeeping, a copy-on-write
fault per page) cost 0.45 ms a thread against 0.06-0.09 ms, and each request's
process started three.
"""

from __future__ import annotations

import _thread
import codecs
import contextvars
import fcntl
import io
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Callable

from .channel import Channel
from .protocol import Msg

#: how long written text waits to be sent with what follows, as in ipykernel
#: (its ``flush_interval``): a cell's prints within it are one stream output,
#: which nbclient and papermill save as such (each message is an output there)
FLUSH_INTERVAL = 0.2
#: characters per stream message (at most 1 MiB of UTF-8)
CHUNK_CHARS = 256 * 1024
#: the longest a flush waits for output of C code or subprocesses already in
#: the capture pipes (``drain_captures``)
DRAIN_WAIT = 0.1


#: the stream of each name that the running (or last) request's process made
_current: dict[str, OutStream] = {}

#: the Jupyter message (its msg_id) that the request running code here came
#: for. An asyncio task copies the context it is created in, so what a task
#: prints later, while another cell runs or none, is published under the
#: cell that created it, as with ipykernel's parent header (a contextvar
#: there too). Threads start with an empty context: their output goes under
#: the last request, as in ipykernel.
request_parent: contextvars.ContextVar[str] = contextvars.ContextVar("request_parent", default="")
_running_parent = ""


def begin_request(parent_id: str) -> None:
    """The request about to run came for ``parent_id`` (its code and what it
    creates see it)."""
    global _running_parent
    _running_parent = parent_id
    request_parent.set(parent_id)


def parent_tag(parent: str | None = None) -> dict[str, str]:
    """What a frame of output says of its parent: nothing when it is the last
    request's (the host's default), else the earlier request it belongs to."""
    if parent is None:
        parent = writer_parent()
    return {"parent": parent} if parent and parent != _running_parent else {}


def writer_parent() -> str:
    """The request the code writing now belongs to: a thread's is the
    running (or last) request's, as ipykernel's global parent header."""
    return request_parent.get() or _running_parent


class OutStream(io.TextIOBase):
    """A text stream that batches writes into ``stream`` messages.

    Each request's process makes its own pair, but a cell may keep one (``out
    = sys.stdout``, a logging handler, ``tqdm(file=sys.stderr)``, a default
    argument): in ipykernel that is the one stream of the kernel, and writing
    to it in a later cell shows there, in order. So a write to an earlier
    request's stream goes to the current stream of its name (it waited in the
    old one's buffer, unsent, and came out cells later or never). Only from
    the main thread, where cells run: a thread an earlier cell left writing
    to its stream keeps its own buffer, so its lines and the cell's never mix
    (tests/test_background_threads.py)."""

    def __init__(self, name: str, channel: Channel, fileno: int) -> None:
        super().__init__()
        self.name = name
        self.channel = channel
        self._fileno = fileno
        self._buffer: list[str] = []
        self._buffer_parent = ""  # request_parent of what the buffer holds
        self._lock = threading.RLock()
        self._buffered = 0  # characters in the buffer
        self._pending = False  # what the buffer holds waits for the flusher
        self._pid = os.getpid()
        _current[name] = self

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "UTF-8"  # ipykernel's spelling (libraries compare it)

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "replace"

    def fileno(self) -> int:
        return self._fileno

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def _redirected(self) -> OutStream | None:
        """The current stream of this name, when this is an earlier
        request's and the main thread uses it: where its writes go."""
        current = _current.get(self.name, self)
        if current is not self and _thread.get_ident() == threading.main_thread().ident:
            return current
        return None

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        current = self._redirected()
        if current is not None:
            return current.write(text)
        parent = writer_parent()
        with self._lock:
            if parent != self._buffer_parent:
                if self._buffer:  # one frame, one parent: what waits goes out first
                    self.flush()
                self._buffer_parent = parent
            self._buffer.append(text)
            self._buffered += len(text)
            if self._buffered >= CHUNK_CHARS:  # a flood is sent (or dropped, over budget) as it comes
                self.flush()
            elif os.getpid() != self._pid:
                # a process a cell forked (a multiprocessing worker) may be
                # terminated any moment (Pool.__exit__) and never flush, and
                # its prints were lost: sent at once, as ipykernel does
                self.flush()
            elif not self._pending:
                flusher = _get_flusher()
                if flusher is None:  # no thread can start (the process cap): no waiting either
                    self.flush()
                else:
                    self._pending = True
                    flusher.schedule(self, time.monotonic() + FLUSH_INTERVAL)
        return len(text)

    def flush(self) -> None:
        current = self._redirected()
        if current is not None:
            # a flush of a stream an earlier cell kept (a logging handler made
            # by ``basicConfig``) sends what went there, as ipykernel's one stream would
            current.flush()
        # Sent under the lock: two threads flushing one stream (a thread of a
        # cell, the flusher) could otherwise send what they took in the other
        # order.
        with self._lock:
            self._pending = False
            if not self._buffer:
                return
            text = "".join(self._buffer)
            self._buffer.clear()
            self._buffered = 0
            if not self.channel.enabled:
                return
            tag = parent_tag(self._buffer_parent)
            # One huge write becomes bounded frames (a 400 MB write used to exceed
            # the frame limit and take the sandbox, and the namespace, down).
            for start in range(0, len(text), CHUNK_CHARS):
                if self.channel.output_exhausted:
                    self.channel.dropped_output += len(text) - start
                    return
                self.channel.send(
                    {"type": Msg.STREAM, "name": self.name, "text": text[start : start + CHUNK_CHARS], **tag}
                )


class Sink:
    """sys.stdout/stderr where nothing may be seen: a restore, a standby's
    warm-up, a completion or inspection, a checkpoint writer."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _start_thread(target: Callable[[], None], returned: threading.Event | None = None) -> None:
    """A daemon thread, without ``Thread.start()``'s wait (see the module's
    docstring); ``returned`` is set once ``target`` has returned. Raises
    RuntimeError when no thread can start."""
    _thread.start_new_thread(_run_recorded, (target, returned))


#: native ids of this module's threads that have returned but may not have
#: exited yet (see wait_for_thread_exits)
_exiting: set[int] = set()
_exiting_lock = threading.Lock()


def _run_recorded(target: Callable[[], None], returned: threading.Event | None) -> None:
    try:
        target()
    finally:
        with _exiting_lock:
            _exiting.add(_thread.get_native_id())
        if returned is not None:
            returned.set()


def wait_for_thread_exits(timeout: float = 0.01) -> bool:
    """Wait until this module's threads that returned have also exited.

    A thread is gone from the interpreter only some microseconds after its
    function returned (and after ``Thread.join()`` would return): it still
    has to free the 16 KiB chunk its frames lived in. A fork in that window,
    or while the thread is alive, copies the chunk into the child, where no
    thread frees it: every cell's process is forked from the last, so each
    one kept those of all before it (a spaced cell left one, through the
    flusher: 400 cells, 440 more memory mappings, each making every later
    fork and exit slower). False when some thread has not exited in time."""
    deadline = time.monotonic() + timeout
    while True:
        with _exiting_lock:
            _exiting.difference_update([tid for tid in _exiting if not os.path.exists(f"/proc/self/task/{tid}")])
            if not _exiting:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.00005)


class _Flusher:
    """Sends what a stream holds FLUSH_INTERVAL after its first write since
    the last send: one thread per process (a timer thread per write used to
    cost a thread start in every request that printed)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._due: dict[OutStream, float] = {}
        self._stopping = False
        self._returned = threading.Event()
        _start_thread(self._run, self._returned)

    def stop(self, timeout: float = 0.05) -> list[OutStream]:
        """End the thread; return the streams it had yet to flush."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            due = list(self._due)
            self._due.clear()
        self._returned.wait(timeout)
        return due

    def schedule(self, stream: OutStream, at: float) -> None:
        with self._cond:
            if stream not in self._due:
                self._due[stream] = at
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                now = time.monotonic()
                ready = [stream for stream, at in self._due.items() if at <= now]
                if not ready:
                    self._cond.wait(min(self._due.values()) - now)
                    continue
                for stream in ready:
                    del self._due[stream]
            for stream in ready:
                if stream._pending:
                    try:
                        stream.flush()
                    except Exception:  # a broken channel: the thread must outlive it
                        pass


_flusher: _Flusher | None = None


#: set from ``quiesce`` until the fork: a thread of a cell that writes then
#: must not start a flusher that the forked process would inherit
_quiescing = False


def _get_flusher() -> _Flusher | None:
    """This process's flusher, started if need be; None when none may run
    (the write is then sent at once)."""
    if _flusher is None and not _quiescing:
        start_flusher()
    return _flusher


def start_flusher() -> None:
    """Start this process's flusher unless it has one (a forked process
    inherits the object, but not its thread, and maybe a lock that thread
    held: it starts its own)."""
    global _flusher
    if _flusher is not None:
        return
    try:
        _flusher = _Flusher()
    except RuntimeError:  # "can't start new thread": partial lines are flushed at once
        _flusher = None


def flusher_running() -> bool:
    return _flusher is not None


def stop_flusher() -> None:
    """End this process's flusher thread, if it has one, and send what it
    had yet to: a stream stays marked as waiting for the flusher until it
    flushes, so a thread printing between cells (the holder stops its
    flusher before every fork) had every later line held back for good."""
    global _flusher
    flusher, _flusher = _flusher, None
    if flusher is not None:
        for stream in flusher.stop():
            try:
                stream.flush()
            except Exception:  # a broken channel: the holder finds out when it reads
                pass


def quiesce() -> None:
    """Before the holder forks the next standby: end the flusher and wait
    for this module's threads that returned to be gone, so that the standby,
    and every process after it, inherits nothing of theirs (see
    wait_for_thread_exits). A reader thread still forwarding a background
    process's output stays. Until the fork, what threads of cells write
    is sent at once."""
    global _quiescing
    _quiescing = True
    stop_flusher()
    wait_for_thread_exits()


def _forked() -> None:
    global _quiescing
    _quiescing = False


def _forget_threads() -> None:
    """In a forked child none of this module's threads exists: forget the
    parent's flusher (the child starts its own) and its exiting threads, and
    replace the lock one of them may have held at the fork."""
    global _flusher, _exiting_lock
    _flusher = None
    _exiting.clear()
    _exiting_lock = threading.Lock()
    _forked()


os.register_at_fork(after_in_child=_forget_threads, after_in_parent=_forked)


#: captures whose reader has not yet seen the end of every pipe: a process a
#: cell started (a server, ``Popen``) still writes to them
_open_captures: list[FdCapture] = []
#: this process's pipe that tells its readers to stop (``hand_over_captures``)
_stop_pipe: tuple[int, int] | None = None
_stop_pid = 0


def _stop_fd() -> int:
    """This process's stop pipe, made anew in a forked one: a copy inherited
    from the parent is the parent's, and would stop this process's readers
    when the parent hands over."""
    global _stop_pipe, _stop_pid
    if _stop_pid != os.getpid():
        if _stop_pipe is not None:
            for fd in _stop_pipe:
                os.close(fd)
        _stop_pipe, _stop_pid = os.pipe2(os.O_CLOEXEC), os.getpid()
    assert _stop_pipe is not None
    return _stop_pipe[0]


class FdCapture:
    """Point fds 1 and 2 at pipes and forward what arrives as stream messages,
    from one reader thread.

    A process the request started may hold the pipes after the request (a
    server writing its log): the reader goes on, in the request's process,
    which becomes the holder. That process exits when the next request's
    process takes over, so the reader moves with the state: the old holder
    stops its reader before letting go (``hand_over_captures``) and the new
    one, which inherited the pipes, starts its own (``adopt_captures``).
    The pipes used to be left unread (what such a process wrote after the
    next cell was lost, and once they were full it blocked)."""

    def __init__(self, streams: list[tuple[int, OutStream]]) -> None:
        self._saved: list[tuple[int, int]] = []
        self._readers: dict[int, tuple[OutStream, codecs.IncrementalDecoder]] = {}
        #: the read ends not at their end yet
        self._open: set[int] = set()
        #: set once the reader has forwarded everything and returned
        self.done = threading.Event()
        self.reader_pid = os.getpid()
        #: bytes the reader took from the pipes and handed to their streams
        self.forwarded = 0
        #: the reader holds bytes it read but has not handed on yet
        self.busy = False
        try:
            for fd, stream in streams:
                saved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
                read_end, write_end = os.pipe()
                os.dup2(write_end, fd)
                os.close(write_end)
                self._saved.append((fd, saved))
                self._readers[read_end] = (stream, codecs.getincrementaldecoder("utf-8")("replace"))
                self._open.add(read_end)
            _open_captures.append(self)
            self._stop = _stop_fd()  # made here, not in the reader: readers may start at once
            _start_thread(self._pump, self.done)
        except BaseException:
            if self in _open_captures:
                _open_captures.remove(self)
            self.release()
            for read_end in self._readers:
                os.close(read_end)
            raise

    def _pump(self) -> None:
        stop = self._stop
        try:
            poller = select.poll()
            for read_end in self._open:
                poller.register(read_end, select.POLLIN)
            poller.register(stop, select.POLLIN)
            while self._open:
                self.busy = False
                ready = poller.poll()
                self.busy = True
                if any(fd == stop for fd, _ in ready):
                    return  # handed over: the next holder reads on
                for read_end, _ in ready:
                    stream, decoder = self._readers[read_end]
                    try:
                        chunk = os.read(read_end, 65536)
                    except OSError:
                        chunk = b""
                    if not chunk:  # every writer closed it
                        poller.unregister(read_end)
                        self._open.discard(read_end)
                        os.close(read_end)  # (left open, two fds a cell added up to the fd limit)
                        continue
                    text = decoder.decode(chunk)
                    if text:
                        stream.write(text)
                    self.forwarded += len(chunk)
        finally:
            self.busy = False
            for stream, _ in self._readers.values():
                stream.flush()
            if not self._open:
                try:
                    _open_captures.remove(self)
                except ValueError:
                    pass

    def waiting_bytes(self) -> int:
        """Bytes written to the pipes that the reader has not taken yet."""
        waiting = 0
        for read_end in list(self._open):
            try:
                waiting += struct.unpack("i", fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                pass
        return waiting

    def adopt(self) -> None:
        """Read on, in this process, pipes a reader in the parent read
        (RuntimeError when no thread can start)."""
        self._readers = {
            fd: (stream, codecs.getincrementaldecoder("utf-8")("replace")) for fd, (stream, _) in self._readers.items()
        }
        self.done = threading.Event()
        self.reader_pid = os.getpid()
        self._stop = _stop_fd()
        _start_thread(self._pump, self.done)

    def release(self) -> None:
        """Give the fds back to what they were: the reader sees the end of the
        pipes once no process (a background one) holds them any more."""
        while self._saved:
            fd, saved = self._saved.pop()
            os.dup2(saved, fd)
            os.close(saved)

    def stop(self, timeout: float = 0.5) -> None:
        """Give the fds back and drain what is left, without hanging on
        background processes that still hold the pipes."""
        self.release()
        self.done.wait(timeout)


def _own_live_captures() -> list[FdCapture]:
    """The captures whose reader runs in this process."""
    return [c for c in _open_captures if c.reader_pid == os.getpid() and not c.done.is_set()]


def hand_over_captures(timeout: float = 0.5) -> None:
    """In the old holder, before the new one takes over: stop this process's
    readers of pipes processes of cells still hold, once they forwarded what
    they read (the new holder reads on from where they stopped)."""
    mine = _own_live_captures()
    if not mine:
        return
    _stop_fd()
    assert _stop_pipe is not None
    os.write(_stop_pipe[1], b"\0")
    deadline = time.monotonic() + timeout
    for capture in mine:
        capture.done.wait(max(0.0, deadline - time.monotonic()))


def adopt_captures() -> None:
    """In a process that just took over as the holder: read the pipes that
    processes of cells still hold, which a reader in an earlier holder read."""
    for capture in list(_open_captures):
        if capture.reader_pid != os.getpid() and capture._open:
            try:
                capture.adopt()
            except RuntimeError:  # "can't start new thread": the process cap is spent
                return


def reclaim_captures(timeout: float = 0.5) -> None:
    """In an old holder whose successor died before taking over: read on
    the pipes it handed over (``hand_over_captures``), with a new stop pipe
    (the old one holds the byte that stopped its readers)."""
    global _stop_pipe, _stop_pid
    mine = [c for c in _open_captures if c.reader_pid == os.getpid() and c._open]
    deadline = time.monotonic() + timeout
    for capture in mine:
        capture.done.wait(max(0.0, deadline - time.monotonic()))
    if _stop_pipe is not None and _stop_pid == os.getpid():
        if all(capture.done.is_set() for capture in mine):  # else a reader may still poll it: left open
            for fd in _stop_pipe:
                os.close(fd)
        _stop_pipe, _stop_pid = None, 0
    for capture in mine:
        if capture.done.is_set():
            try:
                capture.adopt()
            except RuntimeError:  # "can't start new thread": the process cap is spent
                return


def drain_captures(timeout: float = DRAIN_WAIT) -> None:
    """Wait until this process's readers have handed to their streams what C
    code and subprocesses already wrote to fds 1 and 2, so that a flush
    before a result, a display or an error sends it first, as ipykernel
    orders it (a ``printf`` came after the cell's result). Only what was
    written before the call is waited for: a process that keeps writing (a
    server's log) costs no more than its backlog, and never over ``timeout``."""
    targets = [(c, c.forwarded + waiting) for c in _own_live_captures() if (waiting := c.waiting_bytes()) or c.busy]
    if not targets:
        return
    deadline = time.monotonic() + timeout
    for capture, target in targets:
        while (capture.forwarded < target or capture.busy) and not capture.done.is_set():
            if time.monotonic() > deadline:
                return
            time.sleep(0.0002)


def start_captures(out: OutStream, err: OutStream) -> FdCapture:
    """Capture fds 1 and 2 (RuntimeError, and nothing left captured, when the
    reader thread cannot start)."""
    return FdCapture([(1, out), (2, err)])


def stop_captures(capture: FdCapture | None, timeout: float = 0.5) -> None:
    if capture is not None:
        capture.stop(timeout)
