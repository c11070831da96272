"""An agent notebook keeps a bounded amount of output (audit E, found by an
audit of the agent tools): each call rewrites the whole notebook, and with
500 cells of 10 MB allowed it grew toward 5 GB while every save stalled the
event loop of every session for seconds. Beyond ``max_notebook_bytes`` the
oldest cells' outputs are dropped, each replaced by a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell, repl_show_cell

pytestmark = pytest.mark.asyncio

BUDGET = 1024 * 1024


async def test_the_oldest_outputs_go_first_and_the_file_stays_bounded(data_dir: Path) -> None:
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600, max_notebook_bytes=BUDGET))
    kw = {"user_id": "alice", "session_id": "big", "registry": reg}
    try:
        for i in range(6):
            r = await repl_execute_cell(f"print('{i}' + 'x' * 400_000)", **kw)
            assert "Error" not in r.text[:200], r.text[:200]
        session = await reg.get("alice", "big")
        path = session.notebook.path
        assert path.stat().st_size < BUDGET + 64 * 1024, path.stat().st_size
        cells = json.loads(path.read_text())["cells"]
        texts = ["".join(o.get("text") or "" for o in c["outputs"]) for c in cells]
        assert all("outputs were dropped" in t for t in texts[:3]), [t[:80] for t in texts]
        assert texts[-1].startswith("5xxxx") and texts[-2].startswith("4xxxx"), [t[:20] for t in texts]
        shown = (await repl_show_cell(0, **kw)).text
        assert "the notebook keeps at most 1 MB of outputs" in shown, shown
        # a cell too large on its own keeps only the note
        await repl_execute_cell("print('y' * 1_500_000)", **kw)
        last = json.loads(path.read_text())["cells"][-1]["outputs"]
        assert len(last) == 1 and "outputs were dropped" in last[0]["text"], last
        assert path.stat().st_size < BUDGET + 64 * 1024
    finally:
        await reg.aclose()
