"""The sandboxed kernel in the single-user image against the same kernel on the host, in one run.

    .venv/bin/python bench/container_kernel.py [--image sandbox-kernel-singleuser:latest] [--cells 40] [--load]

Build the image first (scripts/build-image.sh). The container gets the narrow
settings of docs/deploy/container.md: uid 1000, no capabilities, the shipped
seccomp profile, unmasked /proc, no network. This file is also the driver that
runs inside the container (bench/ mounted at /bench, so both sides time cells
with kernel_latency's round_trip). It reports:

- the first cell in a fresh container: from ``docker start`` until the first
  cell's reply, and the kernel's own start until that reply;
- the median round trip of a trivial cell, inside the container and on the host.

``--load`` repeats it with one busy process (started and killed by the bench).
Ratios are container / host. Nothing is asserted: the figures go into the issue notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kernel_latency import round_trip  # bench/ is the script's folder, first on sys.path


def measure(python: str, cells: int) -> dict[str, float]:
    """Start the sandboxed kernel with ``python`` and time it (runs on either side).

    The kernel is started from a kernelspec of this run's (jupyter_client ignores
    ``kernel_cmd`` and would start its default kernel), and a cell checks that it
    is sandboxed: a pid namespace of its own."""
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    specs = Path(tempfile.mkdtemp(prefix="bench-kernels-"))
    spec = specs / "kernels" / "sandbox-python-bench"
    spec.mkdir(parents=True)
    argv = [python, "-I", "-m", "sandbox_kernel", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(json.dumps({"argv": argv, "display_name": "bench", "language": "python"}))
    km = KernelManager(kernel_name="sandbox-python-bench")
    km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[str(specs / "kernels")])
    workdir = tempfile.mkdtemp(prefix="bench-ws-")
    started = time.time()
    km.start_kernel(cwd=workdir)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        first = round_trip(kc, "1 + 1")
        first_done = time.time()
        pid = []
        kc.execute_interactive(
            "import os; print(os.getpid())", timeout=60, output_hook=lambda m: pid.append(m["content"].get("text", ""))
        )
        if not any(text.strip().isdigit() and int(text) < 50 for text in pid):
            raise RuntimeError(f"the kernel is not sandboxed (a cell's pid: {pid}): check the kernelspec")
        times = [round_trip(kc, "x = 1") for _ in range(cells)]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return {
        "kernel_start_to_first_cell": first_done - started,
        "first_cell": first,
        "first_done_at": first_done,
        "trivial_median": statistics.median(times),
    }


def in_container(image: str, cells: int) -> dict[str, float]:
    from narrow_container import driver_result, narrow_container, run_to_end

    import docker
    from sandbox_kernel.sandbox.seccomp import container_profile

    api = docker.from_env().api
    with narrow_container(
        api,
        image,
        ["/opt/sandbox-kernel/bin/python", "/bench/container_kernel.py", "--inside", "--cells", str(cells)],
        binds=[f"{Path(__file__).resolve().parent}:/bench:ro"],
        security_opt=["no-new-privileges", "seccomp=" + json.dumps(container_profile())],
    ) as container_id:
        started = time.time()
        result: dict[str, float] = driver_result(*run_to_end(api, container_id, timeout=600))
    result["docker_start_to_first_cell"] = result["first_done_at"] - started
    return result


def compare(image: str, cells: int) -> None:
    host = measure(sys.executable, cells)
    container = in_container(image, cells)
    ms = 1000
    print(
        f"  first cell in a fresh container, from docker start: {container['docker_start_to_first_cell'] * ms:.0f} ms"
    )
    print(
        f"  kernel start to first cell reply: host {host['kernel_start_to_first_cell'] * ms:.0f} ms, "
        f"container {container['kernel_start_to_first_cell'] * ms:.0f} ms "
        f"({container['kernel_start_to_first_cell'] / host['kernel_start_to_first_cell']:.2f}x)"
    )
    print(
        f"  trivial cell, median of {cells}: host {host['trivial_median'] * ms:.2f} ms, "
        f"container {container['trivial_median'] * ms:.2f} ms "
        f"({container['trivial_median'] / host['trivial_median']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="sandbox-kernel-singleuser:latest")
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--load", action="store_true", help="also measure with one busy process on a core")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print("RESULT " + json.dumps(measure(sys.executable, args.cells)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "docker"))  # narrow_container
    print("quiet")
    compare(args.image, args.cells)
    if args.load:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            print("one busy process")
            compare(args.image, args.cells)
        finally:
            busy.kill()  # the one process this bench started
            busy.wait()


if __name__ == "__main__":
    main()
