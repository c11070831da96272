"""``%pip`` inside the sandbox: installs into the session's package layer, and
says clearly when it cannot download. Stdlib only (it runs in the sandbox).

The interpreter's site-packages are read-only in a sandbox, so ``%pip install``
installs into ``$SANDBOX_KERNEL_PACKAGES`` (a folder of the session's state,
kept when the sandbox is replaced) unless the command names its own target.
Before downloading, the index is probed through the egress proxy: a refused
host (the deny list, or a session that turned private) is reported with the
proxy's rule instead of pip's "no matching distribution".
"""

from __future__ import annotations

import importlib
import os
import shlex
import socket
import subprocess
import sys
from urllib.parse import urlsplit

PACKAGES_ENV = "SANDBOX_KERNEL_PACKAGES"
NOTICE = "[sandbox_kernel]"
_OWN_TARGET = ("--target", "-t", "--prefix", "--root", "--user")


def packages_dir() -> str | None:
    """The session's package layer, on the import path once it exists."""
    path = os.environ.get(PACKAGES_ENV)
    if path and path not in sys.path:
        sys.path.append(path)
    return path


def network_problem(args: list[str]) -> str | None:
    """Why pip could not download from its index now, if it could not."""
    if "--no-index" in args or not args or args[0] not in ("install", "download", "wheel", "index"):
        return None
    index = "https://pypi.org/simple/"
    for i, arg in enumerate(args):
        if arg in ("-i", "--index-url") and i + 1 < len(args):
            index = args[i + 1]
        elif arg.startswith("--index-url="):
            index = arg.split("=", 1)[1]
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("HTTP_PROXY")
    if not proxy:
        return (
            "this sandbox has no network (the session holds private data, or the kernel runs with "
            "network=none); install packages before private data enters, or from files in /workspace"
        )
    url, target = urlsplit(index), urlsplit(proxy)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    probe = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    try:
        with socket.create_connection((target.hostname or "127.0.0.1", target.port or 80), timeout=10) as sock:
            sock.sendall(probe)
            head = sock.recv(65536).decode("latin-1")
    except OSError as exc:
        return f"the egress proxy does not answer ({exc})"
    status = head.split(" ", 2)[1] if head.count(" ") >= 2 else ""
    if status == "200":
        return None
    for line in head.split("\r\n"):
        if line.lower().startswith("x-sandbox-egress-rule:"):
            return f"{host} is refused by the egress proxy: {line.split(':', 1)[1].strip()}"
    return f"{host} cannot be reached through the egress proxy (HTTP {status or '?'})"


def pip(line: str) -> int:
    """Run ``pip`` like IPython's ``%pip``, into the package layer; the exit code."""
    try:
        args = shlex.split(line)
    except ValueError as exc:
        print(f"{NOTICE} %pip: {exc}", file=sys.stderr)
        return 2
    problem = network_problem(args)
    if problem:
        print(f"{NOTICE} %pip cannot download: {problem}.", file=sys.stderr)
        return 1
    layer = packages_dir()
    if args[:1] == ["install"] and layer and not any(a.split("=")[0] in _OWN_TARGET for a in args):
        os.makedirs(layer, exist_ok=True)
        args[1:1] = ["--target", layer, "--upgrade"]
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    importlib.invalidate_caches()
    if result.returncode == 0 and args[:1] == ["install"]:
        print("Note: you may need to restart the kernel to use updated packages.")
    return result.returncode


__all__ = ["PACKAGES_ENV", "network_problem", "packages_dir", "pip"]
