"""Trivial-cell latency on the docker backend against bwrap and stock ipykernel, in one run.

    .venv/bin/python bench/docker_latency.py [--cells 40] [--image IMAGE]

Needs a Docker daemon. Without ``--image`` the offline test image is built if
missing (``sandbox_kernel.docker.image.ensure_test_image``; nothing is pulled)
and the host's /usr is mounted read-only into it. Reports, per kernel: time to
kernel_info reply, time to the first cell's reply after start (for docker this
includes creating and starting the container), and the median round trip of a
trivial cell (``x = 1``). Ratios are against stock ipykernel and against bwrap.
Nothing is asserted: the figures go into the issue notes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import KernelManager
from kernel_latency import round_trip


def measure(kernel_name: str, args: list[str], cells: int, workdir: Path) -> dict[str, float]:
    km = KernelManager(kernel_name=kernel_name)
    started = time.perf_counter()
    km.start_kernel(cwd=str(workdir), extra_arguments=args)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        info_at = time.perf_counter() - started
        round_trip(kc, "1")
        first_cell_at = time.perf_counter() - started
        for _ in range(5):
            round_trip(kc, "x = 1")
        samples = [round_trip(kc, "x = 1") for _ in range(cells)]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return {
        "kernel_info_s": info_at,
        "first_cell_s": first_cell_at,
        "trivial_cell_s": statistics.median(samples),
        "trivial_cell_p90_s": sorted(samples)[int(0.9 * (len(samples) - 1))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument(
        "--image", default="", help="docker image (default: the offline test image with the host's /usr)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "docker_latency.json")
    args = parser.parse_args()

    if args.image:
        docker_args = ["--SandboxKernel.backend=docker", f"--DockerSandbox.image={args.image}"]
    else:
        import docker
        from sandbox_kernel.docker.image import ensure_test_image

        client = docker.from_env()
        image = ensure_test_image(client)
        client.close()
        docker_args = [
            "--SandboxKernel.backend=docker",
            f"--DockerSandbox.image={image}",
            '--DockerSandbox.read_only_mounts={"/usr": "/usr"}',
        ]
    kernels: dict[str, tuple[str, list[str]]] = {"ipykernel": ("python3", [])}
    if shutil.which("bwrap"):
        kernels["bwrap"] = ("sandbox-python", ["--SandboxKernel.backend=bwrap"])
    kernels["docker"] = ("sandbox-python", docker_args)

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (kernel_name, extra) in kernels.items():
            workdir = Path(tmp) / label
            workdir.mkdir()
            results[label] = measure(kernel_name, extra, args.cells, workdir)

    base = results["ipykernel"]
    ratios: dict[str, float] = {}
    for label in ("bwrap", "docker"):
        if label in results:
            ratios[f"{label}_trivial_cell_vs_ipykernel"] = results[label]["trivial_cell_s"] / base["trivial_cell_s"]
            ratios[f"{label}_first_cell_vs_ipykernel"] = results[label]["first_cell_s"] / base["first_cell_s"]
    if "bwrap" in results:
        ratios["docker_trivial_cell_vs_bwrap"] = (
            results["docker"]["trivial_cell_s"] / results["bwrap"]["trivial_cell_s"]
        )
        ratios["docker_first_cell_vs_bwrap"] = results["docker"]["first_cell_s"] / results["bwrap"]["first_cell_s"]
    report = {"python": sys.version.split()[0], "cells": args.cells, "results": results, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))

    labels = list(results)
    print(f"{'metric':22}" + "".join(f"{label:>12}" for label in labels))
    for key in base:
        print(f"{key:22}" + "".join(f"{results[label][key] * 1000:10.1f}ms" for label in labels))
    for key, value in ratios.items():
        print(f"{key:34} {value:8.2f}x")


if __name__ == "__main__":
    main()
