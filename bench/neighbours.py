"""A trivial cell with 19 other kernels started beside it, against the same kernel alone.

    .venv/bin/python bench/neighbours.py [--neighbours 19] [--cells 60]

People keep many notebooks open: a kernel's idle work (the ratchet poll, the
standby child, timers) must not slow the one in use. For stock ipykernel and the
sandboxed kernel, in one run: the median round trip of ``x = 1`` in one kernel
alone, then again once ``--neighbours`` more kernels of the same kind are ready
and idle (each has run one cell, so each sandbox and its standby exist). Ratios
are with neighbours / alone. The busy case (every kernel running cells at once)
is bench/load.py. Nothing is asserted: the figures go into the notes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import KernelManager
from kernel_latency import round_trip  # bench/ is the script's folder, first on sys.path


def median_cell(kc: object, cells: int) -> float:
    for _ in range(3):
        round_trip(kc, "x = 1")
    return statistics.median(round_trip(kc, "x = 1") for _ in range(cells))


def measure(kernel_name: str, neighbours: int, cells: int, root: Path) -> tuple[float, float]:
    """(alone, with neighbours) medians in seconds for ``kernel_name``."""
    started: list[tuple[KernelManager, object]] = []
    try:
        for index in range(neighbours + 1):
            if index == 1:
                alone = median_cell(started[0][1], cells)
            folder = root / f"{kernel_name}-{index}"
            folder.mkdir()
            km = KernelManager(kernel_name=kernel_name)
            km.start_kernel(cwd=str(folder))
            kc = km.client()
            kc.start_channels()
            started.append((km, kc))
            kc.wait_for_ready(timeout=300)
            round_trip(kc, "1")  # the sandbox and its standby child exist
        if neighbours == 0:
            alone = median_cell(started[0][1], cells)
        time.sleep(2)  # settled
        crowded = median_cell(started[0][1], cells)
    finally:
        for km, kc in started:
            kc.stop_channels()  # type: ignore[attr-defined]
            km.shutdown_kernel(now=True)
    return alone, crowded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--neighbours", type=int, default=19)
    parser.add_argument("--cells", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("python3", "sandbox-python"):
            alone, crowded = measure(name, args.neighbours, args.cells, Path(tmp))
            print(
                f"{name:15} alone {alone * 1000:.2f} ms, with {args.neighbours} idle neighbours "
                f"{crowded * 1000:.2f} ms ({crowded / alone:.2f}x)"
            )


if __name__ == "__main__":
    main()
