"""Container settings: ``ContainerConfig``, resource presets and environment defaults.

Every default comes from an environment variable that is read when a config is
made (not when this module is imported), so a process can change them at run
time. A malformed value raises ``ValueError`` naming the variable.

========================  ===================================  =========================
variable                  meaning                              default
========================  ===================================  =========================
SANDBOX_DOCKER_IMAGE      image for new containers             ``sandbox-kernel:latest``
SANDBOX_CPU_LIMIT         CPU quota in cores (float > 0)       ``1.0``
SANDBOX_MEMORY_LIMIT      memory (= memory+swap), e.g. 512m    ``512m``
SANDBOX_PIDS_LIMIT        max processes/threads per container  ``256``
SANDBOX_TMPFS_SIZE        size of the /tmp tmpfs               ``64m``
SANDBOX_COMMAND_TIMEOUT   seconds per command (float > 0)      ``30``
SANDBOX_SESSION_TIMEOUT   idle seconds before a persistent     ``3600``
                          container is reaped
SANDBOX_CONTAINER_PREFIX  container name prefix                ``sandbox-kernel``
SANDBOX_WORKSPACE_ROOT    host dir holding workspaces          ``<data dir>/workspaces``
                          (data dir: SANDBOX_KERNEL_DATA_DIR,
                          else <jupyter data dir>/sandbox_kernel)
========================  ===================================  =========================
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox_kernel.privacy.modes import NetworkMode

ENV_IMAGE = "SANDBOX_DOCKER_IMAGE"
ENV_CPU_LIMIT = "SANDBOX_CPU_LIMIT"
ENV_MEMORY_LIMIT = "SANDBOX_MEMORY_LIMIT"
ENV_PIDS_LIMIT = "SANDBOX_PIDS_LIMIT"
ENV_TMPFS_SIZE = "SANDBOX_TMPFS_SIZE"
ENV_COMMAND_TIMEOUT = "SANDBOX_COMMAND_TIMEOUT"
ENV_SESSION_TIMEOUT = "SANDBOX_SESSION_TIMEOUT"
ENV_CONTAINER_PREFIX = "SANDBOX_CONTAINER_PREFIX"
ENV_WORKSPACE_ROOT = "SANDBOX_WORKSPACE_ROOT"

DEFAULT_IMAGE = "sandbox-kernel:latest"
DEFAULT_CPU_LIMIT = 1.0
DEFAULT_MEMORY_LIMIT = "512m"
DEFAULT_PIDS_LIMIT = 256
DEFAULT_TMPFS_SIZE = "64m"
DEFAULT_COMMAND_TIMEOUT = 30.0
DEFAULT_SESSION_TIMEOUT = 3600.0
DEFAULT_CONTAINER_PREFIX = "sandbox-kernel"

#: Docker refuses memory limits under 6 MiB.
MIN_MEMORY_BYTES = 6 * 1024 * 1024

_MEMORY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([bkmg]?)(?:i?b)?", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_USER_RE = re.compile(r"(\d+)(?::(\d+))?")
_MAX_TIMEOUT = 7 * 24 * 3600.0


# ---------------------------------------------------------------- parsing helpers


def parse_memory(value: object, what: str) -> int:
    """Bytes in a Docker-style size (``512m``, ``1g``, ``1.5G``, ``64MiB``, ``1048576``).

    Raises ``ValueError`` naming ``what`` when the value is malformed or below 6 MiB
    for memory limits (callers decide the minimum through :func:`memory_bytes`).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{what} must be a size like '512m', got {type(value).__name__}")
    text = str(value).strip()
    match = _MEMORY_RE.fullmatch(text)
    if not match:
        raise ValueError(
            f"{what}={value!r} is not a size: use a number with an optional unit b, k, m or g (e.g. '512m', '1g')"
        )
    number = float(match.group(1))
    result = int(number * _MEMORY_UNITS[match.group(2).lower()])
    if result <= 0:
        raise ValueError(f"{what}={value!r} must be greater than zero")
    return result


#: Docker's smallest CPU quota (``--cpus``): a smaller one rounded to
#: ``NanoCpus=0``, which means no limit at all, or failed in the OCI runtime
MIN_CPUS = 0.01
#: the kernel's highest ``pid_max`` (64-bit): a larger pids limit limits
#: nothing, and one past int64 was an anonymous daemon error (HTTP 500)
MAX_PIDS = 4194304


def _positive_float(value: object, what: str, *, maximum: float | None = None, minimum: float | None = None) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got a bool")
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r} is not a number") from None
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"{what}={value!r} must be a finite number greater than zero")
    if maximum is not None and result > maximum:
        raise ValueError(f"{what}={value!r} is too large (at most {maximum:g})")
    if minimum is not None and result < minimum:
        raise ValueError(f"{what}={value!r} is too small (at least {minimum:g})")
    return result


