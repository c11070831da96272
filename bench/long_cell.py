"""Long generated cells: the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/long_cell.py [--sizes 500,1000,2000,5000,10000,20000]

A cell of N lines ``v_i = i`` is run in each kernel; reported are the wall
time of the round trip and the CPU seconds the kernel's HOST process spent on
it (for the sandboxed kernel that is the host side only: replay log, history,
sanitising; the cell itself runs in the sandbox). Host work must grow linearly
with N. Nothing is asserted: the figures go into the issue notes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import psutil
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).parent))
from kernel_latency import round_trip


def measure(kernel_name: str, sizes: list[int], workdir: Path) -> dict[int, dict[str, float]]:
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    host = psutil.Process(km.provisioner.process.pid)  # type: ignore[union-attr]
    out: dict[int, dict[str, float]] = {}
    try:
        round_trip(kc, "1")
        for n in sizes:
            code = "\n".join(f"v_{i} = {i}" for i in range(n))
            cpu = sum(host.cpu_times()[:2])
            wall = round_trip(kc, code, timeout=3600)
            out[n] = {"wall_s": wall, "host_cpu_s": sum(host.cpu_times()[:2]) - cpu}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="500,1000,2000,5000,10000,20000")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long_cell.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: measure(name, sizes, Path(tmp)) for name in ("python3", "sandbox-python")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"python": sys.version.split()[0], "results": results}, indent=2))
    print(f"{'lines':>7} {'ipykernel':>10} {'sandbox':>10} {'ratio':>6} {'host CPU (sandbox)':>19}")
    for n in sizes:
        base, ours = results["python3"][n], results["sandbox-python"][n]
        print(
            f"{n:7d} {base['wall_s']:9.3f}s {ours['wall_s']:9.3f}s {ours['wall_s'] / base['wall_s']:5.2f}x {ours['host_cpu_s']:18.3f}s"
        )


if __name__ == "__main__":
    main()
