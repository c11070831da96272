"""The hardened ``containers.create``/``containers.run`` keyword arguments.

One function, :func:`build_container_kwargs`, turns a :class:`ContainerConfig`
into docker-py keyword arguments; the command manager uses it and the kernel's
docker backend is meant to reuse it unchanged. Callers add only ``command``,
``name`` and ``detach``.

What every container gets (see docs/docker.md for the why):

- ``cap_drop=["ALL"]``, ``security_opt=["no-new-privileges", "seccomp=<json>"]`` (the
  profile of :mod:`sandbox_kernel.sandbox.seccomp`, the bwrap filter's rules), ``privileged=False``
- ``read_only=True`` root; a ``/tmp`` tmpfs capped at ``config.tmpfs_size``
  (``nosuid,nodev``; exec is allowed: compiled extensions and pip need it)
- ``pids_limit``; ``mem_limit == memswap_limit`` (no swap beyond the memory limit)
- ``nano_cpus`` CPU quota (clamped to the daemon's CPU count when given)
- a numeric non-root ``user``; ``init=True`` (docker-init reaps zombies);
  ``ipc_mode="private"``; core dumps off
- ``network_mode="none"`` unless the effective mode is FULL, then the
  sandboxes' own bridge (:func:`join_sandbox_network`), not Docker's default
- the workspace bind-mounted read-write at ``working_dir``; every other mount
  read-only; nothing under /run or /var/run and never a Docker socket
- a clean environment: only ``HOME=/tmp`` plus ``config.environment``
- no log driver (``none``): a kernel's worker talks to the host over its
  attached stdio, so a log would hold every cell, output and state blob
  (a private session's data, on the host's disk and in ``docker logs``) and
  cost the daemon a JSON encoding and a write per byte a cell prints
- the labels given (owner, session, created)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox_kernel.privacy.modes import NetworkMode
from sandbox_kernel.sandbox.seccomp import docker_security_opt

from .config import ContainerConfig, coerce_network_mode, parse_memory, validate_user

NOBODY = "65534:65534"

#: Container paths a mount may not land on or under.
_FORBIDDEN_TARGET_ROOTS = ("/run", "/var/run", "/proc", "/sys", "/dev")
#: Host paths that hold (or are) daemon sockets.
_SOCKET_DIRS = ("/run", "/var/run")

_MODE_RANK = {NetworkMode.FULL: 0, NetworkMode.PROXIED: 1, NetworkMode.NONE: 2}


def most_restrictive(*modes: NetworkMode | str) -> NetworkMode:
    """The most restrictive of ``modes`` (FULL < PROXIED < NONE)."""
    coerced = [coerce_network_mode(m) for m in modes]
    return max(coerced, key=_MODE_RANK.__getitem__)


def docker_network(mode: NetworkMode | str) -> str:
    """Whether a sandbox network mode gets a Docker network: "bridge" (which
    :func:`join_sandbox_network` makes the sandboxes' own) or "none".

    Only FULL gets one. PROXIED is reserved for an allow-list proxy that does
    not exist yet, so it gets none, like NONE.
    """
    mode = coerce_network_mode(mode)
    return "bridge" if mode is NetworkMode.FULL else "none"


#: the bridge network every sandbox with a network joins. On Docker's default
#: bridge every container reaches every other one (inter-container
#: communication): one user's cell could connect to a server another user's
#: cell runs. On this one the daemon drops traffic between containers.
SANDBOX_NETWORK = "sandbox-kernel-full"
ICC_OPTION = "com.docker.network.bridge.enable_icc"


def join_sandbox_network(client: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` (of :func:`build_container_kwargs`) with a network put on
    :data:`SANDBOX_NETWORK`, made if missing. A network of that name that lets
    containers reach each other is refused, never used."""
    if kwargs.get("network_mode") != "bridge":
        return kwargs
    import docker

    def ours() -> Any:
        for network in client.networks.list(names=[SANDBOX_NETWORK]):
            if network.name == SANDBOX_NETWORK:  # the filter matches parts of names too
                return network
        return None

    network = ours()
    if network is None:
        try:
            network = client.networks.create(
                SANDBOX_NETWORK, driver="bridge", options={ICC_OPTION: "false"}, check_duplicate=True
            )
        except docker.errors.APIError as exc:  # another kernel made it meanwhile
            network = ours()
            if network is None:
                raise RuntimeError(f"could not make the Docker network {SANDBOX_NETWORK!r}: {exc}") from exc
    options = network.attrs.get("Options") or {}
    if network.attrs.get("Driver") != "bridge" or options.get(ICC_OPTION) != "false":
        raise RuntimeError(
            f"the Docker network {SANDBOX_NETWORK!r} exists but lets containers reach each other "
            f"({ICC_OPTION} is not false): remove it (`docker network rm {SANDBOX_NETWORK}`) and it is made again"
        )
    return {**kwargs, "network_mode": SANDBOX_NETWORK}


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _docker_socket_paths() -> list[str]:
    paths = ["/var/run/docker.sock", "/run/docker.sock"]
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        paths.append(host[len("unix://") :])
    return [os.path.normpath(p) for p in paths]


def check_read_only_mount(source: str, target: str) -> tuple[str, str]:
    """Validate one read-only mount; return ``(source, target)`` normalised.

    Refused, with a ``ValueError`` saying why: relative paths, ``..``, a target of
    ``/`` or under /run, /var/run, /proc, /sys, /dev; a source that is, contains or
    lies under /run or /var/run; anything named ``docker.sock`` or that is a socket.
    """
    if not isinstance(source, (str, os.PathLike)) or not isinstance(target, (str, os.PathLike)):
        raise ValueError(f"read-only mount {source!r} -> {target!r}: paths must be strings")
    src, tgt = os.fspath(source), os.fspath(target)
    for label, value in (("source", src), ("target", tgt)):
        if not value.startswith("/"):
            raise ValueError(f"read-only mount {label} {value!r} must be an absolute path")
        if ".." in PurePosixPath(value).parts or "\0" in value:
            raise ValueError(f"read-only mount {label} {value!r} must not contain '..' or NUL")
        if "docker.sock" in value:
            raise ValueError(f"read-only mount {label} {value!r}: the Docker socket is never mounted")
    src = os.path.normpath(src)
    tgt = os.path.normpath(tgt)
    if tgt == "/":
        raise ValueError("read-only mount target '/' is not allowed")
    for root in _FORBIDDEN_TARGET_ROOTS:
        if _is_within(tgt, root):
            raise ValueError(f"read-only mount target {tgt!r} is under {root}, which is not allowed")
    # Resolve symlinks where the path exists locally (/var/run -> /run and friends).
    candidates = {src}
    try:
        candidates.add(os.path.realpath(src))
    except OSError:
        pass
    sockets = _docker_socket_paths()
    for cand in candidates:
        for root in _SOCKET_DIRS:
            if _is_within(cand, root) or _is_within(root, cand):
                raise ValueError(
                    f"read-only mount source {source!r} is, contains or lies under {root}: "
                    "host sockets (the Docker socket above all) are never mounted"
                )
        for sock in sockets:
            if _is_within(sock, cand):
                raise ValueError(f"read-only mount source {source!r} contains the Docker socket {sock}")
    try:
        if stat.S_ISSOCK(os.stat(src).st_mode):
            raise ValueError(f"read-only mount source {source!r} is a socket: not allowed")
    except OSError:
        pass  # missing locally: Docker reports it (or the daemon is remote)
    return src, tgt


def check_read_only_mounts(mounts: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a ``{host_path: container_path}`` mapping (targets must be unique)."""
    result: dict[str, str] = {}
    seen: dict[str, str] = {}
    for source, target in (mounts or {}).items():
        src, tgt = check_read_only_mount(source, target)
        if tgt in seen and seen[tgt] != src:
            raise ValueError(f"two read-only mounts target {tgt!r}: {seen[tgt]!r} and {src!r}")
        seen[tgt] = src
        result[src] = tgt
    return result


def resolve_user(config_user: str | None, workspace: str | Path | None) -> str:
    """The ``uid:gid`` a container runs as.

    An explicit ``config_user`` wins (validated: numeric, not root). Otherwise the
    owner of the workspace directory when that owner is not root (the container
    then writes files the host user owns), else ``65534:65534`` (nobody).
    """
    if config_user is not None:
        return validate_user(config_user)
    if workspace is not None:
        try:
            st = os.stat(workspace)
        except OSError:
            return NOBODY
        if st.st_uid != 0:
            gid = st.st_gid if st.st_gid != 0 else st.st_uid
            return f"{st.st_uid}:{gid}"
    return NOBODY


def prepare_workspace(workspace: str | Path, user: str) -> None:
    """Make ``workspace`` writable by ``user`` without opening it to anyone else.

    When this process is root and the directory belongs to another uid, the
    directory itself is handed to ``user`` (chown, mode 0700). When it is not
    root nothing is changed: the default user is then the directory's owner.
    """
    path = Path(workspace)
    uid_text, _, gid_text = validate_user(user).partition(":")
    uid, gid = int(uid_text), int(gid_text)
    st = path.stat()
    if hasattr(os, "geteuid") and os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid)
        os.chmod(path, 0o700)


_ACL_ACCESS = "system.posix_acl_access"
_ACL_DEFAULT = "system.posix_acl_default"
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_ACL_UNDEFINED_ID = 0xFFFFFFFF


def _acl_blob(named_users: list[int]) -> bytes:
    """A POSIX ACL in the kernel's xattr format (version 2): the owner and the
    named users get rwx, the owning group and others nothing."""
    import struct

    entries = [(_ACL_USER_OBJ, 7, _ACL_UNDEFINED_ID)]
    entries += [(_ACL_USER, 7, uid) for uid in sorted(set(named_users))]
    entries += [
        (_ACL_GROUP_OBJ, 0, _ACL_UNDEFINED_ID),
        (_ACL_MASK, 7, _ACL_UNDEFINED_ID),
        (_ACL_OTHER, 0, _ACL_UNDEFINED_ID),
    ]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def share_workspace(workspace: str | Path, user: str) -> None:
    """Let ``user`` (the container) and this process's uid both write ``workspace``
    and everything created in it later, without handing the directory over.

    Needed when the directory is also used by sandboxes running as this
    process's uid (the agent tools' bwrap cells) and this process is root: the
    container may not run as root, and :func:`prepare_workspace`'s chown would
    lock the cells out. A POSIX ACL grants both uids rwx on the directory and,
    as its default ACL, on every file and folder created in it (by either
    side). Nobody else gains access. Entries that existed before keep their
    permissions. When not root nothing is done: the container then runs as
    the directory's owner, which is this process's uid.
    """
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return
    uid = int(validate_user(user).partition(":")[0])
    users = [uid, os.geteuid()]
    # The directory is opened without following a symlink, and the ACL set on
    # that descriptor: a path swapped underneath cannot redirect it.
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            os.setxattr(fd, _ACL_ACCESS, _acl_blob(users))
            os.setxattr(fd, _ACL_DEFAULT, _acl_blob(users))
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot share the workspace {workspace} between this process (uid {os.geteuid()}) and the "
                f"container (uid {uid}): setting a POSIX ACL failed ({exc.strerror}). Use a filesystem with "
                "ACL support, or run as a non-root user (the container then runs as that user)",
            ) from exc
    finally:
        os.close(fd)


def build_container_kwargs(
    config: ContainerConfig,
    *,
    network_mode: NetworkMode | str | None = None,
    workspace: str | Path | None = None,
    user: str | None = None,
    labels: Mapping[str, str] | None = None,
    extra_read_only_mounts: Mapping[str, str] | None = None,
    max_cpus: float | None = None,
) -> dict[str, Any]:
    """docker-py ``containers.create``/``run`` kwargs for a hardened sandbox.

    ``network_mode`` is combined with ``config.network_mode`` (the more restrictive
    wins). ``workspace`` (a host dir) is bind-mounted read-write at
    ``config.working_dir``. ``user`` defaults to :func:`resolve_user`. Read-only
    mounts come from ``config.read_only_mounts`` plus ``extra_read_only_mounts``.
    ``max_cpus`` (the daemon's CPU count) clamps the CPU quota, since Docker refuses
    a quota above it.
    """
    from docker.types import LogConfig, Mount, Ulimit

    mode = most_restrictive(config.network_mode, network_mode or NetworkMode.FULL)
    run_user = validate_user(user) if user is not None else resolve_user(config.user, workspace)

    mounts: list[Mount] = []
    if workspace is not None:
        ws = os.fspath(workspace)
        if not os.path.isabs(ws):
            raise ValueError(f"workspace {ws!r} must be an absolute host path")
        mounts.append(Mount(target=config.working_dir, source=ws, type="bind", read_only=False))
    ro = check_read_only_mounts({**config.read_only_mounts, **(extra_read_only_mounts or {})})
    for src, tgt in ro.items():
        if _is_within(tgt, config.working_dir):
            raise ValueError(
                f"read-only mount target {tgt!r} is inside the workspace {config.working_dir}: "
                "mount it elsewhere (e.g. /skills/<name>/scripts)"
            )
        if tgt == "/tmp" or _is_within(tgt, "/tmp"):
            raise ValueError(f"read-only mount target {tgt!r} collides with the /tmp tmpfs")
        mounts.append(Mount(target=tgt, source=src, type="bind", read_only=True))

    cpus = config.cpu_limit
    if max_cpus is not None and max_cpus > 0:
        cpus = min(cpus, float(max_cpus))
    memory = config.memory_bytes
    tmpfs_bytes = parse_memory(config.tmpfs_size, "ContainerConfig.tmpfs_size")

    environment = {"HOME": "/tmp", **config.environment}

    return {
        "image": config.image,
        "user": run_user,
        "working_dir": config.working_dir,
        "environment": environment,
        "network_mode": docker_network(mode),
        "mounts": mounts,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={tmpfs_bytes},mode=1777"},
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", docker_security_opt()],
        "privileged": False,
        "pids_limit": config.pids_limit,
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": round(cpus * 1e9),
        "init": True,
        "ipc_mode": "private",
        "hostname": "sandbox",
        "ulimits": [Ulimit(name="core", soft=0, hard=0)],
        "log_config": LogConfig(type="none"),
        "labels": dict(labels or {}),
    }
