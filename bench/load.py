"""Load: many sandboxed kernels at once, every output accounted for.

    .venv/bin/python bench/load.py [--kernels 20] [--cells 200]

Starts ``--kernels`` kernels (each in its own folder, default network mode)
and runs ``--cells`` cells in each, all kernels at once, through
jupyter_client's async clients. Each cell prints a marker naming its kernel
and cell and returns a value; every iopub message is matched to its request
by ``parent_header``. Reported: errors, lost outputs (a cell whose marker or
result did not arrive), misrouted outputs (a marker in another cell's or
kernel's messages), the latency distribution, and the kernels' start times.
Nothing is asserted: the figures go into the notes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager


async def drive(index: int, root: Path, cells: int, stats: dict[str, Any]) -> None:
    folder = root / f"k{index}"
    folder.mkdir()
    km = AsyncKernelManager(kernel_name="sandbox-python")
    started = time.perf_counter()
    await km.start_kernel(cwd=str(folder))
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=300)
        stats["start"].append(time.perf_counter() - started)
        for i in range(cells):
            marker = f"k{index}-c{i}"
            t = time.perf_counter()
            msg_id = kc.execute(f"print({marker!r})\n{i} * {i}")
            stdout, result, idle = "", None, False
            while not idle:
                msg = await kc.get_iopub_msg(timeout=120)
                parent = msg["parent_header"].get("msg_id")
                content = msg["content"]
                if parent != msg_id:
                    if msg["msg_type"] == "stream" and f"k{index}-" in content.get("text", ""):
                        stats["misrouted"] += 1
                    continue
                if msg["msg_type"] == "stream":
                    stdout += content["text"]
                elif msg["msg_type"] == "execute_result":
                    result = content["data"].get("text/plain")
                elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
                    idle = True
            reply = await kc.get_shell_msg(timeout=120)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = await kc.get_shell_msg(timeout=120)
            stats["latency"].append(time.perf_counter() - t)
            if reply["content"]["status"] != "ok":
                stats["errors"] += 1
            if stdout.strip() != marker or result != str(i * i):
                stats["lost"] += 1
                if stdout.strip() and stdout.strip() != marker:
                    stats["misrouted"] += 1
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=False)


async def main(kernels: int, cells: int) -> None:
    stats: dict[str, Any] = {"start": [], "latency": [], "errors": 0, "lost": 0, "misrouted": 0}
    with tempfile.TemporaryDirectory(prefix="sk-load-") as tmp:
        t = time.perf_counter()
        await asyncio.gather(*(drive(i, Path(tmp), cells, stats) for i in range(kernels)))
        wall = time.perf_counter() - t
    lat = sorted(stats["latency"])

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    print(f"{kernels} kernels x {cells} cells = {len(lat)} cells in {wall:.1f} s ({len(lat) / wall:.0f} cells/s)")
    print(f"errors {stats['errors']}, lost outputs {stats['lost']}, misrouted outputs {stats['misrouted']}")
    print(
        f"latency ms: median {statistics.median(lat) * 1000:.1f}, p90 {pct(0.9):.1f}, p99 {pct(0.99):.1f}, "
        f"max {lat[-1] * 1000:.1f}"
    )
    print(
        f"kernel start to ready (all at once): median {statistics.median(stats['start']):.1f} s, max {max(stats['start']):.1f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--cells", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.kernels, args.cells))
