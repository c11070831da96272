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
import re
import shlex
import socket
import sys
from importlib import metadata
from urllib.parse import urlsplit

PACKAGES_ENV = "SANDBOX_KERNEL_PACKAGES"
NOTICE = "[sandbox_kernel]"
RESTART_NOTE = "Note: you may need to restart the kernel to use updated packages."
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
    if url.scheme == "https":  # pip opens a tunnel
        probe = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    else:  # pip sends each request through the proxy, which the origin answers
        probe = f"HEAD {index} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
    try:
        with socket.create_connection((target.hostname or "127.0.0.1", target.port or 80), timeout=10) as sock:
            sock.sendall(probe)
            head = sock.recv(65536).decode("latin-1")
    except OSError as exc:
        return f"the egress proxy does not answer ({exc})"
    status = head.split(" ", 2)[1] if head.count(" ") >= 2 else ""
    for line in head.split("\r\n"):
        if line.lower().startswith("x-sandbox-egress-rule:"):  # (only the proxy's own answers say one)
            return f"{host} is refused by the egress proxy: {line.split(':', 1)[1].strip()}"
    if status == "200" or (status and url.scheme != "https"):
        return None
    return f"{host} cannot be reached through the egress proxy (HTTP {status or '?'})"


def _uninstall(args: list[str], layer: str) -> int:
    """``pip uninstall`` for the layer (pip refuses to touch a --target folder):
    remove every file a distribution's RECORD lists, then its empty folders."""
    names = [a for a in args if not a.startswith("-")]
    if not names:
        print("ERROR: You must give at least one requirement to uninstall", file=sys.stderr)
        return 1
    code = 0
    root = os.path.realpath(layer)
    for name in names:
        wanted = _normalise(name)
        dist = next((d for d in metadata.distributions(path=[layer]) if _normalise(d.metadata["Name"]) == wanted), None)
        if dist is None:
            print(f"WARNING: Skipping {name} as it is not installed in the package layer.", file=sys.stderr)
            code = 1
            continue
        label = f"{dist.metadata['Name']}-{dist.version}"  # read before its METADATA goes
        folders = set()
        for file in dist.files or []:
            path = os.path.realpath(os.path.join(layer, str(file)))
            if not path.startswith(root + os.sep):
                continue  # a RECORD naming files outside the layer is not followed
            folders.add(os.path.dirname(path))
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        for folder in sorted(folders, key=len, reverse=True):
            while folder.startswith(root + os.sep):
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)
        print(f"Successfully uninstalled {label}")
    importlib.invalidate_caches()
    return code


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _all_local(args: list[str]) -> bool:
    """Whether every requirement is a local file or folder (nothing to download)."""
    if args[:1] != ["install"]:
        return args[:1] in (["list"], ["uninstall"], ["show"], ["freeze"], ["check"])
    reqs = [a for a in args[1:] if not a.startswith("-")]
    return bool(reqs) and all(a.startswith(("/", "./", "../")) or a.endswith((".whl", ".tar.gz", ".zip")) for a in reqs)


def pip(line: str) -> int:
    """Run ``pip`` as IPython's ``%pip`` does (through the shell, so its output
    streams while it runs and pipes work), into the package layer; the exit code."""
    from IPython.core.interactiveshell import InteractiveShell

    try:
        args = shlex.split(line)
    except ValueError as exc:
        print(f"{NOTICE} %pip: {exc}", file=sys.stderr)
        return 2
    problem = None if _all_local(args) else network_problem(args)
    if problem:
        print(f"{NOTICE} %pip cannot download: {problem}.", file=sys.stderr)
        return 1
    layer = packages_dir()
    if args[:1] == ["uninstall"] and layer:
        code = _uninstall(args[1:], layer)
        print(RESTART_NOTE)
        return code
    if args[:1] == ["install"] and layer and not any(a.split("=")[0] in _OWN_TARGET for a in args):
        os.makedirs(layer, exist_ok=True)
        # the line's own words stay as the user wrote them (quotes, pipes)
        words = line.lstrip()
        target = f"install --target {shlex.quote(layer)} --upgrade"
        line = (
            f"{target}{words[len('install') :]}" if words.startswith("install") else f"{target} {shlex.join(args[1:])}"
        )
    command = f"{shlex.quote(sys.executable)} -m pip {line}"
    if layer:  # pip sees (lists, uninstalls, upgrades) what the layer holds
        path = os.pathsep.join(p for p in (layer, os.environ.get("PYTHONPATH", "")) if p)
        command = f"PYTHONPATH={shlex.quote(path)} {command}"
    shell = InteractiveShell.instance()
    shell.system(command)
    importlib.invalidate_caches()
    print(RESTART_NOTE)  # after every %pip, as IPython's
    code = shell.user_ns.get("_exit_code", 0)
    return code if isinstance(code, int) else 0


__all__ = ["PACKAGES_ENV", "network_problem", "packages_dir", "pip"]
