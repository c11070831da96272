"""An idle standby copies in the pages the last request wrote (``hot_pages``):
the copies must change nothing a cell can see, and must never write through a
mapping that is not the process's own private memory (real bwrap, through
jupyter_client)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from kernel_helpers import SandboxKernelHandle, bwrap_kernel

COPIED_IN = "import sys\nprint(sys.modules['sandbox_kernel_worker.hot_pages'].copied_in)"

#: long enough for the old holder to list and the standby to copy
IDLE = 0.3


def _spaced(kernel: SandboxKernelHandle, code: str) -> str:
    return kernel.stdout_of(code, after_idle=IDLE)


def test_spaced_cells_find_the_last_cells_pages_copied_in_and_unchanged(kernel: SandboxKernelHandle) -> None:
    """Each cell flips bytes of a 1 MiB buffer (so its pages are the hot ones)
    and notes the digest; the next cell, run by a standby that copied those
    pages in, must find the same digest."""
    _spaced(
        kernel,
        "import hashlib, os\nbuffer = bytearray(os.urandom(1 << 20))\ndigest = hashlib.sha256(buffer).hexdigest()",
    )
    copied = []
    for round_ in range(5):
        out = _spaced(
            kernel,
            "same = hashlib.sha256(buffer).hexdigest() == digest\n"
            f"for i in range(0, len(buffer), 4096): buffer[i] ^= {round_ + 1}\n"
            "digest = hashlib.sha256(buffer).hexdigest()\n"
            "print(same, sys.modules['sandbox_kernel_worker.hot_pages'].copied_in)"
            if round_
            else "import sys\nsame = True\nprint(same, 0)",
        )
        same, pages = out.split()
        assert same == "True", out
        copied.append(int(pages))
    # the buffer's 256 pages and the cell machinery's were on each list
    assert max(copied[2:]) > 256, copied
    assert _spaced(kernel, "print(hashlib.sha256(buffer).hexdigest() == digest)").strip() == "True"


MAP = """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
SIZE = 16 * mmap.PAGESIZE
address = libc.mmap(None, SIZE, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
ctypes.memset(address, 1, SIZE)
with open('shared.bin', 'wb') as fh:
    fh.write(b'x' * SIZE)
"""

# The request writes the private pages (the old holder then holds its own
# copies of them, and would list them), then maps a file shared, read-write,
# at the very same address, without writing to it.
REMAP = """
ctypes.memset(address, 2, SIZE)
fd = os.open('shared.bin', os.O_RDWR)
assert libc.mmap(address, SIZE, 3, 0x11, fd, 0) == address  # MAP_SHARED|MAP_FIXED
os.close(fd)
"""


def test_a_shared_file_mapped_where_written_pages_were_is_never_written(kernel: SandboxKernelHandle) -> None:
    """Copying a page in is a write fault: through a shared file mapping it
    would dirty the file and move its modification time (what the host and
    jupyter_server see of the workspace). The old holder still has private
    pages at that address, written by the last request; only the new holder's
    own mappings decide what may be copied."""
    _spaced(kernel, MAP)
    shared = kernel.workspace / "shared.bin"
    _spaced(kernel, REMAP)
    before = os.stat(shared)
    pages = [int(_spaced(kernel, COPIED_IN)) for _ in range(3)]
    after = os.stat(shared)
    assert max(pages) > 0, pages  # the standbys did copy pages in
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
    assert shared.read_bytes() == b"x" * (16 * os.sysconf("SC_PAGE_SIZE"))
    assert _spaced(kernel, "print(ctypes.string_at(address, 4))").strip() == "b'xxxx'"


def test_cells_back_to_back_copy_nothing(kernel: SandboxKernelHandle) -> None:
    """A request sent before the standby had a moment finds nothing copied in
    (and waited for no copying)."""
    counts = [kernel.run(COPIED_IN).stdout.strip() for _ in range(5)]
    assert counts[1:].count("0") >= 3, counts


def test_no_list_is_made_after_a_request_sent_back_to_back(kernel: SandboxKernelHandle) -> None:
    """The old holder lists what a request wrote only if that request came
    after a pause: one sent back to back is likely followed by another, whose
    standby would have no time to copy anything in, and listing cost up to a
    fifth of the kernel's CPU per cell. So a cell after a burst finds nothing
    copied in (whatever the pause before it), and the next one does."""
    after_burst, after_pause = [], []
    for _ in range(3):
        for _ in range(3):
            kernel.kc.execute("x = 1")  # queued: each is sent to the sandbox as the last one ends
        kernel.run("x = 1")
        after_burst.append(int(_spaced(kernel, COPIED_IN)))
        after_pause.append(int(_spaced(kernel, COPIED_IN)))
    assert 0 in after_burst, after_burst
    assert max(after_pause) > 0, after_pause


def test_a_standby_near_the_memory_cap_copies_nothing(tmp_path: Path) -> None:
    """Copies that met the sandbox's memory cap would have the kernel kill its
    largest process, maybe the holder and the state with it: within a quarter
    of the cap, nothing is copied in."""
    k = bwrap_kernel(tmp_path, f"--SandboxKernel.memory_limit={1 << 30}")
    try:
        _spaced(k, "import sys")
        assert max(int(_spaced(k, COPIED_IN)) for _ in range(3)) > 0  # far from the cap: copies
        _spaced(k, "held = bytearray(800 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1")
        assert [int(_spaced(k, COPIED_IN)) for _ in range(3)] == [0, 0, 0]
        _spaced(k, "del held")
        assert max(int(_spaced(k, COPIED_IN)) for _ in range(3)) > 0  # and again once freed
    finally:
        k.shutdown()


def test_a_huge_reservation_is_not_scanned(kernel: SandboxKernelHandle) -> None:
    """A runtime may reserve far more private writable memory than it uses;
    the old holder would read 8 bytes of pagemap per page of it. Past 4 GiB
    mapped it makes no list (and says so at once: the standby does not wait),
    and once the reservation is gone, lists come back."""
    _spaced(
        kernel,
        "import ctypes, mmap\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)\n"
        "libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)\n"
        "RESERVED = 5 << 30\n"
        "reserve = libc.mmap(None, RESERVED, 3, 0x4022, -1, 0)  # MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE\n"
        "assert reserve not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()",
    )
    assert [int(_spaced(kernel, COPIED_IN)) for _ in range(3)] == [0, 0, 0]
    _spaced(kernel, "libc.munmap(reserve, RESERVED)")
    assert max(int(_spaced(kernel, COPIED_IN)) for _ in range(3)) > 0


def test_the_holder_beside_threads_copies_in_what_the_last_cell_wrote(tmp_path: Path) -> None:
    """While threads of cells are alive, cells run in the holder, and the
    backup forked before each shares every page with it: after a pause the
    holder copies in what the last request wrote (the backup lists it),
    unchanged, as a standby does."""
    k = bwrap_kernel(tmp_path)
    try:
        _spaced(
            k,
            "import hashlib, os, sys, threading\n"
            "stop = threading.Event(); threading.Thread(target=stop.wait).start()\n"
            "buffer = bytearray(os.urandom(1 << 20))\ndigest = hashlib.sha256(buffer).hexdigest()\n"
            "pid = os.getpid()",
        )
        counts = []
        for round_ in range(4):
            out = _spaced(
                k,
                "same = hashlib.sha256(buffer).hexdigest() == digest\n"
                f"for i in range(0, len(buffer), 4096): buffer[i] ^= {round_ + 1}\n"
                "digest = hashlib.sha256(buffer).hexdigest()\n"
                "print(same, os.getpid() == pid, sys.modules['sandbox_kernel_worker.hot_pages'].copied_in)",
            )
            same, here, copied = out.split()
            assert (same, here) == ("True", "True"), out  # the holder itself ran it, and nothing changed
            counts.append(int(copied))
        # the holder's count only grows: each pause copied in the buffer's 256 pages and more
        assert min(b - a for a, b in itertools.pairwise(counts)) > 256, counts
        assert _spaced(k, "stop.set(); print(hashlib.sha256(buffer).hexdigest() == digest)").strip() == "True"
    finally:
        k.shutdown()


def test_a_list_clipped_to_the_holders_mappings_never_writes_a_shared_file(tmp_path: Path) -> None:
    """A thread of a cell may map a shared file where the listed private pages
    were, after the list was made: copying them in would write-fault the
    file's pages and move its modification time. The list is clipped to the
    process's private writable mappings first (hot_pages.prefault, in this
    process, on a real file; unclipped, the time moves)."""
    import ctypes
    import mmap
    import struct
    from array import array

    from sandbox_kernel.worker import hot_pages

    hot_pages.share()
    assert hot_pages._shared is not None, "no shared list memory on this machine"
    size = 16 * mmap.PAGESIZE
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"x" * size)
    fd = os.open(shared, os.O_RDWR)
    mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    request_r, request_w = os.pipe()
    try:
        holder = ctypes.c_char.from_buffer(mapped)
        address = ctypes.addressof(holder)
        del holder
        hot_pages._shared[hot_pages._HEADER.size : hot_pages._HEADER.size + 16] = array("Q", [address, size]).tobytes()
        moved = []
        for generation, clip in ((7, True), (8, False)):
            os.utime(shared, ns=(10**9, 10**9))
            struct.pack_into("<QQQ", hot_pages._shared, 0, 0, generation, 1)
            hot_pages.prefault(generation, request_r, clip=clip)
            os.fsync(fd)
            moved.append(os.stat(shared).st_mtime_ns != 10**9)
        assert moved == [False, True]
        assert shared.read_bytes() == b"x" * size
    finally:
        mapped.close()
        for end in (fd, request_r, request_w):
            os.close(end)
