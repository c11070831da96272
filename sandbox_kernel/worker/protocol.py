"""The worker protocol: every message kind the host and the worker exchange, and the frame limits.

One module both sides import, so a new message kind is added in one place and
a typo is a NameError rather than a message silently ignored. Stdlib only: the
worker imports it inside the sandbox, and the engine imports it on the host
(the worker never imports the engine).

A frame is a 4-byte big-endian length followed by a UTF-8 JSON object. Host
messages carry ``"op"``, worker messages carry ``"type"``.
"""

from __future__ import annotations

import struct
from typing import Final

#: frame header: the body's length in bytes
HEADER: Final = struct.Struct(">I")
#: the largest frame either side accepts (a larger one drops the sandbox)
MAX_FRAME: Final = 64 * 1024 * 1024
#: left beside the checkpoint when a background one could not be written (a full
#: disk); the host reads and removes it before the next cell, and tells the user
CHECKPOINT_FAILED_MARKER: Final = "checkpoint.failed"
#: the environment variable naming where a sandbox sees the host's parso cache
#: (engine/completer_seed.py makes it, worker/warmup.py copies it)
COMPLETER_SEED_ENV: Final = "SANDBOX_KERNEL_COMPLETER_SEED"
#: the largest single output message a worker sends (the host refuses larger bundles anyway)
MAX_OUTPUT_MESSAGE: Final = 20 * 1024 * 1024


class Op:
    """What the host asks the worker (the ``op`` of a host message)."""

    EXECUTE: Final = "execute"
    RESTORE: Final = "restore"  # run the replay log / unpickle a checkpoint, like a cell
    COMPLETE: Final = "complete"
    INSPECT: Final = "inspect"
    CHECKPOINT: Final = "checkpoint"
    INTERRUPT: Final = "interrupt"
    KILL: Final = "kill"
    INPUT_REPLY: Final = "input_reply"
    RATCHET_REPLY: Final = "ratchet_reply"
    COMM: Final = "comm"  # a frontend's message for a widget comm, handled like a cell
    SHUTDOWN: Final = "shutdown"


class Msg:
    """What the worker tells the host (the ``type`` of a worker message)."""

    READY: Final = "ready"
    STREAM: Final = "stream"
    DISPLAY_DATA: Final = "display_data"
    UPDATE_DISPLAY_DATA: Final = "update_display_data"
    EXECUTE_RESULT: Final = "execute_result"
    ERROR: Final = "error"
    CLEAR_OUTPUT: Final = "clear_output"
    COMM: Final = "comm"  # a widget comm message (open, msg, close) for the frontend
    INPUT_REQUEST: Final = "input_request"
    RATCHET: Final = "ratchet"  # a cell declared private data: the host answers with RATCHET_REPLY
    DONE: Final = "done"  # end of an execute/restore
    REPLY: Final = "reply"  # answer to complete/inspect/checkpoint


HOST_OPS: Final = frozenset(v for k, v in vars(Op).items() if k.isupper())
WORKER_TYPES: Final = frozenset(v for k, v in vars(Msg).items() if k.isupper())
#: worker messages that are a cell's output (counted against its output budget)
OUTPUT_TYPES: Final = frozenset(
    {Msg.STREAM, Msg.DISPLAY_DATA, Msg.UPDATE_DISPLAY_DATA, Msg.EXECUTE_RESULT, Msg.CLEAR_OUTPUT, Msg.COMM}
)
#: messages that answer the running request, late ones for a finished cell are ignored
LATE_OPS: Final = frozenset({Op.INTERRUPT, Op.KILL, Op.INPUT_REPLY, Op.RATCHET_REPLY})

__all__ = [
    "CHECKPOINT_FAILED_MARKER",
    "COMPLETER_SEED_ENV",
    "HEADER",
    "HOST_OPS",
    "LATE_OPS",
    "MAX_FRAME",
    "MAX_OUTPUT_MESSAGE",
    "OUTPUT_TYPES",
    "WORKER_TYPES",
    "Msg",
    "Op",
]
