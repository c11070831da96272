"""The containers of a dead holder stay visible to a rise (guarantee 11).

A process that holds Docker containers with a network (a ``SandboxManager``)
reports itself in the privacy store's enforcement records keyed by its pid
(``privacy/enforcement.py``). Killed (SIGKILL, an OOM kill, an embedder's
SIGTERM), it removes nothing: its containers run on, on the bridge network,
with the workspace mounted read-write. Its record used to be dropped as soon
as its pid was gone, so a rise's ``wait=True`` found no holder and returned
at once while the orphan kept its network beside the private data.

The record therefore carries :func:`docker_facts`: which daemon, which
process (pid and start time) and which labels its containers bear. A rise
that meets the record of a dead holder removes, through the daemon, every
container with those labels (:func:`remove_dead_holders_containers`) and
counts the holder as gone only once the daemon has confirmed that none is
left. When that cannot be confirmed (no daemon answers, another daemon,
another host) the holder stays pending: the rise waits and then refuses,
failing closed, rather than hand the data over beside a networked orphan.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .names import LABEL_MANAGED, LABEL_OWNER_PID, LABEL_OWNER_START, host_name, process_start_time

log = logging.getLogger(__name__)

#: seconds a rise waits for the daemon per call (its own wait is bounded too)
DAEMON_TIMEOUT = 5


def daemon_id(client: Any) -> str:
    """The daemon's ID (``docker info``), "" when it does not answer: a record
    without one cannot be checked, so a rise after its holder's death waits."""
    try:
        return str(client.info().get("ID") or "")
    except Exception as exc:  # recorded as unknown: fails closed later
        log.debug("the Docker daemon's ID is unknown: %s", exc)
        return ""


def docker_facts(daemon: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """What a holder record says about its containers: this process (its
    start time tells a reused pid apart), this host, the daemon and the labels
    every container of the holder carries besides the owner's."""
    return {
        "daemon": daemon,
        "host": host_name(),
        "owner_start": process_start_time(os.getpid()) or "",
        "labels": dict(labels),
    }


def remove_dead_holders_containers(pid: int, facts: object) -> str | None:
    """Remove every container the dead holder ``pid`` left (its record's
    ``facts``). None once the daemon confirmed that none is left, else why it
    could not (the holder then still counts as one with network)."""
    if not isinstance(facts, dict) or not isinstance(facts.get("labels"), dict):
        return "its record of Docker containers is unreadable"
    if facts.get("host") != host_name():
        return f"its containers are on host {facts.get('host')!r}, not this one"
    try:
        import docker

        client = docker.from_env(timeout=DAEMON_TIMEOUT)
    except Exception as exc:
        return f"no Docker daemon answers to remove its containers ({exc})"
    try:
        return _remove_matching(client, pid, facts)
    except Exception as exc:  # not answering, refusing: not confirmed
        return f"its containers could not be removed ({exc})"
    finally:
        client.close()


def _remove_matching(client: Any, pid: int, facts: dict[str, Any]) -> str | None:
    import docker

    wanted = str(facts.get("daemon") or "")
    if not wanted or daemon_id(client) != wanted:
        return "its containers are on a Docker daemon this process does not reach"
    filters = [f"{LABEL_MANAGED}=1", f"{LABEL_OWNER_PID}={pid}"]
    filters += [f"{k}={v}" for k, v in facts["labels"].items() if isinstance(k, str) and isinstance(v, str)]
    start = str(facts.get("owner_start") or "")
    left = []
    for info in client.api.containers(all=True, filters={"label": filters}):
        labels = info.get("Labels") or {}
        if start and labels.get(LABEL_OWNER_START, "") not in ("", start):
            continue  # another process that had the same pid
        try:
            client.api.remove_container(info["Id"], force=True, v=True)
            log.warning("removed container %s left with its network by dead process %d", info["Id"][:12], pid)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # "removal in progress" too: confirmed at the next look
            left.append(f"{info['Id'][:12]} ({exc})")
    return f"its containers {', '.join(left)} could not be removed" if left else None
