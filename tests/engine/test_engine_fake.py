"""The engine's logic against the fake backend: fast, no sandbox needed.

These check decisions (what is carried to a new sandbox, what the user is
told, what a launch gets); tests/test_*.py prove the same paths isolate.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fake_backend import FAKE_WARNING, FakeSandbox

from sandbox_kernel.engine import EngineConfig, Session
from sandbox_kernel.engine.ratchet import Ratchet
from sandbox_kernel.privacy import PrivacyStore

pytestmark = [pytest.mark.asyncio, pytest.mark.fake_backend]


class Cells:
    """Runs cells on a session and keeps what each one emitted."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.count = 0

    async def run(self, code: str, **kwargs: Any) -> tuple[Any, str, list[tuple[str, dict[str, Any]]]]:
        self.count += 1
        emitted: list[tuple[str, dict[str, Any]]] = []
        result = await self.session.execute(
            code, execution_count=self.count, emit=lambda kind, content: emitted.append((kind, content)), **kwargs
        )
        text = "".join(c.get("text", "") for kind, c in emitted if kind == "stream")
        return result, text, emitted


def _session(tmp_path: Path, sandbox: FakeSandbox, ratchet: Ratchet | None = None, **config: Any) -> Session:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return Session(EngineConfig(workspace=workspace, **config), sandbox=sandbox, ratchet=ratchet)


@pytest_asyncio.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[Cells, FakeSandbox]]:
    sandbox = FakeSandbox()
    session = _session(tmp_path, sandbox)
    yield Cells(session), sandbox
    await session.shutdown()


async def test_backend_warning_is_said_once_and_in_warnings(fake: tuple[Cells, FakeSandbox]) -> None:
    cells, _ = fake
    _, first, _ = await cells.run("1")
    _, second, _ = await cells.run("2")
    assert FAKE_WARNING in first and FAKE_WARNING not in second
    assert cells.session.warnings == [FAKE_WARNING]


async def test_state_carries_to_a_new_sandbox_after_a_crash(fake: tuple[Cells, FakeSandbox]) -> None:
    cells, sandbox = fake
    await cells.run("import json\nx = {'a': 1}\ndef twice(v):\n    return 2 * v\nclass K:\n    n = 3")
    await cells.session.checkpoint()
    await sandbox.processes[-1].kill()  # the sandbox dies between cells
    result, text, emitted = await cells.run("print(json.dumps(x), twice(21), K.n)")
    assert result.status == "ok", emitted
    assert '{"a": 1} 42 3' in text
    assert "The sandbox was replaced" in text
    assert len(sandbox.launches) == 2


async def test_definitions_are_replayed_when_no_checkpoint_exists(tmp_path: Path) -> None:
    sandbox = FakeSandbox()
    # no background checkpoint: only the replay log can bring state back
    session = _session(tmp_path, sandbox, checkpoint_delay=3600)
    cells = Cells(session)
    try:
        await cells.run("import math\ndef area(r):\n    return math.pi * r * r\nvalue = 5")
        await sandbox.processes[-1].kill()
        result, text, _ = await cells.run("print(round(area(1), 2))")
        assert result.status == "ok" and "3.14" in text
        # the variable was not in a checkpoint: it is gone, and the user is told
        result, _, emitted = await cells.run("value")
        assert result.status == "error" and result.ename == "NameError", emitted
    finally:
        await session.shutdown()


async def test_output_budget_truncates_with_a_note(tmp_path: Path) -> None:
    sandbox = FakeSandbox()
    session = _session(tmp_path, sandbox, max_output_bytes=100_000)
    cells = Cells(session)
    try:
        result, text, _ = await cells.run("for i in range(50):\n    print('y' * 10_000)")
        assert result.status == "ok"
        assert text.count("y") <= 110_000
        assert "truncated" in text.lower() or "output limit" in text.lower()
        # the next cell has its own budget
        _, text, _ = await cells.run("print('after')")
        assert "after" in text
    finally:
        await session.shutdown()


async def test_a_backend_that_cannot_start_gives_a_clear_error(tmp_path: Path) -> None:
    sandbox = FakeSandbox(fail_start=OSError("no room for sandboxes"))
    session = _session(tmp_path, sandbox)
    cells = Cells(session)
    try:
        result, _, emitted = await cells.run("1 + 1")
        assert result.status == "error" and result.ename == "SandboxUnavailable"
        assert "could not start the fake sandbox: no room for sandboxes" in result.evalue
        assert any(kind == "error" for kind, _ in emitted)
        result, _, _ = await cells.run("1 + 1")  # the next start works
        assert result.status == "ok"
    finally:
        await session.shutdown()


LOOPBACK_FAILURE = "bwrap: loopback: Failed RTM_NEWADDR: No child processes\n"


