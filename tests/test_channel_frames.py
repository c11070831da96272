"""A frame on the worker's channel is written whole, and its lock released,
even when the interrupt button is pressed at the worst moment.

Every process of a sandbox writes its frames under one record lock (a
background thread in the holder and the running cell share the pipe). A
KeyboardInterrupt raised just after that lock was taken used to leave it held:
the cell's DONE then waited for it forever. The interrupt is now held back
until the frame is out. The moment is made exact here: the real ``lockf``,
followed by a real SIGINT to the process. Run in a child interpreter, so a
KeyboardInterrupt that escapes cannot stop the test session.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import fcntl, json, os, select, signal
from sandbox_kernel.worker import channel

read_end, write_end = os.pipe()
lock = channel.frame_lock_fd()
assert lock is not None, "no memfd here"
chan = channel.Channel(read_end, write_end, lock)
real_lockf = fcntl.lockf

def lockf_then_interrupt(fd, cmd, *rest):
    real_lockf(fd, cmd, *rest)
    if cmd == fcntl.LOCK_EX:
        signal.raise_signal(signal.SIGINT)  # the stop, just after the lock is taken

signal.signal(signal.SIGINT, signal.default_int_handler)
fcntl.lockf = lockf_then_interrupt
raised = False
try:
    chan.send({"type": "stream", "name": "stdout", "text": "x" * 1000})
except KeyboardInterrupt:
    raised = True
fcntl.lockf = real_lockf
whole = bool(select.select([read_end], [], [], 2)[0]) and len(chan.recv().get("text", "")) == 1000
pid = os.fork()
if pid == 0:  # another process of the sandbox: can it write a frame now?
    try:
        real_lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({"raised": raised, "whole": whole, "lock_free": os.waitstatus_to_exitcode(status) == 0}))
"""


def test_an_interrupt_after_the_frame_lock_is_taken_waits_for_the_frame() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"raised": True, "whole": True, "lock_free": True}, result
