"""A user-mode network for a sandbox (pasta), without access to the host.

pasta gives the sandbox's network namespace a tap interface whose traffic it
re-emits from the host's sockets, so the sandbox reaches the internet while
the host's loopback services stay out of reach (``--no-map-gw``: the gateway
address is not mapped to the host; no port forwarding either way). Abstract
unix sockets are per network namespace, so the host's are unreachable too.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import time

_PR_SET_PDEATHSIG = 1


async def start_user_network(pid: int, timeout: float = 20.0) -> asyncio.subprocess.Process:
    """Attach pasta to the network namespace of ``pid``; return pasta's process
    once the namespace has a default route (the caller kills and awaits it, so
    its pipe transport is closed while the event loop still runs).

    pasta runs in the foreground as our child with PR_SET_PDEATHSIG, so it
    dies with the kernel even when the kernel is SIGKILLed (a daemonised pasta
    outlives its namespace); the caller kills it with the sandbox.
    """
    pasta = shutil.which("pasta")
    if pasta is None:
        raise FileNotFoundError("pasta is not installed (Debian/Ubuntu package 'passt')")
    argv = [
        pasta,
        "--foreground",
        "--quiet",
        "--config-net",
        "--no-map-gw",
        "-t",
        "none",
        "-u",
        "none",
        "-T",
        "none",
        "-U",
        "none",
    ]
    if os.geteuid() == 0:
        # As root, enter only the network namespace: joining bwrap's user
        # namespace too races its set-up ("Couldn't switch to pasta
        # namespaces"). pasta would otherwise drop to nobody, who cannot.
        # The namespace is opened here, with all of root's capabilities, and
        # handed over as a descriptor: the sandbox runs as an unprivileged uid
        # and pasta, which sheds capabilities early, could not open it by pid.
        netns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        argv += ["--runas", "0", "--netns-only", "--netns", f"/proc/self/fd/{netns_fd}"]
        pass_fds: tuple[int, ...] = (netns_fd,)
    else:
        argv.append(str(pid))
        pass_fds = ()
    try:
        return await _run_pasta(argv, pid, timeout, pass_fds)
    finally:
        for fd in pass_fds:
            os.close(fd)


async def _run_pasta(
    argv: list[str], pid: int, timeout: float, pass_fds: tuple[int, ...]
) -> asyncio.subprocess.Process:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=_die_with_parent,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        try:
            while time.monotonic() < deadline and proc.returncode is None:
                if _has_default_route(pid):
                    return proc
                try:
                    await asyncio.wait_for(proc.wait(), 0.005)
                except asyncio.TimeoutError:
                    pass
        except BaseException:  # cancelled: nobody else knows of this pasta
            if proc.returncode is None:
                proc.kill()
            raise
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
            break
        err = (await proc.stderr.read()).decode(errors="replace").strip().splitlines() if proc.stderr else []
        last = err[-1] if err else f"exit code {proc.returncode}"
        await asyncio.sleep(0.02)
    raise RuntimeError(f"pasta did not configure the sandbox's network: {last or 'timed out'}")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _has_default_route(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/net/route") as fh:
            next(fh)
            return any(line.split()[1] == "00000000" for line in fh if line.strip())
    except (OSError, StopIteration, IndexError):
        return False
