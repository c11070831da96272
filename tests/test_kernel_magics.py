"""ipykernel's own magics in the sandbox, side by side with stock ipykernel
(real bwrap and a real ipykernel, through jupyter_client).

Each failed with "Line magic function not found" before, which stops nbclient
and papermill at the cell (``%autosave 0`` heads many public notebooks).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import side_by_side

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# every magic whose output is the same in any kernel, and a usage error of each kind
SAME_AS_IPYKERNEL = [
    "%edit",
    "%autosave 0",
    "%autosave 60",
    "%autosave x",
    "%clear",
    "%less notes.txt",
    "%more lib.py",
    "%less",
]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingKernelClient, BlockingKernelClient]]:
    root = tmp_path_factory.mktemp("magics")
    with side_by_side(root) as pair:
        (root / "ws" / "notes.txt").write_text("a line of notes\n")  # the folder of both
        (root / "ws" / "lib.py").write_text("def f():\n    return 1\n")
        yield pair


def _outcome(kc: BlockingKernelClient, code: str) -> dict[str, Any]:
    """What a frontend shows of ``code``: status, outputs (stream texts, MIME
    keys, error names) and pager payloads (without colours: the shells'
    colour schemes differ)."""
    outputs: list[Any] = []

    def keep(msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            outputs.append((content["name"], content["text"]))
        elif kind in ("display_data", "execute_result"):
            outputs.append((kind, sorted(content["data"])))
        elif kind == "error":
            outputs.append(("error", content["ename"]))

    reply = kc.execute_interactive(code, timeout=60, output_hook=keep)["content"]
    pages = [(p["source"], ANSI.sub("", p.get("data", {}).get("text/plain", ""))) for p in reply.get("payload", [])]
    return {"status": reply["status"], "outputs": outputs, "pages": pages}


@pytest.mark.parametrize("code", SAME_AS_IPYKERNEL)
def test_the_magic_gives_what_ipykernel_gives(kernels: tuple[BlockingKernelClient, ...], code: str) -> None:
    sandboxed, stock = kernels
    ours, theirs = _outcome(sandboxed, code), _outcome(stock, code)
    if code == "%edit":
        # ipykernel then asks the frontend to open the file, which JupyterLab
        # ignores (and the kernel drops); the file is a new temporary one
        assert theirs["pages"] == [("edit_magic", "")]
        theirs["pages"] = []
        for outcome in (ours, theirs):
            outcome["outputs"] = [(name, re.sub(r"/\S+\.py", "<file>", text)) for name, text in outcome["outputs"]]
        assert ours["outputs"] == [("stdout", "IPython will make a temporary file named: <file>\n")]
    if code.startswith("%autosave") and theirs["status"] == "ok":
        # ipykernel also displays a Javascript call to the classic notebook,
        # which JupyterLab and Notebook 7 lack (and the output policy drops)
        assert theirs["outputs"][0] == ("display_data", ["application/javascript"])
        theirs["outputs"] = theirs["outputs"][1:]
    assert ours == theirs
    if code.startswith(("%less ", "%more ")):
        assert ours["pages"] and ("notes" in ours["pages"][0][1] or "return" in ours["pages"][0][1]), ours


def test_man_shows_a_page_as_with_ipykernel(kernels: tuple[BlockingKernelClient, ...]) -> None:
    """``%man`` in the pager (the host's /etc/manpath.config is not in the
    sandbox: man failed on it)."""
    sandboxed, stock = kernels
    ours, theirs = _outcome(sandboxed, "%man ls"), _outcome(stock, "%man ls")
    assert ours["status"] == theirs["status"] == "ok"
    if "LS(1)" in theirs["pages"][0][1]:  # (a machine without man pages has none in either)
        page = ours["pages"][0][1]
        assert page.lstrip().startswith("LS(1)") and "list directory contents" in page, page[:300]


def test_subshell_says_there_are_none(kernels: tuple[BlockingKernelClient, ...]) -> None:
    assert _outcome(kernels[0], "%subshell") == {
        "status": "ok",
        "outputs": [("stdout", "Kernel does not support subshells\n")],
        "pages": [],
    }


@pytest.mark.parametrize("code", ["%connect_info", "%qtconsole"])
def test_what_needs_the_connection_file_says_why_and_gives_none_of_it(
    kernels: tuple[BlockingKernelClient, ...], code: str
) -> None:
    sandboxed = kernels[0]
    outcome = _outcome(sandboxed, code)
    assert outcome["status"] == "ok"  # a warning, as ipykernel's when it cannot: the notebook goes on
    text = "".join(text for name, text in outcome["outputs"] if name == "stderr")
    assert "UserWarning: Could not" in text and "connection file" in text and "is not given to cells" in text, text
    # nothing of the host kernel's connection: its file, key or ports
    info = sandboxed.get_connection_info()
    assert Path(sandboxed.connection_file).name not in text
    assert info["key"].decode() not in text
    assert str(info["shell_port"]) not in text


def test_history_searches_and_reruns_this_sessions_cells(kernels: tuple[BlockingKernelClient, ...]) -> None:
    """IPython's history database (in memory in the sandbox, a file under
    ipykernel): ``%history -g`` and ``%rerun -l`` found nothing before."""
    sandboxed = kernels[0]
    assert _outcome(sandboxed, "marker_of_history = 40")["status"] == "ok"
    found = _outcome(sandboxed, "%history -g marker_of_history")
    assert any("marker_of_history = 40" in text for _, text in found["outputs"]), found
    assert _outcome(sandboxed, "marker_of_history += 1")["status"] == "ok"
    assert _outcome(sandboxed, "%rerun -l 1")["status"] == "ok"  # the line before it, once more
    shown = _outcome(sandboxed, "print(marker_of_history)")
    assert shown["outputs"] == [("stdout", "42\n")], shown


def test_store_keeps_values_as_with_ipykernel(kernels: tuple[BlockingKernelClient, ...]) -> None:
    """IPython's default extension is loaded (``%store`` was "not found"); its
    database is in the sandbox's private /tmp."""
    sandboxed, _ = kernels
    stored = _outcome(sandboxed, "stored_value = [1, 2]\n%store stored_value")
    assert stored["outputs"] == [("stdout", "Stored 'stored_value' (list)\n")], stored
    restored = _outcome(sandboxed, "del stored_value\n%store -r stored_value\nprint(stored_value)")
    assert restored["outputs"] == [("stdout", "[1, 2]\n")], restored
