"""Cell latency of the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/kernel_latency.py [--cells 40]

Reports, for each kernel: time to kernel_info reply and to the first cell's
reply after start; the median round trip of a trivial cell with pandas and
matplotlib imported; the same with 500 MB of numpy arrays in the namespace.
Ratios are sandbox / ipykernel (lower is better). Nothing here is asserted:
the figures go into the issue notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import KernelManager


def round_trip(kc, code: str, timeout: float = 120) -> float:
    started = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content']}")
    # drain iopub so queues do not grow
    while True:
        try:
            kc.get_iopub_msg(timeout=0.01)
        except Exception:
            break
    return elapsed


def measure(kernel_name: str, cells: int, workdir: Path) -> dict[str, float]:
    km = KernelManager(kernel_name=kernel_name)
    started = time.perf_counter()
    km.start_kernel(cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    info_at = time.perf_counter() - started
    round_trip(kc, "1")
    first_cell_at = time.perf_counter() - started
    try:
        round_trip(kc, "import pandas as pd, numpy as np, matplotlib.pyplot as plt")
        for _ in range(3):
            round_trip(kc, "x = 1")
        empty = statistics.median(round_trip(kc, "x = 1") for _ in range(cells))
        round_trip(
            kc,
            "arrays = [np.ones(25_000_000, dtype=np.float64) for _ in range(2)]  # ~400 MB\nextra = np.ones(12_500_000)  # ~100 MB",
        )
        for _ in range(3):
            round_trip(kc, "x = 1")
        loaded = statistics.median(round_trip(kc, "x = 1") for _ in range(cells))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return {
        "kernel_info_s": info_at,
        "first_cell_s": first_cell_at,
        "trivial_cell_s": empty,
        "trivial_cell_500mb_s": loaded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kernel_latency.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: measure(name, args.cells, Path(tmp)) for name in ("python3", "sandbox-python")}
    base, ours = results["python3"], results["sandbox-python"]
    ratios = {
        "trivial_cell_vs_ipykernel": ours["trivial_cell_s"] / base["trivial_cell_s"],
        "trivial_cell_500mb_vs_ipykernel": ours["trivial_cell_500mb_s"] / base["trivial_cell_500mb_s"],
        "500mb_vs_empty_namespace": ours["trivial_cell_500mb_s"] / ours["trivial_cell_s"],
        "first_cell_vs_ipykernel": ours["first_cell_s"] / base["first_cell_s"],
        "kernel_info_vs_ipykernel": ours["kernel_info_s"] / base["kernel_info_s"],
    }
    report = {"python": sys.version.split()[0], "cells": args.cells, "results": results, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"{'metric':32} {'ipykernel':>10} {'sandbox':>10}")
    for key in base:
        print(f"{key:32} {base[key] * 1000:9.1f}ms {ours[key] * 1000:9.1f}ms")
    for key, value in ratios.items():
        print(f"{key:32} {value:10.2f}x")


if __name__ == "__main__":
    main()
