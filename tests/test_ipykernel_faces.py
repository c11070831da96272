"""What a user reads of a cell, side by side with stock ipykernel: the file
name cells get (in warnings, logging, SyntaxErrors, ``inspect``, ``?``), the
colours of tracebacks and of the inspector, and the fields of a failed
cell's reply. Only the kernel's process id in the cell's folder name differs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import side_by_side

PID = re.compile(r"ipykernel_\d+")
CELLS = [
    "import warnings\nwarnings.warn('careful')",
    "def f():\n    return 1/0\n",
    "f()",  # a traceback through an earlier cell: "Cell In[2]" and colours
    "import logging\nlogging.basicConfig(format='%(filename)s:%(lineno)d %(message)s', force=True)\n"
    "logging.warning('hi')",
    "import inspect\nprint(inspect.getsource(f))\nprint(f.__code__.co_filename.rsplit('/', 1)[-1])",
    "def g(:",  # SyntaxError names the cell's file
    "get_ipython().set_next_input('next'); 1/0",  # a payload made before an error
    "%%no_such_magic\nx",
    "%pip --version",  # through the shell, as IPython's %pip: one stdout, and the restart note
    "%pip list --format=freeze 2>/dev/null | head -1",  # so pipes work too
    "class A:\n    '''doc A'''\n    def meth(self, x: int) -> int:\n        return x\nA.meth?",
]


def _seen(kc: BlockingKernelClient, code: str) -> dict[str, Any]:
    """Everything a frontend gets of ``code``, the kernel's pid and id masked."""
    outputs: list[Any] = []

    def keep(msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            # where a stream's text is cut into messages depends on timing (two
            # writes a few ms apart may fall either side of a flush); a frontend
            # shows them joined, so they are compared joined
            if outputs and outputs[-1][0] == content["name"]:
                outputs[-1] = (content["name"], outputs[-1][1] + content["text"])
            else:
                outputs.append((content["name"], content["text"]))
        elif kind == "error":
            outputs.append(("error", content["ename"], content["evalue"], content["traceback"]))
        elif kind in ("display_data", "execute_result"):
            outputs.append((kind, content["data"]))

    reply = dict(kc.execute_interactive(code, timeout=60, output_hook=keep)["content"])
    if "engine_info" in reply:
        assert reply["engine_info"]["engine_uuid"], reply
        reply["engine_info"] = {**reply["engine_info"], "engine_uuid": "..."}
    # The inspector writes paths under $HOME with "~": a sandbox's home is its /tmp
    return {
        "reply": PID.sub("ipykernel_PID", json.dumps(reply, sort_keys=True)).replace(
            " ~/ipykernel_PID", " /tmp/ipykernel_PID"
        ),
        "outputs": PID.sub("ipykernel_PID", repr(outputs)),
    }


def test_cells_read_as_with_ipykernel(tmp_path: Path) -> None:
    with side_by_side(tmp_path) as (sandboxed, stock):
        different = [
            (code, ours, theirs)
            for code in CELLS
            for ours, theirs in [(_seen(sandboxed, code), _seen(stock, code))]
            if ours != theirs
        ]
        assert not different, different
        # not only equal to ipykernel's: the form users and tools (joblib) know
        texts: list[str] = []
        sandboxed.execute_interactive(
            "warnings.warn('w')",
            timeout=60,
            output_hook=lambda m: texts.append(m["content"]["text"]) if m["msg_type"] == "stream" else None,
        )
        assert re.fullmatch(r"/tmp/ipykernel_\d+/\d+\.py:1: UserWarning: w\n  warnings\.warn\('w'\)\n", "".join(texts))
