"""Requests whose caller was cancelled (an MCP client's cancel, the privacy
watcher stopped by the registry's close) over the real engine (bwrap).

The worker takes one request at a time. A request sent while an abandoned one
still ran was dropped: a cell after a cancelled checkpoint waited for ever, and
the registry's close after a cancelled replacement hung for two minutes (a CI
run). A sandbox whose start was cancelled ran on until the host process ended."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest

from sandbox_kernel.engine.session import Session
from sandbox_kernel.privacy import PrivacyStore, PrivateData
from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell
from sandbox_kernel.worker.protocol import Msg, Op

pytestmark = pytest.mark.asyncio

#: a variable whose pickling (every checkpoint) takes 2 s
SLOW_STATE = (
    "import time\n"
    "class Slow:\n"
    "    def __reduce__(self):\n"
    "        time.sleep(2)\n"
    "        return (int, (7,))\n"
    "slow = Slow()\n"
    "value = 41"
)


def ids(reg: SessionRegistry, session: str) -> dict:
    return {"user_id": "alice", "session_id": session, "registry": reg}


def processes_naming(text: str) -> list[int]:
    """This machine's processes whose command line holds ``text`` (a sandbox's
    workspace, which its bwrap command line binds)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def our_pastas() -> list[int]:
    """The user-mode network helpers this test process started and that still run."""
    found = []
    for child in psutil.Process().children():
        try:
            if child.name().startswith("pasta") and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


async def cancel(task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def abandoned_checkpoint(registry: SessionRegistry, session: str) -> Session:
    """A session whose checkpoint the host stopped waiting for, still being
    written in the sandbox (pickling ``slow``); its engine."""
    await repl_execute_cell(SLOW_STATE, **ids(registry, session))
    engine = (await registry.get("alice", session)).engine
    task = asyncio.create_task(engine.checkpoint())
    await asyncio.sleep(0.5)
    await cancel(task)
    return engine


async def test_a_cell_after_a_cancelled_checkpoint_runs_in_the_same_sandbox(registry: SessionRegistry) -> None:
    kw = ids(registry, "checkpoint")
    engine = await abandoned_checkpoint(registry, "checkpoint")
    pid = engine.worker.process.pid
    # Dropped by the busy worker, the cell waited for its whole timeout, was
    # killed and its sandbox replaced.
    r = await asyncio.wait_for(repl_execute_cell("value + 1", timeout=60, **kw), 90)
    assert "COMPLETED" in r.text.splitlines()[0] and "42" in r.text, r.text
    assert engine.worker.process.pid == pid, "the sandbox was replaced"


async def test_a_request_the_busy_worker_gets_anyway_is_answered(registry: SessionRegistry) -> None:
    """The worker's side: a second request (the host's bug, not a user's) gets
    an error at once instead of silence."""
    worker = (await abandoned_checkpoint(registry, "busy")).worker
    assert worker.abandoned is not None  # the checkpoint, still running
    worker.send({"op": Op.INSPECT, "id": "q-busy", "code": "value", "cursor_pos": 5, "detail_level": 0})
    seen = []
    while True:
        msg = await asyncio.wait_for(worker.next_message(), 30)
        seen.append((msg.get("type"), msg.get("id")))
        if msg.get("id") == "q-busy":
            break
    assert msg.get("type") == Msg.DONE and msg.get("ename") == "SandboxBusy", msg
    assert worker.abandoned[0] not in [i for _, i in seen], "the checkpoint ended first: the test proves nothing"


async def test_closing_the_registry_while_it_replaces_a_sandbox(registry: SessionRegistry, data_dir: Path) -> None:
    """The CI hang: a rise made outside the session, and the registry closed
    while the watcher checkpoints the sandbox it replaces."""
    registry.config.network = "user"  # the cut replaces the sandbox
    kw = ids(registry, "closing")
    await repl_execute_cell(SLOW_STATE, **kw)
    workspace = str((await registry.get("alice", "closing")).workspace)
    store = PrivacyStore(data_dir / "privacy")
    await asyncio.to_thread(
        PrivateData("alice", "closing", store).add_private_dataset, "crm", "SECRET", "connector", True
    )
    # wait=True returned at the cut; the replacement's checkpoint takes 2 s
    await asyncio.wait_for(registry.aclose(), 60)
    assert not processes_naming(workspace), "a sandbox of the closed registry still runs"
    again = SessionRegistry(ToolsConfig(backend="bwrap"))
    try:
        r = await repl_execute_cell("value + 1", **ids(again, "closing"))
        assert "42" in r.text, r.text
    finally:
        await again.aclose()


@pytest.mark.parametrize(
    ("network", "delay"),
    # as bwrap appears (inside its creation, or its user-mode network set-up),
    # and 50 ms later (the worker is starting Python: the wait for its READY)
    [("none", 0.0), ("user", 0.0), ("none", 0.05), ("user", 0.05)],
)
async def test_a_cancelled_start_leaves_no_sandbox(registry: SessionRegistry, network: str, delay: float) -> None:
    registry.config.network = network
    kw = ids(registry, f"start-{network}")
    workspace = str((await registry.get("alice", f"start-{network}")).workspace)
    task = asyncio.create_task(repl_execute_cell("1 + 1", **kw))
    deadline = time.monotonic() + 30
    while not processes_naming(workspace) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert processes_naming(workspace), "the sandbox never started"
    await asyncio.sleep(delay)
    assert not task.done()
    await cancel(task)  # before its worker said it is ready
    deadline = time.monotonic() + 15
    while (processes_naming(workspace) or our_pastas()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not processes_naming(workspace), "the sandbox whose start was cancelled still runs"
    assert not our_pastas(), "its user-mode network helper still runs"
    # and the session works afterwards
    r = await repl_execute_cell("1 + 1", **kw)
    assert "2" in r.text.splitlines()[-1], r.text


async def test_killing_a_sandbox_whose_pipe_another_process_holds_ends(registry: SessionRegistry) -> None:
    """Python 3.11 wakes a wait for a process that began before its exit only
    once all its pipes are closed: a holder outside the sandbox's group (here
    this test, through /proc) hung the kill, and the registry's close, for ever."""
    kw = ids(registry, "held")
    await repl_execute_cell("1", **kw)
    engine = (await registry.get("alice", "held")).engine
    process = engine.worker.process
    held = await asyncio.to_thread(os.open, f"/proc/{process.pid}/fd/1", os.O_WRONLY)  # another writer of its stdout
    try:
        await asyncio.wait_for(engine.worker.kill(), 60)
        assert process.returncode is not None
        os.fstat(held)  # still held all along
    finally:
        os.close(held)
    r = await repl_execute_cell("2 + 2", **kw)  # a new sandbox
    assert "4" in r.text.splitlines()[-1], r.text
