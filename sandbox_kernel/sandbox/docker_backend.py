"""Docker backend: every sandbox is a hardened, throw-away container.

The engine asks for one long-lived child per sandbox (``start(spec)``) and talks
framed JSON over its stdin/stdout. Here that child is a container:

1. the container is *created* through the Docker SDK with the hardened
   keyword arguments of :func:`sandbox_kernel.docker.hardening.build_container_kwargs`
   (no capabilities, no-new-privileges, read-only root, capped ``/tmp``, pids,
   memory without swap and CPU limits, a numeric non-root user, docker-init,
   private IPC, ``network_mode="none"`` when ``spec.isolate_network`` else the
   default bridge; never privileged, never the Docker socket), the spec's bind
   mounts, the host Python installation read-only at its own paths, the spec's
   environment and working directory, ``auto_remove`` and our labels;
2. the Docker CLI ``docker start --attach --interactive <id>`` is then run as a
   local subprocess: its stdin/stdout/stderr *are* the container's, so the
   engine's :class:`SandboxProcess` machinery works unchanged.

The container goes away whatever happens:

- :meth:`ContainerProcess.kill` removes it by id (``force``), then kills the CLI;
- it exits by itself when the worker does (shutdown, channel closed) and is then
  removed by the daemon (``auto_remove``);
- two independent paths when the kernel process dies, even by SIGKILL: the CLI
  gets SIGTERM (``PR_SET_PDEATHSIG``) and proxies it into the container, where
  docker-init passes it to the worker's first process, whose death stops the
  whole container; and the container is made with ``StdinOnce``, so the end of
  the CLI's attach (its stdin at EOF, or the CLI dead) closes the worker's
  channel and the worker exits;
- labels (``sandbox_kernel.managed``, owner pid/start/host/boot) let
  ``python -m sandbox_kernel.docker.gc`` remove anything left by a crash of the
  daemon connection or the host.

Every blocking Docker SDK call runs in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import select
import shutil
import signal
import sys
import threading
import time
import uuid
from abc import ABCMeta
from pathlib import Path
from typing import Any

from traitlets import Dict, Float, Int, Unicode
from traitlets.config import Application, Configurable
from traitlets.traitlets import MetaHasTraits

from ..engine.workspace_policy import hide_private_sources
from .base import BindMount, Sandbox, SandboxProcess, SandboxSpec
from .bwrap import python_roots
from .host_ids import AccessGrantError, grant

log = logging.getLogger("sandbox_kernel.sandbox")

#: ``sandbox_kernel.kind`` of the containers this backend makes
KIND = "kernel"
#: seconds a kill from the host waits for the container's first process to
#: be known (normally known long before), and for it to end once killed
TRACK_WAIT = 5.0
HOST_KILL_WAIT = 5.0
#: the label holding this backend's per-container id (unique per start)
LABEL_SANDBOX = "sandbox_kernel.sandbox"

_PR_SET_PDEATHSIG = 1
try:  # loaded before any fork: only a plain function call happens in the child
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - non-Linux
    _LIBC = None

#: variables the Docker CLI needs to reach the same daemon as the SDK; nothing
#: else of the host environment is passed to it (and none reaches the container).
_CLI_ENV = (
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_API_VERSION",
    "SSH_AUTH_SOCK",
    "XDG_RUNTIME_DIR",
)


class DockerSandboxError(RuntimeError):
    """The container could not be made or started (the engine reports it as
    ``SandboxUnavailable`` with this message)."""


class _Meta(MetaHasTraits, ABCMeta):
    """Sandbox is an ABC, Configurable has traitlets' metaclass: both at once."""


