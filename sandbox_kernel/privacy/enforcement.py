"""Who enforces a session's level, and a way for a host-side raiser to wait for them.

A connector that raises a session's level (``PrivateData.add_private_dataset``)
and then hands over data must know that no sandbox of the session still has
network. Every engine session that runs sandboxes registers here while it
lives (one small JSON file per holder: pid, the level it enforces, whether a
sandbox of it has network) and updates the file whenever that changes.
:func:`wait_enforced` polls those files until every live holder reports the
level with no network, or times out naming the ones that did not.

Files live beside the store (``<store>-enforced/<user>/<session>/``), written
atomically; a holder whose process is gone is ignored (and removed), unless
it held Docker containers (its record's ``docker``): they outlive it, so a
reader removes them through the daemon first and counts the holder as one
with network until the daemon confirms none is left (``docker/orphans.py``).

A holder names its workspace and the other host folders its sandboxes can
read (a Docker shell's read-only mounts: ``reads``). A rise waits for the
session's own holders and for every holder, in ANY store of the host, whose
workspace or read folders overlap the session's folder: those sessions rise
with it (folder levels are read across every store, ``workspace_levels``).
"""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .identity import validate_id
from .sensitivity import Sensitivity

POLL = 0.01
#: how long a sandbox about to start with private data (mounts, or a session
#: level and read-only folders) waits for the other holders of the session and
#: of its folders to report their network cut
HOLDERS_WAIT = 10.0


def enforced_root(store_root: Path) -> Path:
    """Where the holders of a store's sessions report (beside the store)."""
    return store_root.parent / f"{store_root.name}-enforced"


def _alive(pid: int) -> bool:
    """A running process: a killed kernel its parent has not reaped yet (a
    zombie) holds no sandbox any more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


class EnforcementRecord:
    """One holder's entry (an engine session in this process)."""

    def __init__(
        self,
        store_root: Path,
        user_id: str,
        session_id: str,
        workspace: Path | None = None,
        reads: Iterable[str | os.PathLike[str]] = (),
        docker: Mapping[str, Any] | None = None,
    ) -> None:
        self.dir = enforced_root(store_root) / validate_id(user_id, "user_id") / validate_id(session_id, "session_id")
        self.path = self.dir / f"{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
        self._store_root = Path(store_root)
        self.workspace = os.path.realpath(workspace) if workspace is not None else None
        #: other host folders the holder's sandboxes read (read-only mounts)
        self.reads = sorted({os.path.realpath(folder) for folder in reads})
        #: the holder's Docker containers (``docker.orphans.docker_facts``):
        #: they outlive its process, so its death alone does not end it
        self.docker = dict(docker) if docker is not None else None
        self._last: tuple[str, bool, str | None] | None = None

    def name_containers(self, docker: Mapping[str, Any]) -> None:
        """Name the holder's Docker containers (``docker.orphans.docker_facts``)
        from now on: the next report writes them."""
        self.docker = dict(docker)
        self._last = None

    def report(self, level: Sensitivity, has_network: bool, workspace: Path | None = None) -> None:
        """Say what this holder enforces now, and where its folder is now
        (it may have moved under the sandbox); cheap when nothing changed."""
        if workspace is not None:
            self.workspace = os.path.realpath(workspace)
        now = (level.name, has_network, self.workspace)
        if now == self._last:
            return
        # Listed before its first holder file: a raiser of another store finds
        # holders through the registry (a Docker shell's store may hold no
        # session record yet, so nothing else registered it).
        from .store_registry import register

        register(self._store_root)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        entry: dict[str, Any] = {"pid": os.getpid(), "level": level.name, "network": has_network}
        entry["workspace"] = self.workspace
        if self.reads:
            entry["reads"] = self.reads
        if self.docker is not None:
            entry["docker"] = self.docker
        data = json.dumps(entry).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write")
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: no half-written file left behind (guarantee 6)
            raise
        self._last = now

    def close(self) -> None:
        for path in (self.path, self.path.with_suffix(".tmp")):
            path.unlink(missing_ok=True)
        self._last = None


def _holders(store_root: Path) -> list[tuple[str, str, Path, dict[str, Any]]]:
    """Every readable, live holder: (user_id, session_id, file, entry)."""
    root = enforced_root(store_root)
    found = []
    try:
        users = os.listdir(root)
    except FileNotFoundError:
        return []
    for user in users:
        try:
            sessions = os.listdir(root / user)
        except OSError:
            continue
        for session in sessions:
            try:
                names = os.listdir(root / user / session)
            except OSError:
                continue
            for name in names:
                if not name.endswith(".json"):
                    continue
                path = root / user / session / name
                try:
                    with open(path, "rb") as fh:
                        entry = json.loads(fh.read(8192))
                    pid = int(entry["pid"])
                except (OSError, ValueError, KeyError, TypeError):
                    entry = {"pid": -1, "level": "SECRET", "network": True, "unreadable": True}
                    pid = -1
                if pid != -1 and not _alive(pid):
                    left = _left_behind(pid, entry)
                    if left is not None:  # still a holder with network (fails closed)
                        found.append((user, session, path, {**entry, "network": True, "dead": left}))
                        continue
                    try:
                        path.unlink()
                    except OSError:
                        pass
                    continue
                found.append((user, session, path, entry))
    return found


def _left_behind(pid: int, entry: dict[str, Any]) -> str | None:
    """What the dead holder ``pid`` may have left with a network: None when
    nothing (no Docker containers, or the daemon removed every one), else why
    it still counts."""
    if "docker" not in entry:
        return None  # its sandboxes died with it (bwrap, subprocess)
    from sandbox_kernel.docker.orphans import remove_dead_holders_containers

    return remove_dead_holders_containers(pid, entry["docker"])


