"""A FAKE sandbox backend for the engine's unit tests. It isolates nothing.

It runs the worker as a plain subprocess (like the development fallback) and
adds what tests need: a record of every launch the engine decided, the live
processes so a test can kill one, and injected faults (a start that fails, a
worker replaced by another command). The engine's logic (state carry, replay,
the output budget, notices, the ratchet's launch decisions) is tested against
it in seconds; the real-sandbox tests (tests/test_*.py) stay the proof of
isolation.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sandbox_kernel.sandbox import Sandbox, SandboxProcess, SandboxSpec
from sandbox_kernel.sandbox.base import spawn

FAKE_WARNING = "FAKE sandbox backend (tests only): cells run as plain processes, nothing is isolated."


class FakeSandbox(Sandbox):
    """Test stand-in for a backend: records launches, injects faults."""

    name = "fake"
    isolates = False
    warning = FAKE_WARNING

    def __init__(self, fail_start: BaseException | None = None, command: Sequence[str] | None = None) -> None:
        #: every spec the engine asked for, in order
        self.launches: list[SandboxSpec] = []
        #: every process started, in order (a test kills one to simulate a crash)
        self.processes: list[SandboxProcess] = []
        #: raised by the next start() (then cleared), as a backend that cannot start
        self.fail_start = fail_start
        #: run this instead of the engine's command (a misbehaving worker)
        self.command = list(command) if command is not None else None
        #: the next starts die at once, each writing its text to stderr (a
        #: sandbox whose own set-up failed, as bwrap's does), then clear
        self.dying_starts: list[str] = []

    async def start(self, spec: SandboxSpec) -> SandboxProcess:
        self.launches.append(spec)
        if self.fail_start is not None:
            exc, self.fail_start = self.fail_start, None
            raise exc
        command = self.command or list(spec.command)
        if self.dying_starts:
            text = self.dying_starts.pop(0)
            command = [sys.executable, "-c", f"import sys; sys.stderr.write({text!r}); sys.exit(1)"]
        process = await spawn(command, spec.limits, env=spec.env, cwd=spec.cwd)
        handle = SandboxProcess(process, self.name)
        self.processes.append(handle)
        return handle
