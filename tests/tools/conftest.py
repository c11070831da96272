from __future__ import annotations

import asyncio
import gc
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
        try:
            await asyncio.wait_for(asyncio.shield(reg.aclose()), CLOSE_WAIT)
        except asyncio.TimeoutError:
            pytest.fail(f"the registry did not close within {CLOSE_WAIT:g} s; its tasks wait at:\n{task_stacks()}")
        finally:
            set_registry(None)


#: a close that hangs fails the test, naming where every task waits (a CI run
#: hung at the close; pytest-timeout shows threads, not tasks)
CLOSE_WAIT = 150.0


def task_stacks() -> str:
    """Where each asyncio task of this loop waits: its chain of awaits,
    through async generators (``async with`` on a context manager)."""
    lines = []
    for task in asyncio.all_tasks():
        lines.append(f"{task.get_name()}:")
        step: object = task.get_coro()
        while step is not None:
            frame = (
                getattr(step, "cr_frame", None) or getattr(step, "ag_frame", None) or getattr(step, "gi_frame", None)
            )
            if frame is not None:
                lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            after = (
                getattr(step, "cr_await", None)
                or getattr(step, "ag_await", None)
                or getattr(step, "gi_yieldfrom", None)
            )
            if after is None and type(step).__name__ == "async_generator_asend":
                after = next((r for r in gc.get_referents(step) if type(r).__name__ == "async_generator"), None)
            step = after
    return "\n".join(lines)
