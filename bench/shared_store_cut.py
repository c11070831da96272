"""Rise-to-cut across hosts with the ratchet shared through PostgreSQL.

    .venv/bin/python bench/shared_store_cut.py [--runs 5]

A PostgreSQL server from Debian's package is started in a temporary directory
(tests/pg_helpers.py). For each run a kernel on "host B" (its own data dir)
runs a cell that watches its sandbox's interfaces; a rise is then recorded
through a store with another local root ("host A"), and the time until host
B's sandbox has only ``lo`` is taken from inside the sandbox. Measured with
the kernel's poll at 0.25 s (the default) and at 60 s (so only LISTEN/NOTIFY
can explain a quick cut). Nothing is asserted: the figures go into the notes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pg_helpers import PostgresServer, shared_store_kernel

from sandbox_kernel.privacy import PrivateData
from sandbox_kernel.privacy.postgres import PostgresPrivacyStore

WATCH = "import socket, time\nwhile len(socket.if_nameindex()) > 1: time.sleep(0.005)\nprint(time.monotonic())"


def one_cut(root: Path, url: str, session: str, poll: str) -> float:
    kernel = shared_store_kernel(root, url, session, f"--SandboxKernel.privacy_poll_interval={poll}", user_id="bench")
    try:
        kernel.run("x = 1")
        other_host = PostgresPrivacyStore(root / "host-a", url)
        watch = kernel.kc.execute(WATCH)
        time.sleep(0.5)
        raised_at = time.monotonic()
        PrivateData("bench", session, other_host).add_private_dataset("rows", "SECRET")
        out = ""
        while "\n" not in out:
            msg = kernel.kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == watch and msg["msg_type"] == "stream":
                out += msg["content"]["text"]
        return float(out.strip()) - raised_at
    finally:
        kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    server = PostgresServer()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for poll in ("0.25", "60"):
                times = [
                    one_cut(Path(tmp) / f"{poll}-{i}", server.url, f"cut-{poll.replace('.', '_')}-{i}", poll)
                    for i in range(args.runs)
                ]
                shown = ", ".join(f"{t * 1000:.0f}" for t in times)
                print(
                    f"poll {poll:>4} s: rise on host A -> only lo on host B: {shown} ms; median "
                    f"{statistics.median(times) * 1000:.0f} ms"
                )
    finally:
        server.remove()


if __name__ == "__main__":
    main()
