"""The same cells through the Jupyter kernel and through the tools give the same outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.tools import OutputType, SessionRegistry, repl_execute_cell, repl_export_ipynb

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


def normalise_ipynb(cell) -> list:
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(("stream", o.name, o.text))
        elif o.output_type in ("execute_result", "display_data"):
            out.append((o.output_type, o.data.get("text/plain"), sorted(o.data)))
        else:
            out.append(("error", o.ename, o.evalue))
    return out


AGENT_CELLS = [
    *CELLS[:5],
    "import pandas as pd\nframe = pd.DataFrame({'k': range(3), 'sq': [shout(str(i)) for i in range(3)]})\nframe",
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()",
    "open('made_by_agent.txt', 'w').write('from the agent')\nprint(open('made_by_agent.txt').read())",
]


@pytest.mark.asyncio
async def test_exported_notebook_reruns_on_the_kernel(registry: SessionRegistry, data_dir: Path) -> None:
    """What an agent did opens as a real notebook and re-runs, unchanged, on the
    sandboxed kernel named in its metadata, with the same outputs."""
    import nbformat
    from nbclient import NotebookClient

    for code in AGENT_CELLS:
        await repl_execute_cell(code, user_id="u", session_id="rerun", registry=registry)
    await repl_export_ipynb("report/agent.ipynb", user_id="u", session_id="rerun", registry=registry)
    path = data_dir / "workspaces/u/rerun/report/agent.ipynb"
    exported = nbformat.read(path, as_version=4)
    expected = [normalise_ipynb(c) for c in exported.cells]
    assert any(o[1] == "NameError" for o in expected[4]) and "image/png" in expected[6][0][2]

    rerun = nbformat.read(path, as_version=4)
    for cell in rerun.cells:
        cell.outputs = []
    assert rerun.metadata.kernelspec.name == "sandbox-python"
    # no kernel_name: nbclient starts the kernel the notebook names; cwd is the workspace
    NotebookClient(
        rerun, timeout=120, allow_errors=True, resources={"metadata": {"path": str(path.parent.parent)}}
    ).execute()
    nbformat.validate(rerun)
    assert [normalise_ipynb(c) for c in rerun.cells] == expected
    assert rerun.metadata.language_info.name == "python"
