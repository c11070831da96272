"""A user-mode network for a sandbox (pasta), without access to the host.

pasta gives the sandbox's network namespace a tap interface whose traffic it
re-emits from the host's sockets, so the sandbox reaches the internet while
the host's loopback services stay out of reach (``--no-map-gw``: the gateway
address is not mapped to the host; no port forwarding either way). Abstract
unix sockets are per network namespace, so the host's are unreachable too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time

async def start_user_network(pid: int, timeout: float = 20.0) -> int:
    """Attach pasta to the network namespace of ``pid``; return pasta's pid
    once the namespace has a default route. pasta daemonises only after the
    interface is configured; the caller kills it (by pid) with the sandbox."""
    pasta = shutil.which("pasta")
    if pasta is None:
        raise FileNotFoundError("pasta is not installed (Debian/Ubuntu package 'passt')")
    return await asyncio.to_thread(_attach, pasta, pid, timeout)


def _attach(pasta: str, pid: int, timeout: float) -> int:
    with tempfile.TemporaryDirectory(prefix="sandbox-kernel-pasta-") as tmp:
        pidfile = os.path.join(tmp, "pasta.pid")
        argv = [pasta, "--quiet", "--config-net", "--no-map-gw", "-t", "none", "-u", "none",
                "-T", "none", "-U", "none", "--pid", pidfile]
        if os.geteuid() == 0:
            # As root, enter only the network namespace: joining bwrap's user
            # namespace too races its set-up ("Couldn't switch to pasta
            # namespaces"). pasta would otherwise drop to nobody, who cannot.
            argv += ["--runas", "0", "--netns-only", "--netns", f"/proc/{pid}/ns/net"]
        else:
            argv.append(str(pid))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, timeout=timeout)
            if done.returncode == 0:
                with open(pidfile) as fh:
                    helper = int(fh.read().strip())
                while time.monotonic() < deadline:
                    if _has_default_route(pid):
                        return helper
                    time.sleep(0.002)
                os.kill(helper, signal.SIGKILL)
                raise RuntimeError("pasta started but the sandbox got no default route")
            last = done.stderr.strip().splitlines()[-1:] or [""]
            last = last[0]
            time.sleep(0.01)
        raise RuntimeError(f"pasta did not configure the sandbox's network: {last}")


def _has_default_route(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/net/route") as fh:
            next(fh)
            return any(line.split()[1] == "00000000" for line in fh if line.strip())
    except (OSError, StopIteration, IndexError):
        return False
