"""Fixtures for the Docker tests: a real daemon, an offline image, managers.

No daemon answering: ``scripts/ensure-docker.sh`` is run (as root it installs
docker.io if needed and starts dockerd; a daemon it started is stopped again at
the end, by its pid). Still none: the tests skip, or fail under ``CI=true``.

Nothing is pulled: the image is imported from a rootfs made in memory and
borrows the host's /usr read-only. Every container a test makes carries this
process's pid as owner label; whatever is left at the end is removed by id.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.privacy.modes import NetworkMode

REPO = Path(__file__).resolve().parents[2]
ENSURE_DOCKER = REPO / "scripts" / "ensure-docker.sh"
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")

try:
    import docker  # noqa: F401  (the SDK: sandbox_kernel[docker], a test dependency)
except ImportError:
    if IN_CI:
        raise
    import warnings

    warnings.warn("the docker SDK is not installed: tests/docker is not collected", stacklevel=1)
    #: no module here can import what it tests without the SDK
    collect_ignore_glob = ["test_*.py"]

#: Small limits so the tests are quick and cannot hurt the host.
TEST_LIMITS: dict[str, Any] = {
    "cpu_limit": 1.0,
    "memory_limit": "128m",
    "pids_limit": 64,
    "tmpfs_size": "16m",
    "command_timeout": 20,
}


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"Docker is required under CI=true: {message}")
    pytest.skip(message)


def _connect() -> tuple[Any, str]:
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a test dependency
        return None, f"the docker SDK is not installed ({exc}); pip install 'sandbox_kernel[docker]'"
    try:
        client = docker.from_env(timeout=60)
        client.ping()
        return client, ""
    except Exception as exc:
        return None, f"no Docker daemon answers: {exc}"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    client, why = _connect()
    started_pid: int | None = None
    if client is None and "SDK is not installed" not in why:
        try:
            proc = subprocess.run(["bash", str(ENSURE_DOCKER)], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why += f"; ensure-docker.sh failed: {exc}"
        else:
            found = re.search(r"^SANDBOX_DOCKERD_PID=(\d+)$", proc.stdout, re.MULTILINE)
            started_pid = int(found.group(1)) if found else None
            client, why_after = _connect()
            if client is None:
                why = f"{why_after}; ensure-docker.sh exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
    if client is None:
        _unavailable(why)
    try:
        yield client
    finally:
        _remove_our_containers(client)
        client.close()
        if started_pid is not None:  # stop only the daemon we started, by its pid
            try:
                os.kill(started_pid, signal.SIGTERM)
                for _ in range(60):
                    os.kill(started_pid, 0)
                    time.sleep(0.5)
            except ProcessLookupError:
                pass


def _remove_our_containers(client: Any) -> None:
    """Remove, by id, any container whose owner label is this test process."""
    from sandbox_kernel.docker.names import LABEL_OWNER_PID

    try:
        leftovers = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"})
    except Exception:
        return
    for info in leftovers:
        try:
            client.api.remove_container(info["Id"], force=True, v=True)
        except Exception:
            pass


@pytest.fixture(scope="session")
def test_image(docker_client: Any) -> Iterator[str]:
    """The offline image; removed (by id) at the end if this session built it."""
    import docker
    from sandbox_kernel.docker.image import TEST_IMAGE, ensure_test_image

    try:
        docker_client.images.get(TEST_IMAGE)
        built = False
    except docker.errors.ImageNotFound:
        built = True
    tag = ensure_test_image(docker_client)
    image_id = docker_client.images.get(tag).id
    yield tag
    # Under pytest-xdist each worker has its own session: the worker that built
    # the image ends while another may still use it, so workers keep it.
    if built and not os.environ.get("PYTEST_XDIST_WORKER"):
        _remove_our_containers(docker_client)
        try:
            docker_client.images.remove(image_id, force=True)
        except docker.errors.ImageNotFound:
            pass


class ModeSwitch:
    """A ``network_mode_getter`` the test can turn: ``switch.mode = NetworkMode.NONE``."""

    def __init__(self) -> None:
        self.mode: NetworkMode = NetworkMode.FULL
        self.calls: list[tuple[str, str]] = []

    def __call__(self, user_id: str, session_id: str) -> NetworkMode:
        self.calls.append((user_id, session_id))
        return self.mode


@pytest.fixture
def test_limits() -> dict[str, Any]:
    return dict(TEST_LIMITS)


@pytest.fixture
def mode_switch() -> ModeSwitch:
    return ModeSwitch()


@pytest.fixture
def ids() -> tuple[str, str]:
    """A unique (user_id, session_id) so concurrent runs never share names."""
    tag = uuid.uuid4().hex[:10]
    return f"u{tag}", f"s{tag}"


@pytest.fixture
def make_manager(
    docker_client: Any, test_image: str, tmp_path: Path, mode_switch: ModeSwitch
) -> Iterator[Callable[..., Any]]:
    """``make_manager(**config_overrides, manager_kwargs=...)`` -> SandboxManager."""
    from sandbox_kernel.docker import SandboxManager, offline_config

    managers: list[Any] = []

    def make(
        *,
        read_only_mounts: dict[str, str] | None = None,
        manager_kwargs: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Any:
        config = offline_config(image=test_image, **{**TEST_LIMITS, **overrides})
        manager = SandboxManager(
            read_only_mounts=read_only_mounts,
            config=config,
            workspace_root=tmp_path / "workspaces",
            network_mode_getter=mode_switch,
            **{"client": docker_client, **(manager_kwargs or {})},
        )
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close_all()


@pytest.fixture
def manager(make_manager: Callable[..., Any]) -> Any:
    return make_manager()


@pytest.fixture
def list_managed(docker_client: Any) -> Callable[..., list[dict[str, Any]]]:
    """``list_managed(user=..., session=...)``: containers with those sandbox_kernel labels."""

    def listing(**labels: str) -> list[dict[str, Any]]:
        filters = ["sandbox_kernel.managed=1"] + [f"sandbox_kernel.{k}={v}" for k, v in labels.items()]
        return docker_client.api.containers(all=True, filters={"label": filters})

    return listing
