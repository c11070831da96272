"""backend="auto" without bwrap on PATH: the development fallback (a plain
subprocess), which isolates nothing. A rise must not be announced as a network
cut that never happens, and once private the session runs no more code (fail
closed): nothing there keeps the private data in.

The "outside world" is a listener on the host's 127.0.0.1 (loopback only): the
subprocess backend reaches it, so every check that it was NOT reached after
the rise is a real check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kernel_helpers import LoopbackListener

from sandbox_kernel.privacy import PrivateData
from sandbox_kernel.sandbox.registry import resolve_name
from sandbox_kernel.tools import SessionRegistry, ToolFatalError, ToolsConfig, repl_execute_cell, sandbox_execute
from sandbox_kernel.tools.network import sandbox_network

pytestmark = pytest.mark.asyncio

#: what a notice may not say on a backend that cuts nothing
CLAIMS = ("Outbound connections are blocked", "replaced by one without network", "network was cut")


class Listener(LoopbackListener):
    """A loopback service counting who connected."""

    def __init__(self) -> None:
        super().__init__(banner=b"host-loopback-service\n")

    def probe(self) -> str:
        return f"import socket; s = socket.create_connection(('127.0.0.1', {self.port}), 3); print('connected:', s.recv(100))"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest_asyncio.fixture
async def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SessionRegistry]:
    empty = tmp_path / "nobwrap"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no bwrap (nor anything else): "auto" falls back
    assert resolve_name("auto") == "subprocess"
    reg = SessionRegistry(ToolsConfig(backend="auto", idle_timeout=600, data_dir=tmp_path / "data"))
    try:
        yield reg
    finally:
        await reg.aclose()


def _claims(text: str) -> list[str]:
    return [claim for claim in CLAIMS if claim in text]


async def test_host_side_rise_is_not_announced_as_a_cut_and_fails_closed(
    registry: SessionRegistry, listener: Listener
) -> None:
    kw = {"user_id": "u", "session_id": "s", "registry": registry}
    first = await repl_execute_cell(listener.probe(), **kw)
    assert "connected: b'host-loopback-service" in first.text, first.text  # the fallback has the host's network
    assert listener.accepted == 1
    before = (await sandbox_network(**kw)).text
    assert before.startswith("Network: full, NOT isolated"), before  # not "proxied": nothing enforces it

    PrivateData("u", "s", store=registry.config.privacy_store()).add_private_dataset("secret", "CONFIDENTIAL")

    cell = await repl_execute_cell(listener.probe(), **kw)
    assert not _claims(cell.text), cell.text
    assert "connected:" not in cell.text and "isolates nothing" in cell.text and "bubblewrap" in cell.text, cell.text
    with pytest.raises(ToolFatalError) as refused:
        await sandbox_execute(f'python3 -c "{listener.probe()}"', **kw)
    assert "isolates nothing" in str(refused.value) and "bubblewrap" in str(refused.value)
    assert listener.accepted == 1, "a cell or command of the private session reached the host's loopback"

    status = (await sandbox_network(**kw)).text
    first_line = status.splitlines()[0]
    assert first_line.startswith("Network: NOT cut") and "isolates nothing" in first_line, status
    assert "Network: none" not in status
    session = await registry.get("u", "s")
    assert session.privacy()["network"] != "none" and session.privacy()["isolated"] is False


async def test_a_cells_own_rise_is_not_announced_as_a_cut(registry: SessionRegistry, listener: Listener) -> None:
    kw = {"user_id": "u", "session_id": "own", "registry": registry}
    assert "COMPLETED" in (await repl_execute_cell("x = 1", **kw)).text
    r = await repl_execute_cell(
        f"import sandbox_kernel.private as p\np.mark_private('CONFIDENTIAL', 'test')\n{listener.probe()}", **kw
    )
    assert not _claims(r.text), r.text
    assert "Private data entered this session, but its network was NOT cut" in r.text, r.text
    assert "connected:" not in r.text
    r = await repl_execute_cell(listener.probe(), **kw)
    assert "refused" in r.text and "connected:" not in r.text, r.text
    assert listener.accepted == 0
