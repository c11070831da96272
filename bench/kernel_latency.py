"""Cell latency of the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/kernel_latency.py [--cells 40] [--load]

Reports, for each kernel: time to kernel_info reply and to the first cell's
reply after start; the median round trip of a trivial cell with nothing
imported, with pandas and matplotlib imported (and a DataFrame), the same
sent after a pause rather than back to back (``spaced``: 30 ms after the other
kernel's turn, about 65 ms after the kernel's own last cell), and
with 500 MB of numpy arrays in the namespace; the PSS of the idle kernel's process
tree (from /proc/*/smaps_rollup: shared pages counted once, not per process);
and the CPU time each kernel's process tree spends per trivial cell (``_cpu``,
each kernel alone, over CPU_CELLS cells: a kernel that needs more CPU than
is free on a busy machine waits for it, so this is what its loaded figures
follow).
Both kernels run side by side and take turns cell by cell (``interleaved``);
back to back means the next cell is sent as soon as the last one's idle status
came, as nbclient does.
``--load`` runs everything twice, quiet and with one busy process (started and
stopped by the bench, by its pid) on a core, side by side. Ratios are sandbox
/ ipykernel (lower is better). Nothing here is asserted: the figures go into
the issue notes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
from jupyter_client.manager import KernelManager

from sandbox_kernel.privacy.store_registry import all_store_roots


def round_trip(kc, code: str, timeout: float = 120) -> float:
    """Seconds from sending ``code`` to its execute_reply. Returns once the
    cell's idle status has come too, as nbclient does before the next cell:
    the next cell is then sent back to back, with no pause."""
    started = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content']}")
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return elapsed


#: the pause before each spaced cell: a person typing, an agent thinking
SPACING = 0.03

T = TypeVar("T")

#: cells (or moves) each kernel runs back to back before the other kernel's turn
BURST = 10


def take_turns(actions: dict[str, Callable[[], T]], rounds: int, spaced: bool) -> dict[str, list[T]]:
    """Each kernel's action (a cell, a slider move), the kernels taking turns:
    a burst of BURST back to back each, or one each after SPACING, so that
    both meet the same moments of this machine (on a VM, a minute's drift moved
    stock ipykernel's own figure by 40%). The first action of a burst follows
    the other kernel's turn, not its own last action, and is left out."""
    results: dict[str, list[T]] = {name: [] for name in actions}
    for _ in range(rounds if spaced else max(1, rounds // BURST)):
        for name, act in actions.items():
            if spaced:
                time.sleep(SPACING)
                results[name].append(act())
            else:
                burst = [act() for _ in range(BURST + 1)]
                results[name].extend(burst[1:])
    return results


def interleaved(clients: dict[str, Any], code: str, cells: int, spaced: bool) -> dict[str, float]:
    """Median round trip of ``code`` in each kernel, the kernels taking turns."""
    actions = {name: functools.partial(round_trip, kc, code) for name, kc in clients.items()}
    return {name: statistics.median(times) for name, times in take_turns(actions, cells, spaced).items()}


#: cells behind each CPU figure: /proc gives CPU times in 10 ms ticks
CPU_CELLS = 300

#: the pause before each spaced cell when one kernel runs alone: as far apart
#: as a kernel's own cells are when the two take turns
CPU_SPACING = 0.065


def cpu_per_cell(kc: Any, pid: int, code: str, spaced: bool) -> float:
    """CPU seconds the kernel's process tree spends per cell of ``code``,
    run alone CPU_CELLS times (back to back, or a third as many spaced), with
    the work it does while idle between spaced cells."""
    cells = CPU_CELLS // 3 if spaced else CPU_CELLS
    before = tree_cpu(pid)
    for _ in range(cells):
        if spaced:
            time.sleep(CPU_SPACING)
        round_trip(kc, code)
    time.sleep(0.5)  # the last old holder has gone and was reaped
    return (tree_cpu(pid) - before) / cells


def start(kernel_name: str, workdir: Path) -> tuple[Any, Any, dict[str, float]]:
    """Start a kernel; time its kernel_info reply and first cell, and the PSS
    of its process tree once idle."""
    workdir.mkdir()
    km = KernelManager(kernel_name=kernel_name)
    started = time.perf_counter()
    km.start_kernel(cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    info_at = time.perf_counter() - started
    round_trip(kc, "1")
    first_cell_at = time.perf_counter() - started
    time.sleep(1)  # settled: the sandbox's standby child is forked
    pss = tree_pss(km.provisioner.process.pid)  # type: ignore[union-attr]
    return km, kc, {"kernel_info_s": info_at, "first_cell_s": first_cell_at, "idle_pss_mib": pss}


def measure(kernel_names: tuple[str, ...], cells: int, workdir: Path) -> dict[str, dict[str, float]]:
    kernels: dict[str, tuple[Any, Any, dict[str, float]]] = {}
    clients: dict[str, Any] = {}
    results: dict[str, dict[str, float]] = {}

    def each(code: str) -> None:
        for kc in clients.values():
            round_trip(kc, code)

    def record(key: str, medians: dict[str, float]) -> None:
        for name, value in medians.items():
            results[name][key] = value

    def record_cpu(key: str, code: str, spaced: bool) -> None:
        for name, kc in clients.items():
            results[name][key] = cpu_per_cell(kc, pids[name], code, spaced)

    try:
        for name in kernel_names:
            kernels[name] = start(name, workdir / name)
            clients[name] = kernels[name][1]
            results[name] = dict(kernels[name][2])
        pids = {name: kernels[name][0].provisioner.process.pid for name in kernel_names}
        for _ in range(3):
            each("x = 1")
        record("trivial_cell_bare_s", interleaved(clients, "x = 1", cells, spaced=False))
        record_cpu("trivial_cell_bare_cpu_s", "x = 1", spaced=False)
        each("import pandas as pd, numpy as np, matplotlib.pyplot as plt")
        each("df = pd.DataFrame({'a': range(1000), 'b': range(1000)})")
        for _ in range(3):
            each("x = 1")
        record("trivial_cell_s", interleaved(clients, "x = 1", cells, spaced=False))
        record("trivial_cell_spaced_s", interleaved(clients, "x = 1", cells, spaced=True))
        record_cpu("trivial_cell_cpu_s", "x = 1", spaced=False)
        record_cpu("trivial_cell_spaced_cpu_s", "x = 1", spaced=True)
        # a thread of an earlier cell alive: the sandbox runs cells in the
        # holder, beside it, and the fork is the backup (worker/main.py)
        each("import threading; stop = threading.Event(); threading.Thread(target=stop.wait).start()")
        for _ in range(3):
            each("x = 1")
        record("trivial_cell_thread_alive_s", interleaved(clients, "x = 1", cells, spaced=False))
        record("trivial_cell_thread_alive_spaced_s", interleaved(clients, "x = 1", cells, spaced=True))
        each("stop.set()")
        each(
            "arrays = [np.ones(25_000_000, dtype=np.float64) for _ in range(2)]  # ~400 MB\n"
            "extra = np.ones(12_500_000)  # ~100 MB"
        )
        for _ in range(3):
            each("x = 1")
        record("trivial_cell_500mb_s", interleaved(clients, "x = 1", cells, spaced=False))
    finally:
        for km, kc, _ in kernels.values():
            kc.stop_channels()
            km.shutdown_kernel(now=False)
    return results


def _tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu(pid: int) -> float:
    """CPU seconds (user and system) a process and its descendants have used,
    with those of descendants already reaped: the sandbox's per-cell
    processes, its old holders' exits and its standbys' warm-ups all count."""
    total = 0.0
    for proc in _tree(pid):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # it exited meanwhile: counted in its parent's children_* once reaped
        total += times.user + times.system + times.children_user + times.children_system
    return total


def tree_pss(pid: int) -> float:
    """MiB of PSS of a process and its descendants (each shared page split among its users)."""
    total = 0
    for proc in _tree(pid):
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
        return measure(("python3", "sandbox-python"), cells, Path(tmp))


def ratios_of(results: dict[str, dict[str, float]]) -> dict[str, float]:
    base, ours = results["python3"], results["sandbox-python"]
    return {
        "trivial_cell_bare_vs_ipykernel": ours["trivial_cell_bare_s"] / base["trivial_cell_bare_s"],
        "trivial_cell_vs_ipykernel": ours["trivial_cell_s"] / base["trivial_cell_s"],
        "trivial_cell_spaced_vs_ipykernel": ours["trivial_cell_spaced_s"] / base["trivial_cell_spaced_s"],
        "trivial_cell_thread_alive_vs_ipykernel": ours["trivial_cell_thread_alive_s"]
        / base["trivial_cell_thread_alive_s"],
        "trivial_cell_thread_alive_spaced_vs_ipykernel": ours["trivial_cell_thread_alive_spaced_s"]
        / base["trivial_cell_thread_alive_spaced_s"],
        "trivial_cell_500mb_vs_ipykernel": ours["trivial_cell_500mb_s"] / base["trivial_cell_500mb_s"],
        "500mb_vs_empty_namespace": ours["trivial_cell_500mb_s"] / ours["trivial_cell_s"],
        "cpu_per_cell_bare_vs_ipykernel": ours["trivial_cell_bare_cpu_s"] / base["trivial_cell_bare_cpu_s"],
        "cpu_per_cell_vs_ipykernel": ours["trivial_cell_cpu_s"] / base["trivial_cell_cpu_s"],
        "cpu_per_cell_spaced_vs_ipykernel": ours["trivial_cell_spaced_cpu_s"] / base["trivial_cell_spaced_cpu_s"],
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


@contextlib.contextmanager
def one_busy_process() -> Iterator[None]:
    """A process spinning on a core for the block: the load of issue 16."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()  # the one process this bench started
        busy.wait()


def compare_and_save(stock: dict[str, float], sandbox: dict[str, float], out: Path, **meta: Any) -> dict[str, Any]:
    """Print times (seconds) of both kernels side by side with their ratios
    (sandbox / ipykernel), and write them, with ``meta``, to ``out``."""
    result = {
        **meta,
        "ipykernel": stock,
        "sandbox": sandbox,
        "ratio": {k: round(sandbox[k] / stock[k], 2) for k in stock},
    }
    width = max(map(len, stock)) + 2
    print(f"{'':{width}}{'ipykernel':>12}{'sandbox':>12}{'ratio':>8}")
    for key in stock:
        print(f"{key:{width}}{stock[key] * 1000:10.2f}ms{sandbox[key] * 1000:10.2f}ms{result['ratio'][key]:8.2f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--load", action="store_true", help="also measure with one busy process on a core")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kernel_latency.json")
    args = parser.parse_args()
    report: dict[str, object] = {
        "python": sys.version.split()[0],
        "cells": args.cells,
        "cpus": psutil.cpu_count(),
        # the machine's state: what else ran, and how many privacy stores a
        # read of a folder's level looks at (each costs about ten lstat calls)
        "load_average_before": os.getloadavg(),
        "privacy_stores": len(all_store_roots()[0]),
    }
    print(f"load average {report['load_average_before']}, {report['privacy_stores']} privacy stores on this machine")
    quiet = run_all(args.cells)
    report["quiet"] = {"results": quiet, "ratios": ratios_of(quiet)}
    show("quiet", quiet, ratios_of(quiet))
    if args.load:
        with one_busy_process():
            loaded = run_all(args.cells)
        report["one_busy_process"] = {"results": loaded, "ratios": ratios_of(loaded)}
        show("one busy process", loaded, ratios_of(loaded))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
