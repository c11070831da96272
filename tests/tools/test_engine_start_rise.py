"""An agent session's REPL engine that starts (or resumes) while the session
rises is counted as holding the network from its network decision on.

An attack review found the window: the registry's watcher polled an engine
only once it had started, and the engine recorded its network only just
before its sandbox started, after its egress proxy's start and the workspace
scan. A rise meanwhile found no holder: a connector's ``wait=True`` returned
at once, it handed its data over, and a module the cell had planted in the
workspace (imported by the worker as it starts) sent it out through the
proxy, which nothing had cut.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import RecordingHTTPServer, leaking_module

from sandbox_kernel.network import EgressPolicy
from sandbox_kernel.privacy import PrivateData
from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell

pytestmark = pytest.mark.asyncio


async def test_an_engine_resuming_while_the_session_rises_is_cut_before_the_data_is_handed_over(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_kernel.engine.session import Session

    origin = RecordingHTTPServer()
    reg = SessionRegistry(
        ToolsConfig(
            backend="bwrap",
            idle_timeout=600,
            network="proxied",
            egress_policy=EgressPolicy(allow=["leak.test"], allow_addresses=["127.0.0.1"]),
            egress_name_overrides={"leak.test": ["127.0.0.1"]},
        )
    )
    kw = {"user_id": "alice", "session_id": "resume", "registry": reg}
    handed: list[float] = []
    connectors: list[threading.Thread] = []
    try:
        plant = leaking_module(origin.port, armed="/workspace/armed")
        r = await repl_execute_cell(f"open('/workspace/sqlite3.py', 'w').write({plant!r})\nx = 41", **kw)
        assert "Error" not in r.text, r.text
        session = await reg.get("alice", "resume")
        workspace = session.workspace
        await reg.expire_idle(0)  # the next call resumes it in a new sandbox
        (workspace / "armed").touch()
        connector = PrivateData("alice", "resume", reg.config.privacy_store())

        def hand_over() -> None:
            connector.add_private_dataset("crm", "SECRET", "connector", wait=30)
            handed.append(time.monotonic())
            (workspace / "secret.txt").write_text("SSN 123-45-6789")

        real_spec = Session._spec

        def spec_during_the_rise(self: Session, *args: Any, **kwargs: Any) -> Any:
            if not connectors:  # the resume's scan of the workspace: the rise lands in it
                connectors.append(threading.Thread(target=hand_over, daemon=True))
                connectors[0].start()
                time.sleep(1.0)  # four polls: long enough for one to report the rise
            return real_spec(self, *args, **kwargs)

        monkeypatch.setattr(Session, "_spec", spec_during_the_rise)
        r = await repl_execute_cell("print(x + 1)", **kw)
        assert connectors, "the resume scanned no workspace"
        await asyncio.to_thread(connectors[0].join, 60)
        assert handed, "wait=True never returned"
        deadline = time.monotonic() + 20
        while not (workspace / "leak.txt").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sent = (workspace / "leak.txt").read_text() if (workspace / "leak.txt").exists() else "(nothing sent)"
        assert not [path for path in origin.heard if "exfil" in path], (origin.heard, sent)
        assert not sent.startswith("HTTP/1.1 200") and not sent.startswith("HTTP/1.0 200"), sent
        print("the planted module got:", sent[:60])
        assert "42" in r.text, r.text  # the state came back in a sandbox without network
    finally:
        await reg.aclose()
        origin.close()
