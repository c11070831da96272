from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kernel_helpers import require_bwrap

from sandbox_kernel.tools import SessionRegistry, ToolsConfig, set_registry


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    require_bwrap()
    path = tmp_path / "data"
    path.mkdir()
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(path))
    return path


@pytest_asyncio.fixture
async def registry(data_dir: Path) -> AsyncIterator[SessionRegistry]:
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600))
    set_registry(reg)
    try:
        yield reg
    finally:
        await reg.aclose()
        set_registry(None)
