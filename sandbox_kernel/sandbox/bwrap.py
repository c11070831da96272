"""bubblewrap backend: user namespaces, no daemon, milliseconds to start."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import cgroups, seccomp
from .base import Sandbox, SandboxProcess, SandboxSpec, kill_group, spawn
from .host_ids import SHARE_TREE_LIMIT, grant, run_as_for, share_tree
from .usernet import start_user_network

log = logging.getLogger("sandbox_kernel.sandbox")

#: /etc entries a Python process and common tools need; nothing else of /etc
#: (no shadow, no ssh keys, no machine-id) is visible.
ETC_ALLOWED = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "nsswitch.conf",
    "ssl",
    "ca-certificates",
    "mime.types",
    "fonts",
)

#: host system directories every sandbox sees read-only (besides python_roots())
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/sbin")

SANDBOX_PASSWD = (
    "sandbox:x:1000:1000:sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
SANDBOX_GROUP = "sandbox:x:1000:\nnogroup:x:65534:\n"


def python_roots() -> list[Path]:
    """The interpreter's installation: the venv and the base it was made from."""
    roots: list[Path] = []
    for prefix in (sys.base_prefix, sys.prefix, sys.exec_prefix):
        path = Path(prefix).resolve()
        if path != Path("/usr") and path not in roots:
            roots.append(path)
    return roots


def always_mounted() -> list[str]:
    """The host paths (resolved) every sandbox sees read-only whatever its
    workspace: the interpreter's installation, the system folders, the
    allowed ``/etc`` entries, the worker's code. A private dataset's source
    among them would be readable by every sandbox, with network too
    (``engine/ratchet.py``: refused as a source, and a listed one there
    makes every session private)."""
    places = [*python_roots(), *(Path(d) for d in SYSTEM_DIRS), *(Path("/etc") / name for name in ETC_ALLOWED)]
    places.append(Path(__file__).resolve().parents[1] / "worker")
    return list(dict.fromkeys(os.path.realpath(place) for place in places))


