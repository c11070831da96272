from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, bwrap_kernel

_FOLDER_MARKS = {"docker": pytest.mark.docker, "browser": pytest.mark.browser}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by folder (tests/docker, tests/browser), so ``-m`` selects them."""
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        mark = _FOLDER_MARKS.get(folder)
        if mark is not None:
            item.add_marker(mark)


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
