"""One running sandbox with the worker inside, seen from the host."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ..sandbox import SandboxProcess
from .channel import ProtocolError, encode, read_message

DEAD = "_dead"


class WorkerHandle:
    """Reads the worker's frames into a queue; a dead or misbehaving worker
    becomes a single ``_dead`` message with the reason."""

    def __init__(self, process: SandboxProcess, log: logging.Logger) -> None:
        self.process = process
        self.log = log
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=40)
        self.dead_reason: str | None = None
        self._reader = asyncio.ensure_future(self._read())
        self._stderr = asyncio.ensure_future(self._drain_stderr())

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.process.returncode is None

    async def _read(self) -> None:
        reason = "the sandbox closed its channel"
        try:
            while True:
                msg = await read_message(self.process.stdout)
                if msg is None:
                    break
                self.messages.put_nowait(msg)
        except ProtocolError as exc:
            reason = f"the sandbox broke the protocol ({exc})"
        except Exception as exc:  # pragma: no cover - defensive
            reason = f"reading from the sandbox failed ({exc!r})"
        code = await self._exit_code(timeout=1.0)
        if code is not None:
            reason = f"{reason}; the sandbox exited with code {code}"
        self.dead_reason = self.dead_reason or reason  # keep the reason of a deliberate kill
        self.messages.put_nowait({"type": DEAD, "reason": self.dead_reason})

    async def _exit_code(self, timeout: float) -> int | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout)
        except asyncio.TimeoutError:
            return None

    async def _drain_stderr(self) -> None:
        budget = 1 << 20  # log at most 1 MiB of a sandbox's stderr
        while True:
            line = await self.process.stderr.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            self.stderr_tail.append(text)
            if budget > 0:
                budget -= len(line)
                self.log.debug("sandbox stderr: %s", text)

    def send(self, msg: dict[str, Any]) -> None:
        if self.process.returncode is not None:
            return
        try:
            self.process.stdin.write(encode(msg))
        except (ConnectionError, RuntimeError):
            pass

    async def kill(self) -> None:
        await self.process.kill()
        for task in (self._reader, self._stderr):
            try:
                await asyncio.wait_for(task, 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
