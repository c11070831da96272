"""The same cells through the Jupyter kernel and through the tools give the same outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.tools import OutputType, SessionRegistry, repl_execute_cell

CELLS = [
    "import math\nvalue = 6 * 7\nprint('value', value)",
    "def shout(s):\n    return s.upper() + '!'\nshout('hi')",
    "import sys\nprint('to stderr', file=sys.stderr)\n{'a': [1, 2]}",
    "from IPython.display import display, Markdown\ndisplay(Markdown('**md**'))\nmath.sqrt(value)",
    "undefined_name",
    "%%capture\nprint('hidden')",
]


def normalise_kernel(run) -> list:
    out = []
    for m in run.messages:
        kind, c = m["msg_type"], m["content"]
        if kind == "stream":
            out.append(("stream", c["name"], c["text"]))
        elif kind in ("execute_result", "display_data"):
            out.append((kind, c["data"].get("text/plain"), sorted(c["data"])))
        elif kind == "error":
            out.append(("error", c["ename"], c["evalue"]))
    return out


def normalise_cell(cell) -> list:
    out = []
    for o in cell.outputs:
        if o.output_type == OutputType.STREAM:
            out.append(("stream", o.name, o.text))
        elif o.output_type in (OutputType.EXECUTE_RESULT, OutputType.DISPLAY_DATA):
            out.append((o.output_type.value, o.data.get("text/plain"), sorted(o.data)))
        else:
            out.append(("error", o.ename, o.evalue))
    return out


@pytest.mark.asyncio
async def test_kernel_and_tools_agree(kernel, registry: SessionRegistry, data_dir: Path) -> None:
    kernel_outputs = [normalise_kernel(kernel.run(code)) for code in CELLS]
    for code in CELLS:
        await repl_execute_cell(code, user_id="u", session_id="parity", registry=registry)
    nb = (await registry.get("u", "parity")).notebook
    tool_outputs = [normalise_cell(c) for c in nb.cells]
    assert tool_outputs == kernel_outputs
    assert any(o[0] == "error" and o[1] == "NameError" for o in tool_outputs[4])
