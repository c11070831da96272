"""Copy into an idle standby the pages the last request wrote.

Every page a request's process writes is at first shared with the holder, and
the first write to it is a copy-on-write fault: about 3 us each on a 2-core VM.
The warm-ups (``warmup``) take IPython's own ``run_cell`` path off the
request's time, but a widget's handlers and the user's functions write pages
of their own: a slider move still took 150 such faults (0.5 ms). Requests
repeat themselves (the same slider, a cell run again, an agent's loop), so the
pages the last request wrote are the best guess of those the next will write.

Only the old holder can tell which pages those were: a page the request's
process copied is no longer shared with it, so the old holder is left as the
only process that maps its own copy ("exclusively mapped" in
``/proc/self/pagemap``). Before it exits, at the lowest priority (nice 19;
at SCHED_IDLE, widget moves sent back to back with 250 MB in the namespace
took 8% longer, likely because its exit, preempted at every turn, held locks
the new holder's fork needs), only after a request that came after a pause
(one sent back to back is likely followed by another, whose standby would
have no time to use a list) and only if no newer request has started, it
lists those pages in memory every process of the sandbox shares; the next
standby, once idle and warmed up, copies them into itself with
``MADV_POPULATE_WRITE``, which breaks the sharing without changing a byte.
Only ranges that are private and writable in the new holder are
listed (a shared file mapped at an address a freed page had would otherwise
be written to: its modification time would change).

The list is a hint: a wrong one costs memory and time, never content. It is
bounded (MAX_PAGES): a request that wrote more than that (a large array
changed in place) is no guide to the next. A standby's copies count as its
own writes, so the next list is the union of what recent requests wrote;
once that union outgrows the bound one standby goes without, and the list
starts again from that request's own pages. Nothing is copied in by a
standby within a quarter of the sandbox's memory cap: the copies could meet
the cap, and the kernel would kill the sandbox's largest process.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import re
import resource
import select
import struct
import time
from array import array
from typing import Any

PAGE = mmap.PAGESIZE

#: madvise advice (Linux 5.14): fault a range in writable, as a write would
MADV_POPULATE_WRITE = 23

#: a request that wrote more pages than this is no guide to the next one
MAX_PAGES = 2048

#: how long the old holder waits for a next request before it lists: one sent
#: back to back comes sooner, and then the list is of no use (the standby it
#: was for is running); the standby looks for it only after its warm-ups,
#: 10 ms or more after it was forked
LIST_AFTER = 0.005

#: how long an idle standby waits for its list
WAIT_FOR_LIST = 0.03

#: private writable memory (mapped, not resident) beyond which no list is
#: made: an allocator or a runtime may reserve tens of GiB, and each page
#: costs 8 bytes of pagemap to read
SCAN_LIMIT = 4 << 30

#: pagemap entries read at a time (512 KiB)
READ_PAGES = 1 << 16

#: shared words: the generation whose request has started, that of the list,
#: and the list's length in runs (each run a start address and a length)
_HEADER = struct.Struct("<QQQ")

#: pagemap's top byte: bit 63 present, bit 61 a file page or shared memory,
#: bit 56 mapped by this process alone
_OWN_COPY = bytes(0x31 if value & 0x81 == 0x81 and not value & 0x20 else 0x30 for value in range(256))
_RUN = re.compile(b"1+")

_shared: mmap.mmap | None = None
_madvise: Any = None

#: pages this process copied in while it was a standby (tests read it from a
#: cell: the copies happened, and changed nothing the cell can see)
copied_in = 0


def _forget_copies() -> None:
    global copied_in
    copied_in = 0


os.register_at_fork(after_in_child=_forget_copies)


def share() -> None:
    """Map the memory the holders and standbys exchange the list in (before
    the first fork; where it cannot be had, or on a kernel older than 5.14,
    there is no hint)."""
    global _shared, _madvise
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        madvise.restype = ctypes.c_int
        probe = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(probe))
        supported = madvise(address, PAGE, MADV_POPULATE_WRITE) == 0
        del address
        probe.close()
        if not supported:
            return
        _shared = mmap.mmap(-1, _HEADER.size + MAX_PAGES * 16)  # MAP_SHARED: one copy for all
    except (AttributeError, OSError, ValueError, BufferError):
        return
    _madvise = madvise


def _header() -> tuple[int, int, int]:
    assert _shared is not None
    return _HEADER.unpack_from(_shared, 0)


def forget() -> None:
    """Make no standby use the list there is: a backup took over from a
    holder whose threads may have changed its mappings since it was made."""
    if _shared is not None:
        struct.pack_into("<QQ", _shared, 8, 0, 0)


def started(generation: int) -> None:
    """The holder passed a request to the standby of this generation: the
    list for it, if not made yet, is of no use any more (and the old holder
    making it should go: back to back, its exit put off cost the next
    requests)."""
    if _shared is not None:
        struct.pack_into("<Q", _shared, 0, generation)


_PRIVATE_WRITABLE = re.compile(rb"^([0-9a-f]+)-([0-9a-f]+) rw.p", re.MULTILINE)


def _private_writable(pid: int) -> list[tuple[int, int]]:
    with open(f"/proc/{pid}/maps", "rb") as maps:
        text = maps.read()
    return [(int(start, 16), int(end, 16)) for start, end in _PRIVATE_WRITABLE.findall(text)]


def record(generation: int, holder: int) -> None:
    """In the old holder, after ``holder`` (its child) ran the request that
    began this generation: list the pages that child wrote."""
    if _shared is None:
        return
    # Polled, not slept: back to back, the next request starts within a
    # millisecond or two, and this process must then go at once (its exit,
    # put off, cost the next requests 10% with 250 MB in the namespace).
    deadline = time.monotonic() + LIST_AFTER
    while True:
        if _header()[0] >= generation:
            return  # the next request has started: no use for a list
        if time.monotonic() >= deadline:
            break
        time.sleep(0.001)
    runs = array("Q")
    pages = 0
    try:
        ranges = _private_writable(holder)
    except OSError:
        return
    if sum(end - start for start, end in ranges) > SCAN_LIMIT:
        ranges = []  # an empty list: the standby need not wait for one
    try:
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return
    chunks = [
        (first, min(READ_PAGES, end // PAGE - first))
        for start, end in ranges
        for first in range(start // PAGE, end // PAGE, READ_PAGES)
    ]
    try:
        for first, count in chunks:
            flags = os.pread(pagemap, count * 8, first * 8)[7::8].translate(_OWN_COPY)
            for run in _RUN.finditer(flags):
                runs.append((first + run.start()) * PAGE)
                runs.append((run.end() - run.start()) * PAGE)
                pages += run.end() - run.start()
            if pages > MAX_PAGES:
                runs = array("Q")
                break
    except OSError:
        return
    finally:
        os.close(pagemap)
    if _header()[0] >= generation:
        return
    _shared[_HEADER.size : _HEADER.size + len(runs) * 8] = runs.tobytes()
    struct.pack_into("<QQ", _shared, 8, generation, len(runs) // 2)


#: the sandbox's memory cap and use, where its cgroup is in view (a container's;
#: bwrap hides /sys): cgroup v2, then v1
_CGROUP_MEMORY = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def _memory_use_and_cap() -> tuple[int, int] | None:
    """What the sandbox uses of its memory cap: its cgroup's figures when in
    view, else this process's resident size against its address-space limit
    (bwrap sets that to the cap of the sandbox's cgroup). None: no cap."""
    for cap_path, use_path in _CGROUP_MEMORY:
        try:
            with open(cap_path, "rb") as cap_file, open(use_path, "rb") as use_file:
                cap_text, use = cap_file.read().strip(), int(use_file.read())
        except (OSError, ValueError):
            continue
        if cap_text != b"max" and int(cap_text) < 1 << 60:  # v1 says "none" with a huge number
            return use, int(cap_text)
        break
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * PAGE, limit


def _near_memory_cap(more: int) -> bool:
    """Would ``more`` bytes bring the sandbox within a quarter of its memory
    cap? A copy that met the cap would have the kernel kill the largest
    process of the sandbox, maybe the holder: its state would be lost for
    the sake of a hint."""
    try:
        found = _memory_use_and_cap()
    except (OSError, ValueError, IndexError):
        return True
    return found is not None and found[0] + more > found[1] * 3 // 4


def _clipped(runs: array[int], ranges: list[tuple[int, int]]) -> array[int]:
    """The parts of ``runs`` (start, length pairs) inside ``ranges``."""
    starts = [start for start, _ in ranges]
    kept = array("Q")
    for index in range(0, len(runs), 2):
        start, end = runs[index], runs[index] + runs[index + 1]
        at = max(bisect.bisect_right(starts, start) - 1, 0)
        while at < len(ranges) and ranges[at][0] < end:
            low, high = max(start, ranges[at][0]), min(end, ranges[at][1])
            if low < high:
                kept.extend((low, high - low))
            at += 1
    return kept


def prefault(generation: int, request_fd: int, clip: bool = False) -> int:
    """In an idle standby, or a holder beside threads of cells: copy in the
    pages on the list for its generation, waiting for the list at most
    WAIT_FOR_LIST (a request on ``request_fd`` ends the wait). Returns how
    many pages this process has copied in.

    ``clip``, for the holder: threads of cells run on in it and may have
    mapped a shared file where listed private pages were since the list was
    made, so the list is first clipped to the private writable mappings it
    has now. A standby's mappings are those of a holder that had no such
    threads, and it skips that (reading ``/proc/self/maps`` with pandas
    loaded took 1 ms)."""
    if _shared is None:
        return 0
    deadline = time.monotonic() + WAIT_FOR_LIST
    while True:
        _, tag, count = _header()
        if tag == generation:
            break
        if tag > generation or time.monotonic() > deadline:
            return 0
        if select.select([request_fd], [], [], 0.002)[0]:
            return 0
    if not 0 < count <= MAX_PAGES:
        return 0
    global copied_in
    runs = array("Q")
    runs.frombytes(_shared[_HEADER.size : _HEADER.size + count * 16])
    if clip:
        try:
            runs = _clipped(runs, _private_writable(os.getpid()))
        except OSError:
            return copied_in
    if _near_memory_cap(sum(runs[1::2])):
        return copied_in
    for index in range(0, len(runs), 2):
        if index % 64 == 0 and index and select.select([request_fd], [], [], 0)[0]:
            break  # the request is here: it must not wait for the rest
        if _madvise(runs[index], runs[index + 1], MADV_POPULATE_WRITE) == 0:
            copied_in += runs[index + 1] // PAGE
    return copied_in