class ContainerProcess(SandboxProcess):
    """The attached Docker CLI; killing it removes the container first."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        backend: str,
        client: Any,
        container_id: str,
        name: str,
        unstopped: dict[str, ContainerProcess] | None = None,
    ) -> None:
        super().__init__(process, backend)
        self.client = client
        self.container_id = container_id
        self.container_name = name
        #: its removal was asked for (no disconnect is tried any more)
        self._removed = False
        #: confirmed to run no process any more (removed by the daemon, or
        #: its first process killed from the host): only then is it let go
        self.stopped = False
        #: the backend's containers whose stop is not confirmed yet (shared)
        self._unstopped = unstopped if unstopped is not None else {}
        #: a pidfd on the container's first process (docker-init) on this
        #: host, opened once it runs (``track_init``): the host kills the
        #: container with it when the daemon does not answer
        self._init_fd: int | None = None
        self._tracked = threading.Event()
        self._tracking: asyncio.Future[None] | None = None
        self._stopping = threading.Lock()
        self._caps_looked_up = False
        #: the watchdog's thread and the loop may disconnect at once: the
        #: second, seeing the first's networks, failed on them ("not
        #: connected") and was taken for a refusal, which removes the sandbox
        self._disconnecting = threading.Lock()

    def caps_mark(self) -> dict[str, int]:
        """The daemon caps the container (memory without swap, pids): find its
        cgroup from the host once, to name a cap a cell reaches exactly as the
        bwrap backend does."""
        if self.cgroup is None and not self._caps_looked_up:
            self._caps_looked_up = True
            try:
                self.cgroup = container_cgroup(self.client, self.container_id)
            except Exception as exc:  # no cgroup view from here (remote daemon...): no names, still capped
                log.debug("cgroup of container %s not found: %s", self.container_id[:12], exc)
        return super().caps_mark()

    def track_init(self, timeout: float) -> None:
        """Open a pidfd on the container's first process once it runs (its
        ``State.Pid``, checked again after the open, so that a reused pid is
        never taken for it). A container whose daemon stops answering is then
        still killed from the host: its first process is the init of its PID
        namespace, whose death ends every process in it, stopped ones too."""
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.process.returncode is None and not self._removed:
                state = self.client.api.inspect_container(self.container_id).get("State") or {}
                pid = int(state.get("Pid") or 0)
                if state.get("Running") and pid > 0:
                    self._open_init(pid)
                    return
                if state.get("Status") in ("exited", "dead", "removing"):
                    return
                time.sleep(0.02)
        except Exception as exc:  # no daemon, no pidfd: the daemon's removal is the only way
            log.warning("the first process of container %s is not known on this host: %s", self.container_id[:12], exc)
        finally:
            self._tracked.set()

    def _open_init(self, pid: int) -> None:
        fd = os.pidfd_open(pid)
        state = self.client.api.inspect_container(self.container_id).get("State") or {}
        if state.get("Running") and int(state.get("Pid") or 0) == pid:
            self._init_fd = fd
        else:
            os.close(fd)

    async def remove_container(self) -> None:
        """Remove the container by id (``force``: kills what still runs in
        it); when the daemon does not, kill it from the host. Tried again at
        every call until one of them is confirmed (``stopped``)."""
        self._removed = True
        if not self.stopped:
            await asyncio.to_thread(self.stop)

    def stop(self) -> bool:
        """Have the container stopped for good; whether that is confirmed.
        Unconfirmed, it stays in the backend's ``unstopped`` list: the
        session reports network while it is there, and no new sandbox starts
        before it is stopped (its network may still be up beside the
        private workspace the next one mounts)."""
        with self._stopping:
            if self.stopped:
                return True
            self._removed = True
            if _remove_container(self.client, self.container_id) or self._kill_from_host():
                self.stopped = True
                self._unstopped.pop(self.container_id, None)
                self._close_init()
            else:
                self._unstopped[self.container_id] = self
            return self.stopped

    def _kill_from_host(self) -> bool:
        """SIGKILL the container's first process through its pidfd (no
        daemon needed); whether it is gone. Needs the right to signal it: a
        root kernel, or the container running as the kernel's own uid (the
        default for a non-root kernel; not with user-namespace remapping)."""
        self._tracked.wait(TRACK_WAIT)
        fd = self._init_fd
        if fd is None:
            log.error(
                "container %s cannot be killed from the host: its first process is unknown", self.container_id[:12]
            )
            return False
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except OSError as exc:
            log.error("could not kill container %s from the host: %s", self.container_id[:12], exc)
            return False
        if not select.select([fd], [], [], HOST_KILL_WAIT)[0]:
            log.error(
                "container %s did not end within %g s of its kill from the host", self.container_id[:12], HOST_KILL_WAIT
            )
            return False
        log.warning("container %s killed from the host: its daemon did not remove it", self.container_id[:12])
        return True

    def _close_init(self) -> None:
        fd, self._init_fd = self._init_fd, None
        if fd is not None:
            os.close(fd)

    async def cut_network(self) -> bool:
        """Disconnect the container from every network (the daemon does it,
        not the container): its interfaces but ``lo`` vanish at once."""
        if self._removed:
            return False
        if not await asyncio.to_thread(self._disconnect):
            self.cut_refused = True
            return False
        self.network_cut = True
        return True

    def cut_network_now(self) -> bool:
        """Disconnect the container from another thread (see
        ``SandboxProcess.cut_network_now``); a daemon that refuses leaves only
        :meth:`kill_now`."""
        if self._removed or not self._disconnect():
            return False
        self.cut_now = True
        return True

    def _disconnect(self) -> bool:
        """Have the daemon disconnect the container from every network; whether it did."""
        try:
            with self._disconnecting:
                _disconnect_all(self.client, self.container_id)
        except Exception as exc:
            log.error("could not disconnect sandbox container %s: %s", self.container_id[:12], exc)
            return False
        return True

    def kill_now(self) -> None:
        """Remove the container from another thread; the loop's :meth:`kill` follows."""
        self.stop()
        super().kill_now()

    async def kill(self) -> None:
        try:
            await self.remove_container()
        finally:
            await super().kill()