def _positive_int(value: object, what: str, *, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got a bool")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"\d+", text):
            raise ValueError(f"{what}={value!r} is not a positive integer")
        value = int(text)
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what}={value!r} must be a positive integer")
    if maximum is not None and value > maximum:
        raise ValueError(f"{what}={value!r} is too large (at most {maximum})")
    return value


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_float(name: str, default: float, *, maximum: float | None = None) -> float:
    """A positive float from environment variable ``name`` (errors name the variable)."""
    raw = _env(name)
    if raw is None:
        return default
    return _positive_float(raw, f"environment variable {name}", maximum=maximum)


def env_int(name: str, default: int) -> int:
    """A positive integer from environment variable ``name``."""
    raw = _env(name)
    if raw is None:
        return default
    return _positive_int(raw, f"environment variable {name}")


def env_memory(name: str, default: str) -> str:
    """A size string from environment variable ``name``, validated, returned as given."""
    raw = _env(name)
    if raw is None:
        return default
    size = parse_memory(raw, f"environment variable {name}")
    if name == ENV_MEMORY_LIMIT and size < MIN_MEMORY_BYTES:
        raise ValueError(f"environment variable {name}={raw!r} is below Docker's minimum of 6m")
    return raw


def validate_prefix(value: object, what: str = "container prefix") -> str:
    if not isinstance(value, str) or not _PREFIX_RE.fullmatch(value):
        raise ValueError(
            f"{what}={value!r} is invalid: 1-64 characters of [A-Za-z0-9_.-] starting with a letter or digit"
        )
    return value


# ------------------------------------------------------------- default readers


def default_image() -> str:
    raw = _env(ENV_IMAGE)
    if raw is None:
        return DEFAULT_IMAGE
    if any(c.isspace() for c in raw):
        raise ValueError(f"environment variable {ENV_IMAGE}={raw!r} contains whitespace")
    return raw


def default_cpu_limit() -> float:
    return env_float(ENV_CPU_LIMIT, DEFAULT_CPU_LIMIT, maximum=1024)


def default_memory_limit() -> str:
    return env_memory(ENV_MEMORY_LIMIT, DEFAULT_MEMORY_LIMIT)


def default_pids_limit() -> int:
    return env_int(ENV_PIDS_LIMIT, DEFAULT_PIDS_LIMIT)


def default_tmpfs_size() -> str:
    return env_memory(ENV_TMPFS_SIZE, DEFAULT_TMPFS_SIZE)


def default_command_timeout() -> float:
    return env_float(ENV_COMMAND_TIMEOUT, DEFAULT_COMMAND_TIMEOUT, maximum=_MAX_TIMEOUT)


def session_timeout() -> float:
    """Idle seconds after which a persistent container is reaped (SANDBOX_SESSION_TIMEOUT)."""
    return env_float(ENV_SESSION_TIMEOUT, DEFAULT_SESSION_TIMEOUT, maximum=365 * 24 * 3600.0)


def container_prefix() -> str:
    raw = _env(ENV_CONTAINER_PREFIX)
    if raw is None:
        return DEFAULT_CONTAINER_PREFIX
    return validate_prefix(raw, f"environment variable {ENV_CONTAINER_PREFIX}")


def default_workspace_root() -> Path:
    """Host directory under which ``<user_id>/<session_id>`` workspaces are made."""
    raw = _env(ENV_WORKSPACE_ROOT)
    if raw is not None:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise ValueError(f"environment variable {ENV_WORKSPACE_ROOT}={raw!r} must be an absolute path")
        return path
    # Next to the privacy store: $SANDBOX_KERNEL_DATA_DIR, else <jupyter data dir>/sandbox_kernel.
    data_dir = _env("SANDBOX_KERNEL_DATA_DIR")
    if data_dir is not None:
        return Path(data_dir).expanduser().absolute() / "workspaces"
    try:
        from jupyter_core.paths import jupyter_data_dir
    except ImportError:  # jupyter_core comes with ipykernel; this is a fallback only
        xdg = _env("XDG_DATA_HOME")
        base = Path(xdg) if xdg else Path.home() / ".local" / "share"
        return base / "sandbox_kernel" / "workspaces"
    return Path(jupyter_data_dir()).absolute() / "sandbox_kernel" / "workspaces"


def validate_user(value: object, what: str = "ContainerConfig.user") -> str:
    """A numeric, non-root ``uid[:gid]``. Names are refused: they depend on the image."""
    if not isinstance(value, str) or not _USER_RE.fullmatch(value.strip()):
        raise ValueError(
            f"{what}={value!r} is invalid: give a numeric 'uid:gid' (e.g. '1000:1000'); "
            "user names are resolved inside the image and are not accepted"
        )
    match = _USER_RE.fullmatch(value.strip())
    assert match
    uid = int(match.group(1))
    gid = int(match.group(2)) if match.group(2) is not None else uid
    if uid == 0 or gid == 0:
        raise ValueError(f"{what}={value!r} is invalid: the sandbox never runs as root (uid/gid 0)")
    return f"{uid}:{gid}"


