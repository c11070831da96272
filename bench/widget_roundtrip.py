"""Widget round trip of the sandboxed kernel against stock ipykernel, in one run.

    .venv/bin/python bench/widget_roundtrip.py [--moves 60]

What a user feels when dragging a slider: the frontend sends the new value
(comm_msg ``update``), the kernel runs the slider's observer, and the
observer's print reaches iopub. Measured through jupyter_client, from the
send to the printed value (and to the kernel's idle). Also the same with
pandas and matplotlib imported and 200 MB of arrays in the namespace (the
sandbox forks per message: is that felt?), and moves sent after a pause
(clicks rather than a drag: 30 ms after the other kernel's turn, about 65 ms
after the kernel's own last move). Both kernels run side by side and take
turns, move by move. Ratios are sandbox / ipykernel.
Nothing is asserted: the figures go into the issue notes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from kernel_latency import compare_and_save, take_turns  # bench/ is the script's folder, first on sys.path

SETUP = (
    "import ipywidgets as w\n"
    "s = w.IntSlider(max=10**9)\n"
    "s.observe(lambda ch: print('v', ch['new']), 'value')\n"
    "print('id', s.comm.comm_id)"
)


def _drain(kc: Any) -> None:
    while True:
        try:
            kc.get_iopub_msg(timeout=0.01)
        except Exception:
            return


def run_cell(kc: Any, code: str) -> str:
    msg_id = kc.execute(code)
    text = ""
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return text


def move(kc: Any, comm_id: str, value: int) -> tuple[float, float]:
    """Seconds from sending a slider change to its observer's print, and to idle."""
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": {"value": value}}})
    started = time.perf_counter()
    kc.shell_channel.send(msg)
    printed = None
    text = ""
    while True:
        reply = kc.get_iopub_msg(timeout=60)
        if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if reply["msg_type"] == "stream" and printed is None:
            text += reply["content"]["text"]  # a kernel may send the line in pieces
            if f"v {value}\n" in text:
                printed = time.perf_counter() - started
        if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            if printed is None:
                raise RuntimeError("the observer's print never came")
            return printed, time.perf_counter() - started


def _turns(
    sliders: dict[str, tuple[Any, str]], moves: int, spaced: bool, start: int
) -> dict[str, list[tuple[float, float]]]:
    """Moves of each kernel's slider, the kernels taking turns (``take_turns``);
    every move sets a new value."""
    values = itertools.count(start + 1)

    def mover(kc: Any, comm_id: str) -> Callable[[], tuple[float, float]]:
        return lambda: move(kc, comm_id, next(values))

    return take_turns({name: mover(kc, comm_id) for name, (kc, comm_id) in sliders.items()}, moves, spaced)


def measure(kernel_names: tuple[str, ...], moves: int, workdir: Path) -> dict[str, dict[str, float]]:
    clients = {}
    sliders = {}
    try:
        for name in kernel_names:
            km = KernelManager(kernel_name=name)
            (workdir / name).mkdir()
            km.start_kernel(cwd=str(workdir / name))
            kc = km.client()
            kc.start_channels()
            clients[name] = (km, kc)
            kc.wait_for_ready(timeout=120)
            out = run_cell(kc, SETUP)
            sliders[name] = (kc, out.split("id ", 1)[1].split()[0])
            _drain(kc)
            for i in range(5):  # warm up
                move(kc, sliders[name][1], i + 1)
        light = _turns(sliders, moves, spaced=False, start=100)
        # a click now and then, not a drag: the kernel has gone idle
        spaced = _turns(sliders, moves, spaced=True, start=100_000)
        for kc, comm_id in sliders.values():
            run_cell(
                kc,
                "import pandas as pd, numpy as np, matplotlib.pyplot as plt\n"
                "arrays = [np.ones(12_500_000) for _ in range(2)]  # 200 MB",
            )
            _drain(kc)
            for i in range(3):
                move(kc, comm_id, 1000 + i)
        heavy = _turns(sliders, moves, spaced=False, start=200_000)
    finally:
        for km, kc in clients.values():
            kc.stop_channels()
            km.shutdown_kernel(now=False)
    return {
        name: {
            "to_print_s": statistics.median(p for p, _ in light[name]),
            "to_idle_s": statistics.median(i for _, i in light[name]),
            "to_print_p90_s": sorted(p for p, _ in light[name])[int(0.9 * len(light[name]))],
            "spaced_to_print_s": statistics.median(p for p, _ in spaced[name]),
            "loaded_to_print_s": statistics.median(p for p, _ in heavy[name]),
            "loaded_to_idle_s": statistics.median(i for _, i in heavy[name]),
        }
        for name in kernel_names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moves", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "widget_roundtrip.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        both = measure(("python3", "sandbox-python"), args.moves, Path(tmp))
    compare_and_save(both["python3"], both["sandbox-python"], args.out, moves=args.moves)


if __name__ == "__main__":
    main()