def container_cgroup(client: Any, container_id: str) -> Any:
    """The container's cgroup(s) as seen from the host, read-only (the daemon
    made them and removes them): for the counters of its caps."""
    from . import cgroups

    info = client.api.inspect_container(container_id)
    pid = int((info.get("State") or {}).get("Pid") or 0)
    host = info.get("HostConfig") or {}
    if pid <= 0:
        return None
    caps = cgroups.Caps(memory=host.get("Memory") or None, pids=host.get("PidsLimit") or None)
    dirs: dict[str, Any] = {}
    version = 1
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            if (cgroups.ROOT / "cgroup.controllers").exists():
                version = 2
                dirs["unified"] = cgroups.ROOT / path.lstrip("/")
            continue
        for controller in ("memory", "pids"):
            if controller in controllers.split(","):
                dirs[controller] = cgroups.ROOT / controller / path.lstrip("/")
    return cgroups.SandboxCgroup(version, dirs, caps, owned=False) if dirs else None


def _disconnect_all(client: Any, container_id: str) -> None:
    info = client.api.inspect_container(container_id)
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    for name in networks:
        if name != "none":
            client.api.disconnect_container_from_network(container_id, name, force=True)


def _remove_container(client: Any, container_id: str) -> bool:
    """Have the daemon remove the container; whether it confirmed that it
    is gone (or going: auto_remove's removal in progress, after its exit)."""
    import docker

    try:
        client.api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        return True  # auto_remove was quicker
    except docker.errors.APIError as exc:
        # 409 "removal already in progress" (auto_remove racing us) is fine
        if getattr(exc, "status_code", None) == 409:
            return True
        log.error("could not remove sandbox container %s: %s", container_id[:12], exc)
        return False
    except Exception as exc:  # daemon gone: gc removes it later (labels)
        log.error("could not remove sandbox container %s: %s", container_id[:12], exc)
        return False
    return True


def _discard_created(future: asyncio.Future[tuple[Any, str, str]]) -> None:
    """Remove a container whose creation finished after its caller gave up."""
    if future.cancelled() or future.exception() is not None:
        return
    client, container_id, _ = future.result()
    threading.Thread(target=_remove_container, args=(client, container_id), daemon=True).start()


