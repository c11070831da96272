"""A silent request's output reaches iopub as with ipykernel (real bwrap and a
real ipykernel, side by side): a client that sends one (an extension, a
script on jupyter_client) reads its prints, displays and errors there.
Before, every output of a silent request was dropped."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import side_by_side

CELLS = [
    "print('out')\nimport sys\nprint('err', file=sys.stderr)",
    "from IPython.display import display, HTML\ndisplay(HTML('<b>bold</b>'))\n6 * 7",
    "1 / 0",
]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingKernelClient, BlockingKernelClient]]:
    with side_by_side(tmp_path_factory.mktemp("silent")) as pair:
        yield pair


def _silent(kc: BlockingKernelClient, code: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """The iopub messages of ``code`` sent silent (type, and what shows of
    each), and its reply."""
    msg_id = kc.execute(code, silent=True)
    seen: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            break
        if kind == "stream":
            seen.append((kind, (content["name"], content["text"])))
        elif kind in ("display_data", "execute_result"):
            seen.append((kind, sorted(content["data"])))
        elif kind == "error":
            seen.append((kind, content["ename"]))
        elif kind != "status":
            seen.append((kind, None))
    else:
        raise AssertionError(f"no idle for {code!r}")
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    return seen, reply["content"]


@pytest.mark.parametrize("code", CELLS)
def test_a_silent_requests_output_is_ipykernels(kernels: tuple[BlockingKernelClient, ...], code: str) -> None:
    sandboxed, stock = kernels
    ours, ours_reply = _silent(sandboxed, code)
    theirs, theirs_reply = _silent(stock, code)
    assert ours == theirs
    assert ours, "ipykernel publishes each of these"
    assert "execute_input" not in [kind for kind, _ in ours]
    assert ours_reply["status"] == theirs_reply["status"]
