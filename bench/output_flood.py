"""Host CPU spent on one cell's output flood, in the kernel's HOST process.

    .venv/bin/python bench/output_flood.py

Two floods: a single 1 GB write to stdout, and 10,000 display_data of 100 KB
HTML. For each: wall time, CPU seconds of the kernel process (the host side:
the sandbox's own CPU is not counted), what reached the client, and whether
the namespace survived. Nothing is asserted: the figures go into the notes.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import psutil
from jupyter_client.manager import KernelManager

FLOODS = {
    "1 GB stream write": "import sys\nsys.stdout.write('x' * 1_000_000_000)",
    "10,000 x 100 KB HTML": "from IPython.display import display, HTML\nc = '<b>x</b>' * 12_500\nfor i in range(10_000):\n    display(HTML(c))",
}


def run(kc, code: str, timeout: float = 1800) -> tuple[dict, int]:
    msg_id = kc.execute(code)
    received = 0
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        received += len(json.dumps(msg["content"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], received


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        km = KernelManager(kernel_name="sandbox-python")
        km.start_kernel(cwd=tmp)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        host = psutil.Process(km.provisioner.process.pid)  # type: ignore[union-attr]
        try:
            run(kc, "kept = 'state'")
            for name, code in FLOODS.items():
                cpu0, t0 = sum(host.cpu_times()[:2]), time.perf_counter()
                reply, received = run(kc, code)
                wall, cpu = time.perf_counter() - t0, sum(host.cpu_times()[:2]) - cpu0
                check, _ = run(kc, "kept")
                results[name] = {
                    "wall_s": round(wall, 2),
                    "host_cpu_s": round(cpu, 2),
                    "status": reply["status"],
                    "bytes_to_client": received,
                    "state_kept": check["status"] == "ok",
                }
                print(
                    f"{name:24} wall {wall:7.2f} s  host CPU {cpu:6.2f} s  to client {received / 1e6:7.1f} MB  "
                    f"status {reply['status']}  state kept {check['status'] == 'ok'}"
                )
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    print(json.dumps({"python": sys.version.split()[0], "results": results}))


if __name__ == "__main__":
    main()
