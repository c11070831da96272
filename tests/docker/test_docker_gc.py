"""Orphan removal by owner labels, and the offline image."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
from sandbox_kernel.docker import ContainerConfig, build_container_kwargs, remove_orphans
from sandbox_kernel.docker.image import IMAGE_LABEL, TEST_IMAGE, offline_mounts
from sandbox_kernel.docker.names import LABEL_OWNER_PID, LABEL_OWNER_START, container_labels
from sandbox_kernel.privacy.modes import NetworkMode

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _start(client: Any, image: str, labels: dict[str, str]) -> str:
    config = ContainerConfig(image=image, memory_limit="32m", pids_limit=16, read_only_mounts=offline_mounts())
    kwargs = build_container_kwargs(config, network_mode=NetworkMode.NONE, labels=labels)
    container = client.containers.create(command=["sleep", "infinity"], detach=True, **kwargs)
    container.start()
    return container.id


def _exists(client: Any, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
        return True
    except docker.errors.NotFound:
        return False


def test_gc_removes_orphans_only(docker_client: Any, test_image: str, ids: tuple[str, str]) -> None:
    user, session = ids
    orphan_labels = container_labels(user, session, kind="ephemeral", network="none")
    orphan_labels[LABEL_OWNER_PID] = str(_dead_pid())
    orphan_labels[LABEL_OWNER_START] = ""
    live_labels = container_labels(user, session + "-live", kind="ephemeral", network="none")
    orphan = _start(docker_client, test_image, orphan_labels)
    live = _start(docker_client, test_image, live_labels)
    try:
        dry = remove_orphans(docker_client, dry_run=True)
        assert orphan in {r.container_id for r in dry.removed} and _exists(docker_client, orphan)

        report = remove_orphans(docker_client)
        removed = {r.container_id: r.reason for r in report.removed}
        assert orphan in removed and "is gone" in removed[orphan]
        assert live not in removed
        assert not _exists(docker_client, orphan) and _exists(docker_client, live)
        assert "removed" in report.summary()

        # max_age takes even a live owner's container once it is old enough. A
        # dry run: a real one removes every managed container of the machine,
        # and removed those of the tests running beside this one (CI failures
        # of three other Docker tests: a container gone mid-command)
        report = remove_orphans(docker_client, max_age=0, dry_run=True)
        assert live in {r.container_id for r in report.removed} and _exists(docker_client, live)
    finally:
        for cid in (orphan, live):
            try:
                docker_client.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass


def test_gc_cli_dry_run(docker_client: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox_kernel.docker.gc", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("sandbox_kernel gc: would remove")


def test_offline_image_is_labelled(docker_client: Any, test_image: str) -> None:
    image = docker_client.images.get(test_image)
    assert test_image == TEST_IMAGE
    assert image.labels.get(IMAGE_LABEL) == "offline-test"
    assert image.attrs["Config"]["User"] == "65534:65534"
