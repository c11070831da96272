"""Remove orphaned sandbox containers.

A container is ours when it carries ``sandbox_kernel.managed=1``. It is an orphan
when the process that created it is certainly gone: the owner labels name this
host and its pid no longer runs (or now belongs to another process, or the host
rebooted since). With ``max_age`` (seconds), managed containers older than that
are removed as well, whoever owns them. Containers owned by a process on another
host are left alone unless ``max_age`` says otherwise.

Command line::

    python -m sandbox_kernel.docker.gc [--max-age SECONDS] [--dry-run]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from .names import LABEL_SESSION, LABEL_USER, MANAGED_FILTER, age_seconds, owner_status


@dataclass
class Removed:
    container_id: str
    name: str
    reason: str


@dataclass
class GCReport:
    removed: list[Removed] = field(default_factory=list)
    kept: int = 0
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"sandbox_kernel gc: {verb} {len(self.removed)} container(s), kept {self.kept}"]
        for item in self.removed:
            lines.append(f"  {item.name} [{item.container_id[:12]}]: {item.reason}")
        for err in self.errors:
            lines.append(f"  error: {err}")
        return "\n".join(lines)


def orphan_reason(labels: dict[str, str], max_age: float | None = None, now: float | None = None) -> str | None:
    """Why a managed container with ``labels`` should go, or None to keep it."""
    alive, why = owner_status(labels)
    if alive is False:
        return why
    if max_age is not None:
        age = age_seconds(labels, now)
        if age is not None and age > max_age:
            return f"older than {max_age:g} s ({age:.0f} s)"
    return None


def remove_orphans(client: Any = None, max_age: float | None = None, *, dry_run: bool = False) -> GCReport:
    """Remove managed containers whose owner process is gone (or older than ``max_age``)."""
    import docker

    if client is None:
        client = docker.from_env()
    if max_age is not None and (isinstance(max_age, bool) or float(max_age) < 0):
        raise ValueError(f"max_age={max_age!r} must be a number of seconds >= 0")
    report = GCReport(dry_run=dry_run)
    for info in client.api.containers(all=True, filters=MANAGED_FILTER):
        labels = info.get("Labels") or {}
        cid = info["Id"]
        name = (info.get("Names") or [cid[:12]])[0].lstrip("/")
        reason = orphan_reason(labels, max_age)
        if reason is None:
            report.kept += 1
            continue
        reason = f"{reason} (user {labels.get(LABEL_USER, '?')}, session {labels.get(LABEL_SESSION, '?')})"
        if not dry_run:
            try:
                client.api.remove_container(cid, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                report.errors.append(f"{name}: {exc}")
                continue
        report.removed.append(Removed(cid, name, reason))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_kernel.docker.gc",
        description="Remove sandbox containers whose owning process is gone.",
    )
    parser.add_argument(
        "--max-age",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also remove managed containers older than this, whoever owns them",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")
    args = parser.parse_args(argv)
    try:
        report = remove_orphans(max_age=args.max_age, dry_run=args.dry_run)
    except Exception as exc:  # daemon down, bad DOCKER_HOST, ...
        print(f"sandbox_kernel gc: cannot talk to Docker: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 1 if report.errors else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
