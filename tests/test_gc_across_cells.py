"""Cycles that earlier cells dropped are freed, as in ipykernel (real bwrap).

Every fork freezes the heap (worker/main.py ``_fork_child``) so that a cell's
process never walks, and copies, what it inherited; but then nothing ever
collected those objects: 200 MB of self-referencing objects stayed after
``del`` and ``gc.collect()``, in every later process. Weak references tell
whether the objects are gone (the allocator may keep freed memory)."""

from __future__ import annotations

from kernel_helpers import SandboxKernelHandle

MAKE = (
    "import gc, weakref\n"
    "class Node:\n"
    "    def __init__(self):\n"
    "        self.me = self\n"
    "        self.data = bytearray(1 << 20)\n"
    "nodes = [Node() for _ in range(50)]\n"
    "refs = [weakref.ref(node) for node in nodes]\n"
)
ALIVE = "print(sum(ref() is not None for ref in refs))"


def test_gc_collect_frees_cycles_of_earlier_cells(kernel: SandboxKernelHandle) -> None:
    kernel.run(MAKE)
    assert kernel.stdout_of("del nodes\n" + ALIVE).strip() == "50"  # no collection yet, as in ipykernel
    assert kernel.stdout_of("print(gc.collect() >= 50)\n" + ALIVE).split() == ["True", "0"]


def test_cycles_of_earlier_cells_are_collected_without_asking(kernel: SandboxKernelHandle) -> None:
    """CPython collects the oldest generation once it grew by a quarter: here
    the holder does, before it forks, counting the objects cells left."""
    kernel.run(MAKE)
    kernel.run("del nodes")
    kernel.run("junk = [[] for _ in range(2 * gc.get_freeze_count() + 10000)]")
    assert kernel.stdout_of(ALIVE).strip() == "0"
    assert kernel.stdout_of("print(len(junk) > 10000)").strip() == "True"  # nothing alive was touched