async def test_a_transient_network_setup_failure_is_retried_once(tmp_path: Path) -> None:
    """bwrap's loopback set-up in a new namespace failed once in CI right after a
    killed sandbox's namespace went: the start is tried once more, and only for
    that failure; a second one, or any other failure, is the user's error."""
    sandbox = FakeSandbox()
    session = _session(tmp_path, sandbox)
    cells = Cells(session)
    try:
        sandbox.dying_starts = [LOOPBACK_FAILURE]
        result, _, _ = await cells.run("1 + 1")
        assert result.status == "ok", result
        assert len(sandbox.launches) == 2

        await sandbox.processes[-1].kill()  # the sandbox dies between cells
        sandbox.dying_starts = [LOOPBACK_FAILURE, LOOPBACK_FAILURE]
        result, _, _ = await cells.run("2")
        assert result.status == "error" and result.ename == "SandboxUnavailable"
        assert "RTM_NEWADDR" in result.evalue and len(sandbox.launches) == 4  # one retry, no more

        sandbox.dying_starts = ["bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n"]
        result, _, _ = await cells.run("3")
        assert result.status == "error" and "Can't mount proc" in result.evalue
        assert len(sandbox.launches) == 5  # a configuration problem is not retried
        result, _, _ = await cells.run("4")
        assert result.status == "ok"
    finally:
        await session.shutdown()


async def test_a_worker_speaking_garbage_is_dropped(tmp_path: Path) -> None:
    # A worker that writes a frame which is not JSON: the host refuses it and
    # never unpickles or evaluates anything it sent.
    garbage = "import sys, struct; sys.stdout.buffer.write(struct.pack('>I', 5) + b'pwned'); sys.stdout.flush()"
    sandbox = FakeSandbox(command=[sys.executable, "-I", "-c", garbage])
    session = _session(tmp_path, sandbox)
    cells = Cells(session)
    try:
        result, _, _ = await cells.run("1")
        assert result.status == "error" and result.ename == "SandboxUnavailable"
        assert "broke the protocol (frame is not JSON" in result.evalue, result.evalue
    finally:
        await session.shutdown()


async def test_the_launch_follows_the_ratchet(tmp_path: Path) -> None:
    store = PrivacyStore(tmp_path / "privacy")
    ratchet = Ratchet("alice", "s1", store, workspace=tmp_path / "ws")
    sandbox = FakeSandbox()
    session = _session(tmp_path, sandbox, ratchet=ratchet)
    cells = Cells(session)
    try:
        await cells.run("x = 7")
        assert sandbox.launches[-1].isolate_network is False  # public: network allowed
        await session.mark_private("CONFIDENTIAL", "test", source="api")
        result, text, _ = await cells.run("print(x)")
        assert result.status == "ok" and "7" in text
        assert sandbox.launches[-1].isolate_network is True  # replaced, without network
        assert all(spec.isolate_network for spec in sandbox.launches[1:])
        assert session.private and not session.network_allowed
    finally:
        await session.shutdown()


async def test_the_level_is_read_at_a_request_only_while_the_sandbox_has_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request after a pause reads the stored level while the sandbox has a
    network to cut: a rise by another process is acted on before the cell.
    Once private, the sandbox has none and private stays private (raise-only):
    neither the request nor its outputs' cleaning read the store again (each
    read cost 0.3 ms of a spaced request's path on a 2-core VM)."""
    store = PrivacyStore(tmp_path / "privacy")
    ratchet = Ratchet("alice", "s1", store, workspace=tmp_path / "ws")
    sandbox = FakeSandbox()
    session = _session(tmp_path, sandbox, ratchet=ratchet)
    cells = Cells(session)
    reads: list[float] = []
    read_state = ratchet._read_state
    monkeypatch.setattr(ratchet, "_read_state", lambda: reads.append(time.monotonic()) or read_state())
    try:
        await cells.run("x = 7")
        # another process (its own objects on the same store) raises the level
        Ratchet("alice", "s1", PrivacyStore(tmp_path / "privacy")).mark("CONFIDENTIAL", "crm export", "api")
        await asyncio.sleep(0.1)  # older than the last read's allowed age
        reads.clear()
        result, text, _ = await cells.run("print(x)")
        assert reads, "the level was not read before the cell"
        assert result.status == "ok" and "7" in text and "[SYSTEM]" in text
        assert sandbox.launches[-1].isolate_network is True  # replaced before the cell ran
        for _ in range(3):
            await asyncio.sleep(0.1)
            reads.clear()
            result, text, _ = await cells.run("print('see https://example.com/x')")
            assert result.status == "ok" and "https[:]//example.com" in text  # defanged: private
            assert reads == []
        assert session.private and not session.network_allowed
    finally:
        await session.shutdown()


async def test_run_command_uses_the_same_launch(fake: tuple[Cells, FakeSandbox], tmp_path: Path) -> None:
    cells, sandbox = fake
    result = await cells.session.run_command(["/bin/sh", "-c", "echo $HOME; pwd; echo $SANDBOX_KERNEL_BACKEND"])
    lines = result.stdout.decode().split()
    spec = sandbox.launches[-1]
    assert result.exit_code == 0
    assert lines[1] == str((tmp_path / "ws").resolve())  # cwd: the workspace
    assert spec.env["HOME"] == lines[0] and spec.env["PATH"].startswith(str(Path(sys.executable).parent))
    assert "SANDBOX_KERNEL_BACKEND" in spec.env  # the same environment as the cells' sandbox
    assert spec.isolate_network is True  # no ratchet: no network (the safe default)