class BubblewrapSandbox(Sandbox):
    """Start commands under ``bwrap`` with every namespace unshared.

    Hardening: ``--unshare-all`` (user, pid, net, ipc, uts, cgroup), uid 1000
    inside, all capabilities dropped, no nested user namespaces, a new
    session (no TIOCSTI on the host terminal), ``--die-with-parent``, a
    cleared environment, read-only system and Python trees, a size-capped
    private ``/tmp``, only the granted bind mounts, and the seccomp filter of
    :mod:`.seccomp` (cross-namespace syscalls, symlink and node planting).
    """

    name = "bwrap"

    def __init__(self, executable: str | None = None) -> None:
        found = executable or shutil.which("bwrap")
        if not found:
            raise FileNotFoundError(
                "bubblewrap (bwrap) is not installed: install the Debian/Ubuntu package "
                "'bubblewrap', or choose another backend"
            )
        self.executable = found
        #: read-write mounts whose existing entries were shared with the sandbox uid
        self._shared: set[tuple[Path, int]] = set()

    def build_argv(
        self, spec: SandboxSpec, info_fd: int | None = None, block_fd: int | None = None, seccomp_fd: int | None = None
    ) -> list[str]:
        argv = [
            self.executable,
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--disable-userns",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
        ]
        if not spec.isolate_network and spec.network == "host":
            argv.append("--share-net")
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd)]
        if block_fd is not None:
            argv += ["--block-fd", str(block_fd)]
        if seccomp_fd is not None:  # see seccomp.py: refused syscalls, loaded just before exec
            argv += ["--seccomp", str(seccomp_fd)]
        for name in SYSTEM_DIRS:  # /usr first: the merged-/usr symlinks point into it
            host = Path(name)
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), name]
            elif host.is_dir():
                argv += ["--ro-bind", name, name]
        etc = ETC_ALLOWED + (("resolv.conf", "hosts") if not spec.isolate_network else ())
        for name in etc:
            if os.path.exists(f"/etc/{name}"):
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--size", str(spec.tmp_size), "--tmpfs", "/tmp"]
        for root in python_roots():
            argv += ["--ro-bind", str(root), str(root)]
        for mount in spec.bind_mounts:
            if mount.kind == "hide":  # workspace policy: the secret's place, empty and read-only
                if Path(mount.source).is_dir():
                    argv += ["--perms", "0555", "--tmpfs", mount.target, "--remount-ro", mount.target]
                else:
                    argv += ["--ro-bind", "/dev/null", mount.target]
                continue
            argv += ["--ro-bind" if mount.readonly else "--bind", str(mount.source), mount.target]
        # The root is bwrap's own tmpfs: make it read-only so a cell cannot fill
        # memory through it or plant files beside the mounts.
        argv += ["--remount-ro", "/"]
        if spec.cwd:
            argv += ["--chdir", spec.cwd]
        argv.append("--clearenv")
        for key, value in spec.env.items():
            argv += ["--setenv", key, value]
        argv.append("--")
        argv += list(spec.command)
        return argv

    def _run_as(self, spec: SandboxSpec) -> tuple[int, int] | None:
        """The unprivileged host uid to start bwrap as (None: this process's),
        after granting it access to everything the sandbox mounts."""
        run_as = run_as_for(spec.sandbox_uid)
        if run_as is None:
            return None
        uid, gid = run_as
        for root in python_roots():
            grant(root, uid, gid, write=False)
        for mount in spec.bind_mounts:
            if mount.kind == "hide":
                continue  # a masked secret: the sandbox is given nothing of it, not even an ACL
            grant(Path(mount.source), uid, gid, write=not mount.readonly)
            if not mount.readonly and (Path(mount.source), uid) not in self._shared:
                self._shared.add((Path(mount.source), uid))
                if share_tree(Path(mount.source), uid, gid) > SHARE_TREE_LIMIT:
                    log.warning(
                        "%s has more than %d entries: only the first were shared with the sandbox's uid %d",
                        mount.source,
                        SHARE_TREE_LIMIT,
                        uid,
                    )
        return run_as

    async def start(self, spec: SandboxSpec) -> SandboxProcess:
        run_as = await asyncio.to_thread(self._run_as, spec)
        cgroup, problem = await asyncio.to_thread(
            cgroups.create, cgroups.Caps(memory=spec.limits.address_space, pids=spec.limits.processes)
        )
        if problem:
            log.warning("no whole-sandbox caps: %s", problem)
        join = cgroup.join if cgroup is not None else None
        if cgroup is not None and spec.limits.processes:
            # The cgroup caps processes for this sandbox alone; RLIMIT_NPROC would
            # count every process of the sandbox uid on the host (all sandboxes).
            spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, processes=None))
        filter_fd = seccomp.bpf_fd()  # every bwrap sandbox runs under the seccomp filter
        try:
            sandbox = await self._start(spec, run_as, join, filter_fd)
        except BaseException:
            if cgroup is not None:
                cgroup.kill_all()  # a start cancelled in bwrap's set-up
                cgroup.remove(timeout=0.5)
            raise
        finally:
            os.close(filter_fd)
        sandbox.cgroup, sandbox.cgroup_problem = cgroup, problem
        return sandbox

    async def _start(
        self, spec: SandboxSpec, run_as: tuple[int, int] | None, join: Callable[[], None] | None, filter_fd: int
    ) -> SandboxProcess:
        if spec.isolate_network or spec.network == "host":
            process = await spawn(
                self.build_argv(spec, seccomp_fd=filter_fd),
                spec.limits,
                env={},
                cwd="/",
                pass_fds=(filter_fd,),
                run_as=run_as,
                join=join,
            )
            return SandboxProcess(process, self.name)
        # User-mode network: bwrap makes an empty network namespace and waits
        # (block fd) until pasta has given it an interface, then runs the command.
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        try:
            process = await spawn(
                self.build_argv(spec, info_w, block_r, filter_fd),
                spec.limits,
                env={},
                cwd="/",
                pass_fds=(info_w, block_r, filter_fd),
                run_as=run_as,
                join=join,
            )
        finally:
            os.close(info_w)
            os.close(block_r)
        helpers: list[asyncio.subprocess.Process] = []
        try:
            info = await asyncio.to_thread(_read_info, info_r)  # which closes info_r
            helpers.append(await start_user_network(int(info["child-pid"])))
        except Exception as exc:
            log.error("user-mode network failed (%r): the sandbox runs without network", exc)
        except BaseException:
            # Cancelled: nobody else knows of this sandbox, which would run
            # until the host process ended. Killed, its info pipe ends, and
            # the thread reading it returns.
            for helper in helpers:
                kill_group(helper)
            kill_group(process)
            raise
        finally:
            try:
                os.write(block_w, b"1")
            except BrokenPipeError:
                pass  # bwrap already exited: the caller sees it die
            os.close(block_w)
        return SandboxProcess(process, self.name, helpers)


def _read_info(fd: int) -> dict[str, Any]:
    """bwrap's report of its namespaces; closes ``fd`` (its reader owns it: a
    caller cancelled meanwhile must not close an fd this thread still reads,
    whose number could name another file by then)."""
    try:
        data = b""
        while True:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("bwrap exited before reporting its namespaces")
            data += chunk
            try:
                info: dict[str, Any] = json.loads(data)
            except ValueError:
                continue
            return info
    finally:
        os.close(fd)
