from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel

from sandbox_kernel.privacy.store import DATA_DIR_ENV

_FOLDER_MARKS = {"docker": pytest.mark.docker, "browser": pytest.mark.browser}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by folder (tests/docker, tests/browser), so ``-m`` selects them."""
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        mark = _FOLDER_MARKS.get(folder)
        if mark is not None:
            item.add_marker(mark)


@pytest.fixture(scope="session", autouse=True)
def _data_dir_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's own default data dir (``$SANDBOX_KERNEL_DATA_DIR``), unless the
    caller set one: tests make stores by the hundred in temporary folders, and
    each registers itself in the default data dir's registry
    (privacy/store_registry.py), which every sandbox start on the machine
    reads. Kernels started by kernel_helpers get a data dir of their own anyway."""
    if os.environ.get(DATA_DIR_ENV):
        yield
        return
    os.environ[DATA_DIR_ENV] = str(tmp_path_factory.mktemp("sk-data"))
    try:
        yield
    finally:
        os.environ.pop(DATA_DIR_ENV, None)


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host of its own for code that reads the host's places: home, Jupyter dirs and the default data dir under ``tmp_path/h``."""
    home = tmp_path / "h"
    home.mkdir()
    for name, value in {
        "HOME": home,
        "JUPYTER_CONFIG_DIR": home / "jc",
        "JUPYTER_DATA_DIR": home / "jd",
        "JUPYTER_RUNTIME_DIR": home / "jr",
        "IPYTHONDIR": home / "ipy",
        "SANDBOX_KERNEL_DATA_DIR": home / "sk",
    }.items():
        monkeypatch.setenv(name, str(value))
    return home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxKernelHandle]:
    """One bwrap kernel shared by a test module (starting one costs ~1 s)."""
    handle = bwrap_kernel(tmp_path_factory.mktemp("kernel"), "--SandboxKernel.network=full")
    yield handle
    handle.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path: Path) -> Iterator[SandboxKernelHandle]:
    handle = bwrap_kernel(tmp_path, "--SandboxKernel.network=full")
    yield handle
    handle.shutdown()
