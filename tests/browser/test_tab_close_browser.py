"""A browser tab closed during a long cell, and the notebook reopened.

The cell runs on with nobody watching: its outputs keep reaching the kernel's
clients over the server's websocket, and the reopened notebook finds the
cell's work done (issue 17's fault list). Stock ipykernel behaves alike: a new
page does not show outputs of an execution it did not start.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from lab_helpers import LabServer, Shots
from playwright.sync_api import Page, expect
from test_status_widget import CELL_TIMEOUT, open_notebook, run_cell, stdout_text
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.timeout(240)


def kernel_streams(lab: LabServer, kernel_id: str, seconds: float) -> list[tuple[str, str]]:
    """(parent msg_type, text) of the stream messages a fresh client of the kernel
    receives over the server's websocket within ``seconds``."""

    async def collect() -> list[tuple[str, str]]:
        url = f"ws://127.0.0.1:{lab.port}/api/kernels/{kernel_id}/channels?token={lab.token}"
        conn = await websocket_connect(url)
        got: list[tuple[str, str]] = []
        end = time.monotonic() + seconds
        try:
            while (left := end - time.monotonic()) > 0:
                try:
                    raw = await asyncio.wait_for(conn.read_message(), left)
                except asyncio.TimeoutError:
                    break
                if raw is None:
                    break
                msg = json.loads(raw)
                if msg.get("channel") == "iopub" and msg.get("msg_type") == "stream":
                    got.append((msg["parent_header"].get("msg_type", ""), msg["content"]["text"]))
        finally:
            conn.close()
        return got

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API owns this thread's event loop
        return pool.submit(asyncio.run, collect()).result()


def test_tab_closed_during_a_long_cell(page: Page, lab: LabServer, shot: Shots) -> None:
    """The cell runs on with nobody watching: its outputs keep coming to the
    kernel's clients, and the reopened notebook finds the cell's work done."""
    lab.put_notebook("w/long.ipynb")
    open_notebook(page, lab, "w/long.ipynb")
    cell = page.locator(".jp-NotebookPanel:visible .jp-Cell").first
    cell.locator(".cm-content").click()
    code = "import time; ticks = [print('tick', i, flush=True) or time.sleep(0.2) or i for i in range(60)]"
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text("tick 3", timeout=CELL_TIMEOUT)
    shot(page, "widgets-long-cell-before-close")
    page.close()  # the tab goes away mid-cell
    session = lab.session_for("w/long.ipynb")
    assert session is not None
    streams = kernel_streams(lab, session["kernel"]["id"], 3.0)
    ticks = [int(text.split()[1]) for kind, text in streams if kind == "execute_request" and text.startswith("tick")]
    assert len(ticks) >= 5 and ticks == sorted(ticks) and ticks[0] > 3, streams  # still running, still sending
    reopened = page.context.new_page()
    open_notebook(reopened, lab, "w/long.ipynb")
    check, _ = run_cell(reopened, "print(len(ticks), ticks[-1])")
    assert stdout_text(check).strip() == "60 59"
    shot(reopened, "widgets-long-cell-reopened")
    reopened.close()