def coerce_network_mode(value: object, what: str = "network_mode") -> NetworkMode:
    if isinstance(value, NetworkMode):
        return value
    if isinstance(value, str):
        for mode in NetworkMode:
            if value.lower() in (mode.value, mode.name.lower()):
                return mode
    raise ValueError(
        f"{what}={value!r} is invalid: use one of "
        + ", ".join(f"NetworkMode.{m.name} ({m.value!r})" for m in NetworkMode)
    )


# --------------------------------------------------------------------- presets


@dataclass(frozen=True)
class ResourcePreset:
    """Resource numbers of a preset (CPU/memory/timeout are seed 004's)."""

    cpu_limit: float
    memory_limit: str
    command_timeout: float
    pids_limit: int
    tmpfs_size: str


PRESETS: dict[str, ResourcePreset] = {
    "low": ResourcePreset(0.5, "256m", 30.0, 64, "32m"),
    "medium": ResourcePreset(1.0, "512m", 60.0, 128, "64m"),
    "high": ResourcePreset(2.0, "1g", 120.0, 256, "128m"),
    "max": ResourcePreset(4.0, "2g", 300.0, 512, "256m"),
}


# ------------------------------------------------------------------- the config


@dataclass
class ContainerConfig:
    """Settings of one sandbox container.

    ``user=None`` means *automatic*: the numeric owner of the session's workspace
    directory when that is not root, else ``65534:65534`` (nobody), in which case the
    manager (running as root) hands the workspace directory to 65534. See
    :func:`sandbox_kernel.docker.hardening.resolve_user`.
    """

    image: str = field(default_factory=default_image)
    cpu_limit: float = field(default_factory=default_cpu_limit)
    memory_limit: str = field(default_factory=default_memory_limit)
    pids_limit: int = field(default_factory=default_pids_limit)
    working_dir: str = "/workspace"
    network_mode: NetworkMode = NetworkMode.FULL
    read_only_mounts: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    tmpfs_size: str = field(default_factory=default_tmpfs_size)
    command_timeout: float = field(default_factory=default_command_timeout)

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image.strip() or any(c.isspace() for c in self.image):
            raise ValueError(f"ContainerConfig.image={self.image!r} must be a non-empty image reference")
        self.cpu_limit = _positive_float(self.cpu_limit, "ContainerConfig.cpu_limit", maximum=1024, minimum=MIN_CPUS)
        if parse_memory(self.memory_limit, "ContainerConfig.memory_limit") < MIN_MEMORY_BYTES:
            raise ValueError(f"ContainerConfig.memory_limit={self.memory_limit!r} is below Docker's minimum of 6m")
        self.memory_limit = str(self.memory_limit).strip()
        self.pids_limit = _positive_int(self.pids_limit, "ContainerConfig.pids_limit", maximum=MAX_PIDS)
        parse_memory(self.tmpfs_size, "ContainerConfig.tmpfs_size")
        self.tmpfs_size = str(self.tmpfs_size).strip()
        self.command_timeout = _positive_float(
            self.command_timeout, "ContainerConfig.command_timeout", maximum=_MAX_TIMEOUT
        )
        wd = self.working_dir
        if not isinstance(wd, str) or not wd.startswith("/") or wd.rstrip("/") == "" or ".." in wd.split("/"):
            raise ValueError(f"ContainerConfig.working_dir={wd!r} must be an absolute path other than '/'")
        self.working_dir = os.path.normpath(wd)
        self.network_mode = coerce_network_mode(self.network_mode, "ContainerConfig.network_mode")
        if not isinstance(self.read_only_mounts, Mapping):
            raise ValueError("ContainerConfig.read_only_mounts must be a dict {host_path: container_path}")
        self.read_only_mounts = {str(k): str(v) for k, v in self.read_only_mounts.items()}
        if self.user is not None:
            self.user = validate_user(self.user)
        if not isinstance(self.environment, Mapping):
            raise ValueError("ContainerConfig.environment must be a dict of strings")
        env: dict[str, str] = {}
        for key, value in self.environment.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"ContainerConfig.environment: invalid variable name {key!r}")
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(f"ContainerConfig.environment[{key!r}] must be a string without NUL")
            env[key] = value
        self.environment = env

    # -- helpers -------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory_limit, "ContainerConfig.memory_limit")

    @property
    def nano_cpus(self) -> int:
        return round(self.cpu_limit * 1e9)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ContainerConfig:
        """A config with preset ``name``'s resources (low, medium, high, max).

        Keyword overrides win over the preset; fields neither in the preset nor
        overridden come from the environment defaults.
        """
        key = name.lower() if isinstance(name, str) else name
        if key not in PRESETS:
            raise ValueError(f"preset {name!r} is unknown: choose one of {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ContainerConfig field(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = dataclasses.asdict(PRESETS[key])
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> ContainerConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)
