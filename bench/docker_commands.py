"""Round trip of a shell command through the Docker SandboxManager.

    .venv/bin/python bench/docker_commands.py [--runs 20]

Ephemeral (a container created and removed per command; goal: median
<= 0.6 s) and persistent (one container reused; goal: median <= 60 ms), with
the bare `docker exec` floor of this daemon for comparison. Uses the offline
test image, so nothing is pulled. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
import uuid

import docker
from sandbox_kernel.docker import SandboxManager
from sandbox_kernel.docker.image import ensure_test_image, offline_config
from sandbox_kernel.privacy.modes import NetworkMode


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    client = docker.from_env()
    ensure_test_image(client)
    session = f"bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as root:
        manager = SandboxManager(
            config=offline_config(),
            workspace_root=root,
            client=client,
            network_mode_getter=lambda u, s: NetworkMode.NONE,
        )
        try:
            ephemeral = [timed(lambda: manager.execute_command("bench", session, "true")) for _ in range(args.runs)]
            manager.execute_command("bench", session, "true", persistent=True)
            persistent = [
                timed(lambda: manager.execute_command("bench", session, "true", persistent=True))
                for _ in range(args.runs)
            ]
            cid = manager.get_or_create_session("bench", session).container_id
            floor = [
                timed(lambda: subprocess.run(["docker", "exec", cid, "true"], check=True)) for _ in range(args.runs)
            ]
        finally:
            manager.close_all()
    print(f"ephemeral command median  {statistics.median(ephemeral) * 1000:7.1f} ms (goal <= 600 ms)")
    print(f"persistent command median {statistics.median(persistent) * 1000:7.1f} ms (goal <= 60 ms)")
    print(f"bare 'docker exec' median {statistics.median(floor) * 1000:7.1f} ms (this daemon's floor)")


if __name__ == "__main__":
    main()
