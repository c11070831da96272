"""Cell latency of the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/kernel_latency.py [--cells 40] [--load]

Reports, for each kernel: time to kernel_info reply and to the first cell's
reply after start; the median round trip of a trivial cell with nothing
imported, with pandas and matplotlib imported (and a DataFrame), the same
sent 30 ms after the last reply rather than back to back (``spaced``), and
with 500 MB of numpy arrays in the namespace; the PSS of the idle kernel's process
tree (from /proc/*/smaps_rollup: shared pages counted once, not per process).
``--load`` runs everything twice, quiet and with one busy process (started and
stopped by the bench, by its pid) on a core, side by side. Ratios are sandbox
/ ipykernel (lower is better). Nothing here is asserted: the figures go into
the issue notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
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


#: the pause before each spaced cell: a person typing, an agent thinking
SPACING = 0.03


def spaced_round_trip(kc, code: str) -> float:
    """A cell sent a little after the last one ended, not back to back: the
    kernel's processes have gone idle (and the sandbox's standby has done its
    warm-ups), as between cells a person or an agent sends."""
    time.sleep(SPACING)
    return round_trip(kc, code)


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
        time.sleep(1)  # settled: the sandbox's standby child is forked
        pss = tree_pss(km.provisioner.process.pid)  # type: ignore[union-attr]
        for _ in range(3):
            round_trip(kc, "x = 1")
        bare = statistics.median(round_trip(kc, "x = 1") for _ in range(cells))
        round_trip(kc, "import pandas as pd, numpy as np, matplotlib.pyplot as plt")
        round_trip(kc, "df = pd.DataFrame({'a': range(1000), 'b': range(1000)})")
        for _ in range(3):
            round_trip(kc, "x = 1")
        empty = statistics.median(round_trip(kc, "x = 1") for _ in range(cells))
        spaced = statistics.median(spaced_round_trip(kc, "x = 1") for _ in range(cells))
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
        "trivial_cell_bare_s": bare,
        "trivial_cell_s": empty,
        "trivial_cell_spaced_s": spaced,
        "trivial_cell_500mb_s": loaded,
        "idle_pss_mib": pss,
    }


def tree_pss(pid: int) -> float:
    """MiB of PSS of a process and its descendants (each shared page split among its users)."""
    total = 0
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_all(cells: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        return {name: measure(name, cells, Path(tmp)) for name in ("python3", "sandbox-python")}


def ratios_of(results: dict[str, dict[str, float]]) -> dict[str, float]:
    base, ours = results["python3"], results["sandbox-python"]
    return {
        "trivial_cell_bare_vs_ipykernel": ours["trivial_cell_bare_s"] / base["trivial_cell_bare_s"],
        "trivial_cell_vs_ipykernel": ours["trivial_cell_s"] / base["trivial_cell_s"],
        "trivial_cell_spaced_vs_ipykernel": ours["trivial_cell_spaced_s"] / base["trivial_cell_spaced_s"],
        "trivial_cell_500mb_vs_ipykernel": ours["trivial_cell_500mb_s"] / base["trivial_cell_500mb_s"],
        "500mb_vs_empty_namespace": ours["trivial_cell_500mb_s"] / ours["trivial_cell_s"],
        "first_cell_vs_ipykernel": ours["first_cell_s"] / base["first_cell_s"],
        "kernel_info_vs_ipykernel": ours["kernel_info_s"] / base["kernel_info_s"],
        "idle_pss_vs_ipykernel": ours["idle_pss_mib"] / base["idle_pss_mib"],
    }


def show(title: str, results: dict[str, dict[str, float]], ratios: dict[str, float]) -> None:
    base, ours = results["python3"], results["sandbox-python"]
    print(f"--- {title}")
    print(f"{'metric':32} {'ipykernel':>10} {'sandbox':>10}")
    for key in base:
        if key.endswith("_mib"):
            print(f"{key:32} {base[key]:8.1f}MiB {ours[key]:8.1f}MiB")
        else:
            print(f"{key:32} {base[key] * 1000:9.1f}ms {ours[key] * 1000:9.1f}ms")
    for key, value in ratios.items():
        print(f"{key:32} {value:10.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--load", action="store_true", help="also measure with one busy process on a core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kernel_latency.json")
    args = parser.parse_args()
    report: dict[str, object] = {"python": sys.version.split()[0], "cells": args.cells, "cpus": psutil.cpu_count()}
    quiet = run_all(args.cells)
    report["quiet"] = {"results": quiet, "ratios": ratios_of(quiet)}
    show("quiet", quiet, ratios_of(quiet))
    if args.load:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            loaded = run_all(args.cells)
        finally:
            busy.kill()  # the one process this bench started
            busy.wait()
        report["one_busy_process"] = {"results": loaded, "ratios": ratios_of(loaded)}
        show("one busy process", loaded, ratios_of(loaded))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
