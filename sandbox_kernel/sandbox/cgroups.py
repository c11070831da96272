"""Whole-sandbox caps: one cgroup per sandbox for its memory, processes and CPU share.

rlimits are per process: three processes of one cell each touching 4 GiB
peaked at 12 GiB against an 8 GiB "limit", and RLIMIT_NPROC is not enforced
for host root, so a fork storm reached thousands of processes. A cgroup caps
everything the sandbox runs together: total memory with no swap beyond it,
total processes and threads, and a CPU weight below the default so the Jupyter
server and other kernels keep the machine responsive.

The cgroup is made under the kernel's own cgroup in each hierarchy (v1, one
hierarchy per controller, as on this machine; or the v2 unified hierarchy when
the kernel may delegate to a child), the sandbox's first process joins it
between fork and exec (before it drops to the sandbox uid), and it is removed
with the sandbox. When none can be had (no permission, v2 without delegation),
:func:`create` says why and the engine tells the user in the first cell's output.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: CPU weight of a sandbox relative to the default (1024 in v1 shares, 100 in v2)
CPU_SHARES = 512
_names = itertools.count(1)
_collected = False  # stale cgroups of dead kernels are collected once per process
#: how long a cgroup still busy after its sandbox went is retried in the background
RETRY_FOR = 120.0
#: how long this process's exit waits at most for such cgroups to be removed
EXIT_WAIT = 4.0
_leftovers: list[SandboxCgroup] = []
_leftovers_lock = threading.Lock()


@dataclass(frozen=True)
class Caps:
    """What one sandbox may use in total (None: no cap of that kind)."""

    memory: int | None = None
    pids: int | None = None


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` ("" for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller == "" and controllers == "":
            return path
        if controller and controller in controllers.split(","):
            return path
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


@dataclass
class SandboxCgroup:
    """The cgroup(s) of one sandbox; ``version`` is 1 or 2."""

    version: int
    dirs: dict[str, Path]
    caps: Caps
    #: made (and removed) by us; False for a container's, which the daemon owns
    owned: bool = True
    #: the counter files, open: read before and after every request, and a
    #: path walk and open per read cost 0.15 ms of each request's path
    _files: dict[Path, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ---- in the child, between fork and exec ------------------------------------
    def join(self) -> None:
        """Move the calling process in (every hierarchy); its children follow."""
        pid = str(os.getpid())
        for directory in self.dirs.values():
            _write(directory / "cgroup.procs", pid)

    # ---- what was hit ---------------------------------------------------------------
    def _counters(self) -> dict[str, int]:
        found: dict[str, int] = {}
        if self.version == 1:
            sources = {"oom_kill": ("memory", "memory.oom_control"), "max": ("pids", "pids.events")}
        else:
            sources = {"oom_kill": ("unified", "memory.events"), "max": ("unified", "pids.events")}
        for key, (hierarchy, name) in sources.items():
            directory = self.dirs.get(hierarchy)
            if directory is None:
                continue
            try:
                for line in self._read(directory / name).splitlines():
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        found[key] = int(parts[1])
            except (OSError, ValueError):
                continue
        return found

    def _read(self, path: Path) -> str:
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, 4096, 0).decode("ascii", "replace")  # a cgroup file is made afresh at offset 0

    def close(self) -> None:
        """Close the counter files (the cgroup is going)."""
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)

    def mark(self) -> dict[str, int]:
        """Counters now, to compare after a cell."""
        return self._counters()

    def hit_since(self, before: dict[str, int]) -> list[str]:
        """Human-readable caps reached since ``before`` (empty when none)."""
        now = self._counters()
        hits = []
        if now.get("oom_kill", 0) > before.get("oom_kill", 0) and self.caps.memory:
            hits.append(
                f"the sandbox's memory cap ({_size(self.caps.memory)} in total for all its processes, no swap) "
                "was reached and the largest process was killed"
            )
        if now.get("max", 0) > before.get("max", 0) and self.caps.pids:
            hits.append(
                f"the sandbox's process cap ({self.caps.pids} processes and threads in total) was reached: "
                "new processes or threads were refused"
            )
        return hits

    def remove_later(self) -> None:
        """Keep removing this cgroup (its sandbox is gone, the kernel still
        holds it busy) in the background and, for up to EXIT_WAIT, at this
        process's exit.

        A memory cgroup v1 once stayed busy for over half a second after its
        last task while a kernel shut down: the retrying thread died with the
        kernel, and the directory stayed until the next kernel's
        :func:`collect_stale`. A shutdown now waits for it, a few seconds at most."""
        with _leftovers_lock:
            _leftovers.append(self)

        def retry() -> None:
            if self.remove(RETRY_FOR):
                with _leftovers_lock:
                    _leftovers.remove(self)

        threading.Thread(target=retry, name="cgroup-removal", daemon=True).start()

    def kill_all(self, timeout: float = 2.0, *, foreign: bool = False) -> bool:
        """SIGKILL every process of the sandbox, whatever its session or
        parent: bwrap's own init leads a session of its own, and a sandbox
        killed in the middle of its set-up (a cancelled start) left it, and
        the worker under it, running after the group kill. Returns whether
        the cgroup is empty (processes forking meanwhile are killed too).

        A cgroup someone else made (a container's) is left alone unless
        ``foreign``: a container its daemon does not stop."""
        if not self.owned and not foreign:
            return True
        directory = self.dirs.get("unified") or self.dirs.get("pids") or next(iter(self.dirs.values()), None)
        if directory is None:
            return True
        if self.version == 2:
            try:
                _write(directory / "cgroup.kill", "1")  # Linux 5.14: the kernel does it, forks and all
            except OSError:
                pass
        _kill_procs(directory, timeout)
        try:
            return not (directory / "cgroup.procs").read_text().split()
        except OSError:
            return True  # gone already

    def remove(self, timeout: float = 5.0) -> bool:
        """Remove the (now empty) cgroup directories, retrying all of them while
        the last processes exit and the kernel lets go (memory and cpu cgroups
        stay busy a little after the last task is gone). Returns whether all
        went; what is left is collected by :func:`collect_stale` later."""
        self.close()
        if not self.owned:
            return True
        deadline = time.monotonic() + timeout
        left = list(self.dirs.values())
        while left:
            still = []
            for directory in left:
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(directory)
            left = still
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return not left


@atexit.register
def _remove_leftovers() -> None:
    deadline = time.monotonic() + EXIT_WAIT
    with _leftovers_lock:
        leftovers = list(_leftovers)
    for cgroup in leftovers:
        cgroup.remove(max(0.0, deadline - time.monotonic()))


def collect_stale() -> int:
    """Remove the cgroups of sandboxes whose kernel died without removing them
    (a SIGKILLed kernel cannot): names carry the kernel's pid. Returns how many
    went."""
    removed = 0
    for hierarchy in ("memory", "pids", "cpu", ""):
        own = _own_path(hierarchy)
        if own is None:
            continue
        base = (ROOT / hierarchy / own.lstrip("/")) if hierarchy else (ROOT / own.lstrip("/"))
        try:
            entries = list(base.glob("sandbox-kernel-*"))
        except OSError:
            continue
        for directory in entries:
            try:
                pid = int(directory.name.split("-")[2])
            except (IndexError, ValueError):
                continue
            if pid == os.getpid() or _alive(pid):
                continue
            # A sandbox of the dead kernel still running (one whose bwrap had
            # not yet tied itself to the kernel's life when the kernel died)
            # goes first: it would keep the directory, and its data, for ever.
            _kill_procs(directory)
            try:
                directory.rmdir()
                removed += 1
            except OSError:
                continue
    return removed


def _kill_procs(directory: Path, timeout: float = 1.0) -> None:
    """SIGKILL the processes of a cgroup until it has none (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pids = [int(line) for line in (directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """A running process (a zombie whose parent has not reaped it is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def create(caps: Caps) -> tuple[SandboxCgroup | None, str | None]:
    """A fresh cgroup for one sandbox with ``caps``, or (None, why not)."""
    global _collected
    if not _collected:
        _collected = True
        collect_stale()
    name = f"sandbox-kernel-{os.getpid()}-{next(_names)}"
    if (ROOT / "cgroup.controllers").exists():
        return _create_v2(name, caps)
    return _create_v1(name, caps)


def _create_v1(name: str, caps: Caps) -> tuple[SandboxCgroup | None, str | None]:
    dirs: dict[str, Path] = {}
    try:
        for controller in ("memory", "pids", "cpu"):
            own = _own_path(controller)
            base = ROOT / controller
            if own is None or not base.is_dir():
                raise OSError(f"no cgroup v1 hierarchy for {controller}")
            directory = base / own.lstrip("/") / name
            directory.mkdir()
            dirs[controller] = directory
        if caps.memory:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(caps.memory))
            swap = dirs["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():
                _write(swap, str(caps.memory))  # memory + swap: no swap beyond the cap
        if caps.pids:
            _write(dirs["pids"] / "pids.max", str(caps.pids))
        _write(dirs["cpu"] / "cpu.shares", str(CPU_SHARES))
    except OSError as exc:
        SandboxCgroup(1, dirs, caps).remove(timeout=0)
        return None, f"cgroup v1 unavailable: {exc}"
    return SandboxCgroup(1, dirs, caps), None


def _create_v2(name: str, caps: Caps) -> tuple[SandboxCgroup | None, str | None]:
    own = _own_path("")
    if own is None:
        return None, "cgroup v2: this process's cgroup is unknown"
    parent = ROOT / own.lstrip("/")
    directory = parent / name
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        missing = [c for c in ("memory", "pids", "cpu") if c not in enabled]
        if missing:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
        directory.mkdir()
        if caps.memory:
            _write(directory / "memory.max", str(caps.memory))
            _write(directory / "memory.swap.max", "0")
        if caps.pids:
            _write(directory / "pids.max", str(caps.pids))
        _write(directory / "cpu.weight", str(max(1, CPU_SHARES * 100 // 1024)))
    except OSError as exc:
        SandboxCgroup(2, {"unified": directory}, caps).remove(timeout=0)
        return None, f"cgroup v2 not delegated to this kernel ({exc})"
    return SandboxCgroup(2, {"unified": directory}, caps), None