def _cli_preexec(parent: int) -> None:
    """In the CLI's child, before exec: its own session; SIGTERM when the kernel dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the kernel died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class DockerSandbox(Sandbox, Configurable, metaclass=_Meta):
    """Run each sandbox in a hardened Docker container (``--SandboxKernel.backend=docker``).

    Settings unset here come from the preset (when given), else from the
    environment (SANDBOX_DOCKER_IMAGE, SANDBOX_CPU_LIMIT, SANDBOX_MEMORY_LIMIT,
    SANDBOX_PIDS_LIMIT, SANDBOX_TMPFS_SIZE), else from ContainerConfig's defaults.
    """

    name = "docker"

    image = Unicode(
        None,
        allow_none=True,
        help="Docker image of the sandboxes (default: $SANDBOX_DOCKER_IMAGE, else sandbox-kernel:latest; "
        "build docker/Dockerfile). Nothing is pulled: the image must exist on the daemon.",
    ).tag(config=True)
    cpu_limit = Float(
        None,
        allow_none=True,
        help="CPU quota in cores (default: preset, else $SANDBOX_CPU_LIMIT, else 1.0); clamped to the daemon's CPU count.",
    ).tag(config=True)
    memory_limit = Unicode(
        None,
        allow_none=True,
        help="Memory of the whole container, e.g. '512m' or '2g', with no swap beyond it (default: preset, "
        "else $SANDBOX_MEMORY_LIMIT, else 512m). A cell that exceeds it is killed by the OOM killer "
        "(CellDied); earlier state survives. The /tmp tmpfs counts against it.",
    ).tag(config=True)
    pids_limit = Int(
        None,
        allow_none=True,
        help="Max processes and threads in the container (default: preset, else $SANDBOX_PIDS_LIMIT, else 256). "
        "The worker uses 3 or 4 of them.",
    ).tag(config=True)
    tmpfs_size = Unicode(
        None,
        allow_none=True,
        help="Size of the /tmp tmpfs, e.g. '64m' (default: preset, else $SANDBOX_TMPFS_SIZE, else 64m).",
    ).tag(config=True)
    user = Unicode(
        "",
        help="Numeric 'uid:gid' the sandbox runs as (never 0). Default: the kernel's own uid:gid when it "
        "is not root; a kernel running as root uses the workspace owner when that is not root, else "
        "65534:65534 (the workspace is never chowned: give it a non-root owner so cells can write it).",
    ).tag(config=True)
    preset = Unicode(
        "",
        help="Resource preset: low, medium, high or max (see docs/docker.md); the settings above override it.",
    ).tag(config=True)
    read_only_mounts = Dict(
        {},
        help="Extra host paths mounted read-only: {host_path: container_path}. The offline test image "
        "needs {'/usr': '/usr'} (it borrows the host's /usr).",
    ).tag(config=True)
    python = Unicode(
        "",
        help="Interpreter inside the container. Empty (default): the kernel's own interpreter, whose "
        "installation (venv and base prefix, when outside /usr) is mounted read-only at the same paths. "
        "Set e.g. 'python3' to use the image's Python, which then needs IPython (and cloudpickle).",
    ).tag(config=True)
    docker_cli = Unicode(
        "docker",
        help="The Docker command-line client used to attach to containers (name or path).",
    ).tag(config=True)
    start_timeout = Float(60.0, help="Seconds allowed for creating a container.").tag(config=True)

    def __init__(self, parent: Any = None, client: Any = None, **kwargs: Any) -> None:
        if parent is None and "config" not in kwargs and Application.initialized():
            # get_sandbox("docker") is called without a parent: still honour
            # --DockerSandbox.* given to the running application (the kernel).
            kwargs["config"] = Application.instance().config
        super().__init__(parent=parent, **kwargs)
        self._client = client
        self._max_cpus: float | None = None
        #: containers whose stop could not be confirmed (no daemon, no kill
        #: from the host), by id: see ``ContainerProcess.stop``
        self._unstopped: dict[str, ContainerProcess] = {}

    def holder_facts(self) -> dict[str, Any] | None:
        """The daemon, this process and the kind of its containers: a cell can
        keep its container alive after the kernel dies (a write end of the
        worker's channel reopened through ``/proc/1/fd``, so no hang-up ever
        comes), so a rise after the kernel's death must find them and have
        the daemon remove them (``docker.orphans``; review r66)."""
        from sandbox_kernel.docker.names import LABEL_KIND
        from sandbox_kernel.docker.orphans import daemon_id, docker_facts

        self._checked_start_timeout()  # (the client's own timeout comes from it)
        daemon = daemon_id(self._connect())
        if not daemon:
            raise DockerSandboxError(
                "the Docker daemon does not say its ID: a container started now could not be found again by a rise "
                "if this kernel died"
            )
        return docker_facts(daemon, {LABEL_KIND: KIND})

    def unstopped(self) -> list[str]:
        """Containers this backend was asked to stop without a confirmation
        (the daemon did not answer and the host could not kill them): they
        may still run, with their network."""
        return list(self._unstopped)

    def _stop_earlier(self) -> None:
        """Before a new container: the earlier ones not confirmed stopped are
        tried again; one still unconfirmed refuses the start (it may run on,
        with its network, beside the workspace and state the new one mounts)."""
        left = [cid[:12] for cid, process in list(self._unstopped.items()) if not process.stop()]
        if left:
            raise DockerSandboxError(
                f"earlier sandbox container(s) {', '.join(left)} could not be stopped (the Docker daemon does not "
                "answer, and they cannot be killed from this host); no new sandbox starts until they are"
            )

    # ---- configuration ---------------------------------------------------------------
    def container_config(self) -> Any:
        """The :class:`ContainerConfig` these settings describe (validated)."""
        from sandbox_kernel.docker.config import ContainerConfig

        overrides: dict[str, Any] = {}
        for name in ("image", "cpu_limit", "memory_limit", "pids_limit", "tmpfs_size"):
            value = getattr(self, name)
            if value is not None:
                overrides[name] = value
        if self.user.strip():
            overrides["user"] = self.user.strip()
        # Checked here, not when configured: a bad value then shows in the cell
        # (SandboxUnavailable) instead of stopping the kernel from starting.
        try:
            if self.preset.strip():
                return ContainerConfig.from_preset(self.preset.strip(), **overrides)
            return ContainerConfig(**overrides)
        except ValueError as exc:
            # named as the user set it (--DockerSandbox.cpu_limit=...)
            raise DockerSandboxError(
                f"invalid DockerSandbox setting: {str(exc).replace('ContainerConfig.', 'DockerSandbox.')}"
            ) from exc

    def _checked_start_timeout(self) -> float:
        """``start_timeout`` as a finite number of seconds above zero: NaN
        made every start fail as if no daemon answered."""
        from sandbox_kernel.docker.config import _positive_float

        try:
            return _positive_float(self.start_timeout, "DockerSandbox.start_timeout", maximum=24 * 3600.0)
        except ValueError as exc:
            raise DockerSandboxError(f"invalid DockerSandbox setting: {exc}") from exc

    def _connect(self) -> Any:
        """The Docker client (made on first use) and the daemon's CPU count."""
        if self._client is None:
            import docker

            try:
                client = docker.from_env(timeout=max(30, int(self.start_timeout)))
                client.ping()
            except Exception as exc:
                raise DockerSandboxError(
                    f"no Docker daemon answers ({exc}); start one (scripts/ensure-docker.sh) "
                    "or point DOCKER_HOST at one"
                ) from exc
            self._client = client
        if self._max_cpus is None:
            try:
                self._max_cpus = float(self._client.info().get("NCPU") or 0) or None
            except Exception:
                self._max_cpus = None
        return self._client

    # ---- the container ---------------------------------------------------------------
    def labels(self, isolate_network: bool) -> dict[str, str]:
        from sandbox_kernel.docker import names
        from sandbox_kernel.privacy.modes import NetworkMode

        return {
            names.LABEL_MANAGED: "1",
            names.LABEL_KIND: KIND,
            names.LABEL_NETWORK: (NetworkMode.NONE if isolate_network else NetworkMode.FULL).value,
            names.LABEL_CREATED: names.utc_now_iso(),
            LABEL_SANDBOX: uuid.uuid4().hex,
            **names.owner_labels(),
        }

    def build_create_kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        """docker-py ``containers.create`` kwargs for ``spec`` (no Docker call except
        ``chown`` of the writable mounts when this process is root)."""
        from docker.types import Mount, Ulimit

        from sandbox_kernel.docker.hardening import (
            build_container_kwargs,
            check_read_only_mount,
            prepare_workspace,
            resolve_user,
        )
        from sandbox_kernel.privacy.modes import NetworkMode

        config = self.container_config()
        working_dir = spec.cwd or config.working_dir
        try:
            config = config.replace(working_dir=working_dir, environment={})
        except ValueError as exc:
            raise DockerSandboxError(f"invalid working directory {working_dir!r}: {exc}") from exc

        workspace: BindMount | None = None
        others: list[BindMount] = []
        for mount in spec.bind_mounts:
            if (
                workspace is None
                and not mount.readonly
                and mount.kind == "bind"
                and os.path.normpath(mount.target) == config.working_dir
            ):
                workspace = mount
            else:
                others.append(mount)
        # the workspace folder, also when the home rule mounts its top level read-only
        folder = workspace or next(
            (m for m in spec.bind_mounts if m.kind == "bind" and os.path.normpath(m.target) == config.working_dir), None
        )
        writable = [m for m in spec.bind_mounts if not m.readonly]
        if config.user:
            user = config.user
        elif os.geteuid() != 0:
            # the kernel's own ids: it made the state dir and can write the workspace
            user = f"{os.geteuid()}:{os.getegid() or os.geteuid()}"
        else:
            user = resolve_user(None, folder.source if folder else (writable[0].source if writable else None))
        if os.geteuid() == 0:
            # Only directories the engine made (its state dir) are handed to the
            # container user; the user's workspace (a notebook folder, and the
            # entries the home rule binds inside it) is never chowned or chmodded
            # behind their back.
            for mount in writable:
                inside = _within(os.path.normpath(mount.target), config.working_dir)
                if mount is not workspace and not inside and Path(mount.source).is_dir():
                    prepare_workspace(mount.source, user)
            # What it may only read (the egress proxy's socket folder, private
            # datasets), it is let read as bwrap's unprivileged uid is: an ACL
            # where the bits do not allow it, never an owner change.
            uid, _, gid = user.partition(":")
            for mount in others:
                if mount.readonly and mount.kind == "bind" and int(uid) != 0:
                    try:
                        grant(Path(mount.source), int(uid), int(gid or uid), write=False)
                    except AccessGrantError as exc:
                        raise DockerSandboxError(str(exc)) from exc
            if folder is not None and not _writable_by(Path(folder.source), user):
                log.warning(
                    "the workspace %s is not writable by the container user %s: give the folder that owner "
                    "or set --DockerSandbox.user",
                    folder.source,
                    user,
                )

        command = list(spec.command)
        read_only: list[tuple[str, str]] = [(str(src), str(tgt)) for src, tgt in self.read_only_mounts.items()]
        if self.python:
            if command and command[0] == sys.executable:
                command[0] = self.python
        else:
            read_only += [(str(root), str(root)) for root in python_roots()]

        try:
            kwargs = build_container_kwargs(
                config,
                network_mode=NetworkMode.NONE if spec.isolate_network else NetworkMode.FULL,
                workspace=str(workspace.source) if workspace else None,
                user=user,
                labels=self.labels(spec.isolate_network),
                max_cpus=self._max_cpus,
            )
            mounts: list[Any] = kwargs["mounts"]
            taken = {m["Target"] for m in mounts}
            for mount in others:
                docker_mount = to_docker_mount(mount)
                mounts.append(docker_mount)
                taken.add(docker_mount["Target"])
            for src, tgt in read_only:
                src, tgt = check_read_only_mount(src, tgt)
                if tgt in taken:
                    continue
                mounts.append(Mount(target=tgt, source=src, type="bind", read_only=True))
                taken.add(tgt)
                # a private dataset's source inside it is hidden, as in a workspace
                # (docs/security.md, "Private dataset sources")
                mounts += [to_docker_mount(m) for m in hide_private_sources(Path(src), tgt)]
        except ValueError as exc:
            raise DockerSandboxError(f"refused to build the container: {exc}") from exc

        kwargs["environment"] = dict(spec.env)  # exactly the engine's environment
        if spec.own_init:
            # The worker's anchor is PID 1: a cell cannot SIGSTOP it (as it
            # can its holder, which would then never read its closed
            # channel), and it leaves when that channel hangs up.
            kwargs["init"] = False
        ulimits = list(kwargs["ulimits"])
        for name, value in (("nofile", spec.limits.open_files), ("fsize", spec.limits.file_size)):
            if value:
                ulimits.append(Ulimit(name=name, soft=value, hard=value))
        kwargs["ulimits"] = ulimits
        from sandbox_kernel.docker.config import container_prefix

        return {
            **kwargs,
            "command": command,
            "name": f"{container_prefix()}-kernel-{uuid.uuid4().hex[:12]}",
            "stdin_open": True,
            # docker-py sets StdinOnce only for a non-detached create: with it the
            # daemon closes the container's stdin when the CLI's attach ends (the
            # kernel died, so the CLI's stdin hit EOF, or the CLI itself died), and
            # the worker exits on the closed channel, whether or not the CLI got to
            # forward its SIGTERM. Nothing attaches here: the CLI does, on start.
            "detach": False,
            "auto_remove": True,
        }

    def _create(self, spec: SandboxSpec) -> tuple[Any, str, str]:
        import docker
        from sandbox_kernel.docker.hardening import join_sandbox_network

        client = self._connect()
        kwargs = self.build_create_kwargs(spec)
        try:
            kwargs = join_sandbox_network(client, kwargs)
            container = client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as exc:
            raise DockerSandboxError(
                f"the Docker image {kwargs['image']!r} does not exist on the daemon (nothing is pulled): "
                "build docker/Dockerfile or set --DockerSandbox.image"
            ) from exc
        except (docker.errors.DockerException, RuntimeError) as exc:
            raise DockerSandboxError(f"could not create the sandbox container: {exc}") from exc
        return client, container.id, kwargs["name"]

    async def start(self, spec: SandboxSpec) -> SandboxProcess:
        start_timeout = self._checked_start_timeout()
        cli = shutil.which(self.docker_cli)
        if not cli:
            raise DockerSandboxError(
                f"the Docker command-line client {self.docker_cli!r} is not installed "
                "(Debian/Ubuntu package 'docker.io' or 'docker-ce-cli')"
            )
        await asyncio.to_thread(self._stop_earlier)
        creation = asyncio.ensure_future(asyncio.to_thread(self._create, spec))
        try:
            client, container_id, name = await asyncio.wait_for(asyncio.shield(creation), start_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            # the thread still runs: remove the container it makes, never start it
            creation.add_done_callback(_discard_created)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise DockerSandboxError(f"creating the sandbox container took over {start_timeout:g} s") from exc
        env = {k: os.environ[k] for k in _CLI_ENV if k in os.environ}
        parent = os.getpid()
        try:
            process = await asyncio.create_subprocess_exec(
                cli,
                "start",
                "--attach",
                "--interactive",
                container_id,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd="/",
                start_new_session=True,
                preexec_fn=lambda: _cli_preexec(parent),
                limit=1 << 24,
            )
        except BaseException:
            await asyncio.to_thread(_remove_container, client, container_id)
            raise
        log.info("sandbox container %s (%s) started", name, container_id[:12])
        container = ContainerProcess(process, self.name, client, container_id, name, self._unstopped)
        container._tracking = asyncio.ensure_future(asyncio.to_thread(container.track_init, start_timeout))
        return container


__all__ = ["ContainerProcess", "DockerSandbox", "DockerSandboxError", "container_cgroup", "to_docker_mount"]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def to_docker_mount(mount: BindMount) -> Any:
    """A docker-py ``Mount`` for ``mount``; "hide" masks (workspace policy) become
    an empty read-only tmpfs (directory) or ``/dev/null`` (file). Raises
    ``ValueError`` for a mount the hardening refuses."""
    from docker.types import Mount

    from sandbox_kernel.docker.hardening import check_read_only_mount

    if mount.kind == "hide":
        _, tgt = check_read_only_mount("/dev/null", mount.target)
        if Path(mount.source).is_dir():
            return Mount(target=tgt, source=None, type="tmpfs", read_only=True, tmpfs_size=4096, tmpfs_mode=0o555)
        return Mount(target=tgt, source="/dev/null", type="bind", read_only=True)
    src, tgt = check_read_only_mount(str(mount.source), mount.target)
    return Mount(target=tgt, source=src, type="bind", read_only=mount.readonly)


def _writable_by(path: Path, user: str) -> bool:
    """Whether uid:gid ``user`` may write ``path`` by its owner/group/other bits."""
    import stat as stat_module

    uid, _, gid = user.partition(":")
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == int(uid):
        return bool(st.st_mode & stat_module.S_IWUSR)
    if st.st_gid == int(gid or uid):
        return bool(st.st_mode & stat_module.S_IWGRP)
    return bool(st.st_mode & stat_module.S_IWOTH)