def networked_workspaces(store_root: Path) -> list[tuple[str, int]]:
    """(workspace, pid) of each live holder of the store's sessions that
    reports a sandbox or command with network."""
    return [
        (entry["workspace"], int(entry["pid"]))
        for _, _, _, entry in _holders(store_root)
        if entry.get("network") is True and isinstance(entry.get("workspace"), str)
    ]


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _reads(entry: dict[str, Any]) -> list[str]:
    reads = entry.get("reads")
    return [r for r in reads if isinstance(r, str)] if isinstance(reads, list) else []


def _every_root(store_root: Path) -> list[Path]:
    """``store_root`` and every other store of the host (the default one and
    the registered ones), each once."""
    from .store_registry import all_store_roots

    roots, _ = all_store_roots()
    return list(dict.fromkeys([Path(store_root), *(Path(root) for root in roots)]))


def pending_holders(
    store_root: Path,
    user_id: str,
    session_id: str,
    level: Sensitivity,
    *,
    workspaces: Iterable[str] = (),
    reads: Iterable[str] = (),
    skip: Iterable[Path] = (),
) -> list[str]:
    """Live holders that must, and do not yet, enforce ``level`` without network:
    the session's own, and those of every session, in any store of the host,
    whose workspace or read folders overlap one of the session's (they rise
    with it, see ``workspace_levels``). ``workspaces`` and ``reads``: folders
    of the session that no live holder of it names (a private Docker shell
    has no record: it has no network). ``skip``: the caller's own records
    (a container being made counts as networked until it is)."""
    validate_id(user_id, "user_id")
    validate_id(session_id, "session_id")
    own_holders = _holders(store_root)
    own = [h for h in own_holders if h[0] == user_id and h[1] == session_id]
    holders = [
        (root, h)
        for root in _every_root(store_root)
        for h in (own_holders if root == Path(store_root) else _holders(root))
    ]
    # and a folder around one of them that a sandbox worked in rises with it
    # (what it left there may tie its other subfolders to it: workspace_levels)
    folders = _with_reached_around(
        [*workspaces, *(str(h[3]["workspace"]) for h in own if isinstance(h[3].get("workspace"), str))]
    )
    # the session's read-only folders: those working in them rise with it (a
    # cell of it connects to a socket there), not those reading them
    # (workspace_levels.READ_EXACT), and so does a folder a sandbox worked in
    # around them
    read = _with_reached_around([*reads, *(folder for h in own for folder in _reads(h[3]))])
    # A live holder whose folder contains one of these, or that reads one of
    # them (a read-only mount), or works in a folder read, rises with it and
    # records its own folder and those it reads (engine/ratchet.py,
    # docker/manager.py): the sessions in that folder, or working in those,
    # rise too (a sibling of the private folder), so they are waited for.
    grown = True
    while grown:
        grown = False
        for _, (_, _, _, entry) in holders:
            around = entry.get("workspace")
            if not isinstance(around, str) or around in folders:
                continue
            if (
                any(_inside(f, around) for f in folders)
                or any(_overlap(r, f) for r in _reads(entry) for f in folders)
                or any(_overlap(around, r) for r in read)
            ):
                folders.add(around)
                read.update(_with_reached_around(_reads(entry)))
                grown = True
    pending = []
    skipped = {Path(p).name for p in skip}  # (a record's name is unique: its pid and a uuid)
    for root, (user, session, path, entry) in holders:
        if path.name in skipped:
            continue
        mine = root == Path(store_root) and user == user_id and session == session_id
        places = [entry["workspace"]] if isinstance(entry.get("workspace"), str) else []
        shared = any(_overlap(place, f) for place in places + _reads(entry) for f in folders)
        if not (mine or shared):
            continue
        if entry.get("unreadable"):
            pending.append(f"{path.name} (unreadable)")
            continue
        try:
            seen = Sensitivity.parse(entry["level"])
        except (ValueError, KeyError):
            pending.append(f"{path.name} (unreadable)")
            continue
        if "dead" in entry:
            pending.append(f"dead process {entry['pid']} of session {session}: {entry['dead']}")
        elif seen < level or bool(entry.get("network", True)):
            pending.append(
                f"process {entry['pid']} of session {session} ({seen.name}, "
                f"{'with' if entry.get('network') else 'without'} network)"
            )
    return pending


def _with_reached_around(folders: Iterable[str]) -> set[str]:
    """``folders`` and every folder around one of them that a sandbox worked in."""
    found = set(folders)
    return found | {str(place) for folder in list(found) for place in _reached_around(folder)}


def _reached_around(folder: str) -> list[Path]:
    from .workspace_levels import folder_of, reached_ancestors

    return reached_ancestors(folder_of(folder))


def wait_enforced(store_root: Path, user_id: str, session_id: str, level: Sensitivity, timeout: float = 10.0) -> None:
    """Return once every live sandbox of the session runs without network at
    ``level`` or above; raise ``TimeoutError`` naming the holders that did not."""
    deadline = time.monotonic() + timeout
    while True:
        pending = pending_holders(store_root, user_id, session_id, level)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"session {session_id!r} of {user_id!r}: {len(pending)} holder(s) did not confirm the cut of the "
                f"network within {timeout:g} s: {', '.join(pending[:5])}. Do not hand over the data yet."
            )
        time.sleep(POLL)
