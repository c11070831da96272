"""Id validation, container names and the labels that mark our containers.

Names and labels are built only from validated ids. The owner labels let
``sandbox_kernel.docker.gc`` tell an orphan (its host process is gone) from a
container some live process still uses.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from datetime import datetime, timezone

# One id rule for the whole project; re-exported for the Docker code.
from ..privacy.identity import validate_id

LABEL_PREFIX = "sandbox_kernel."
LABEL_MANAGED = "sandbox_kernel.managed"
LABEL_USER = "sandbox_kernel.user"
LABEL_SESSION = "sandbox_kernel.session"
LABEL_OWNER_PID = "sandbox_kernel.owner_pid"
LABEL_OWNER_START = "sandbox_kernel.owner_start"  # start time of the owner pid (pid reuse)
LABEL_OWNER_HOST = "sandbox_kernel.owner_host"  # hostname of the owner process
LABEL_OWNER_BOOT = "sandbox_kernel.owner_boot"  # boot id: a reboot kills every owner
LABEL_CREATED = "sandbox_kernel.created"  # ISO 8601 UTC
LABEL_KIND = "sandbox_kernel.kind"  # "ephemeral" | "persistent" | other users' kinds
LABEL_NETWORK = "sandbox_kernel.network"  # NetworkMode value at creation

MANAGED_FILTER = {"label": f"{LABEL_MANAGED}=1"}


def validate_ids(user_id: object, session_id: object) -> tuple[str, str]:
    return validate_id(user_id, "user_id"), validate_id(session_id, "session_id")


def container_name(prefix: str, user_id: str, session_id: str, *, ephemeral: bool = False) -> str:
    """``<prefix>-<user>-<session>``, plus ``-<hash12>`` when an id contains
    ``-``, plus ``-<uuid8>`` for ephemeral containers.

    Ids may contain ``-``, so ``alice-x``/``s`` and ``alice``/``x-s`` would
    both read ``alice-x-s``: one user's session would be refused, or its
    container taken for the other's stale one. The hash (of the exact pair)
    tells such pairs apart: after the prefix a name without hash has one ``-``
    (two when ephemeral) and a name with one has at least three; a hashed
    persistent name ends in 12 hex digits, an ephemeral one in ``-<8 hex>``;
    two pairs split from the same text differ in their hash (48 bits; the
    other splits of one pair's text are few and fixed, so no search finds
    one). Should two names still meet, the manager checks the labels and
    never takes another pair's container.
    Names of ids without ``-`` are the same as before.
    """
    user_id, session_id = validate_ids(user_id, session_id)
    name = f"{prefix}-{user_id}-{session_id}"
    if "-" in user_id or "-" in session_id:
        name += f"-{pair_hash(user_id, session_id)}"
    if ephemeral:
        name += f"-{uuid.uuid4().hex[:8]}"
    return name


def pair_hash(user_id: str, session_id: str) -> str:
    """12 hex digits of the exact ``(user_id, session_id)`` pair (``/`` is in
    neither id, so the joined text names one pair only)."""
    return hashlib.sha256(f"{user_id}/{session_id}".encode()).hexdigest()[:12]


# ---------------------------------------------------------------- owner identity


def process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return rest[19]  # field 22 overall
    except IndexError:
        return None


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def host_name() -> str:
    return socket.gethostname()


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(value: str) -> float | None:
    """Epoch seconds of a ``LABEL_CREATED`` value, None if unparsable."""
    try:
        text = value[:-1] + "+00:00" if value.endswith("Z") else value
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, TypeError, AttributeError):
        return None


def owner_labels() -> dict[str, str]:
    """Labels identifying this process as the owner of a container."""
    pid = os.getpid()
    return {
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_START: process_start_time(pid) or "",
        LABEL_OWNER_HOST: host_name(),
        LABEL_OWNER_BOOT: boot_id(),
    }


def container_labels(
    user_id: str, session_id: str, *, kind: str, network: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """All labels of a new managed container."""
    user_id, session_id = validate_ids(user_id, session_id)
    labels = {
        LABEL_MANAGED: "1",
        LABEL_USER: user_id,
        LABEL_SESSION: session_id,
        LABEL_CREATED: utc_now_iso(),
        LABEL_KIND: kind,
        LABEL_NETWORK: network,
        **owner_labels(),
    }
    if extra:
        labels.update(extra)
    return labels


def owner_status(labels: dict[str, str]) -> tuple[bool | None, str]:
    """Is the owner of a container with ``labels`` alive?

    Returns ``(True, why)`` when it runs, ``(False, why)`` when it is certainly gone,
    ``(None, why)`` when this host cannot tell (another host, unlabelled).
    """
    host = labels.get(LABEL_OWNER_HOST)
    pid_text = labels.get(LABEL_OWNER_PID, "")
    if not host or not pid_text.isdigit():
        return None, "no owner labels"
    if host != host_name():
        return None, f"owned by a process on host {host!r}"
    boot = labels.get(LABEL_OWNER_BOOT, "")
    mine = boot_id()
    if boot and mine and boot != mine:
        return False, "the owner's host has rebooted since"
    pid = int(pid_text)
    if pid <= 0:
        return None, "bad owner pid"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, f"owner pid {pid} is gone"
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return None, f"cannot check owner pid {pid}"
    started = labels.get(LABEL_OWNER_START, "")
    now_started = process_start_time(pid)
    if started and now_started and started != now_started:
        return False, f"owner pid {pid} was reused by another process"
    return True, f"owner pid {pid} is alive"


def age_seconds(labels: dict[str, str], now: float | None = None) -> float | None:
    created = parse_iso(labels.get(LABEL_CREATED, ""))
    if created is None:
        return None
    return (time.time() if now is None else now) - created
