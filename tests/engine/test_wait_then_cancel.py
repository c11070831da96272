"""A sandbox's readers are waited for, then cancelled; a cancellation of the
caller is passed on. Found in CI: the tools' privacy watcher, cancelled by
``SessionRegistry.aclose`` while it replaced a sandbox, swallowed the
cancellation inside ``WorkerHandle.kill`` and went on polling, and the close
waited for it for ever."""

from __future__ import annotations

import asyncio

from sandbox_kernel.engine.worker import wait_then_cancel


def test_a_cancelled_caller_is_cancelled_and_takes_the_readers_with_it() -> None:
    async def scenario() -> tuple[bool, bool]:
        reader = asyncio.ensure_future(asyncio.Event().wait())  # a reader that never ends
        caller = asyncio.ensure_future(wait_then_cancel([reader], 30.0))
        await asyncio.sleep(0.05)  # the caller waits on the reader
        caller.cancel()
        try:
            await caller
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0)
        return caller.cancelled(), reader.cancelled()

    assert asyncio.run(scenario()) == (True, True)


def test_readers_still_running_after_the_timeout_are_cancelled_and_ended_ones_are_done() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        stuck = asyncio.ensure_future(asyncio.Event().wait())
        ended = asyncio.ensure_future(asyncio.sleep(0))
        cancelled_elsewhere = asyncio.ensure_future(asyncio.Event().wait())
        cancelled_elsewhere.cancel()
        await wait_then_cancel([stuck, ended, cancelled_elsewhere], 0.1)  # returns: the caller was not cancelled
        await asyncio.sleep(0)
        return stuck.cancelled(), ended.done() and not ended.cancelled(), cancelled_elsewhere.cancelled()

    assert asyncio.run(scenario()) == (True, True, True)
