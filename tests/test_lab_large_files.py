"""A huge or sparse file a sandbox wrote must not exhaust the Lab server.

A cell makes a 4 GiB file (its default ``max_file_size``) in no time and no disk (``truncate``), names it
as a file the user opens (``results.csv``) or writes it over the open
notebook, which Lab reopens with its tabs. jupyter_server reads a file whole
into one JSON reply (a file of NULs costs it about fifteen times its size),
and copies a file (a folder's duplicate, a checkpoint) by writing every
zero: the server's memory or the host's disk runs out.

With ``sandbox_kernel.lab_saves`` the server opens files up to
``SandboxContents.max_open_bytes`` and refuses larger ones with a message
saying so; downloads stream; copies keep holes as holes. A real sandboxed
kernel writes the files; a real ``jupyter lab`` server is asked as Lab asks.
The control is jupyter_server's own behaviour, shown with a file small
enough to be safe.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.lab_helpers import LabServer, notebook_json, serving
from jupyter_server.services.contents.filemanager import FileContentsManager
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from kernel_helpers import SandboxKernelHandle, peak_mib, require_bwrap, shared_data_kernel
from tornado.web import HTTPError

from sandbox_kernel import lab_saves

pytestmark = pytest.mark.timeout(300)

#: as large as a sandbox may make a file by default (``max_file_size``): 4 GiB,
#: which the server would read into some 60 GiB
HUGE = 4 * 2**30
#: the guarded server's limits here (set on its command line, as a user would)
LIMIT = 2_000_000
ENTRIES = 1000
CELLS = 500

#: what the sandbox does: only file writes and truncate, which any cell may
MAKE = f"""
import json, os
os.chdir('/workspace')
os.makedirs('data', exist_ok=True)
for name in ('results.csv', 'data/big.bin'):
    with open(name, 'wb') as f:
        f.truncate({HUGE})
with open('nb.ipynb', 'r+b') as f:  # the notebook the user has open, grown to 4 GiB of NULs
    f.truncate({HUGE})
open('table.csv', 'w').write('x,y\\n' * {(LIMIT + 1_000_000) // 4})
open('small.csv', 'w').write('x,y\\n' * {(LIMIT - 1000) // 4})
os.makedirs('many')
for number in range({ENTRIES + 1}):  # empty files: they cost the sandbox nothing
    open(f'many/{{number:06d}}.txt', 'w').close()
print('made')
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LabServer]]:
    require_bwrap()
    root = tmp_path_factory.mktemp("lab-large")
    with (
        serving(
            root / "guarded",
            root / "guarded.log",
            extra_args=[
                f"--SandboxContents.max_open_bytes={LIMIT}",
                f"--SandboxContents.max_listed_entries={ENTRIES}",
                f"--SandboxContents.max_notebook_cells={CELLS}",
            ],
        ) as guarded,
        serving(root / "control", root / "control.log", protected=False) as control,
    ):
        yield {"guarded": guarded, "control": control}


@pytest.fixture(scope="module")
def made(servers: dict[str, LabServer]) -> Iterator[dict[str, SandboxKernelHandle]]:
    """Each server's ``work`` folder once its sandbox made the files."""
    kernels: dict[str, SandboxKernelHandle] = {}
    try:
        for which, server in servers.items():
            workspace = server.notebooks / "work"
            workspace.mkdir()
            (workspace / "nb.ipynb").write_text(json.dumps(notebook_json(["1"])))
            kernel = shared_data_kernel(workspace, server.root / "kernel", server.data_dir)
            kernels[which] = kernel
            run = kernel.run(MAKE)
            assert run.status == "ok" and run.stdout.strip() == "made", (run.stderr, run.errors)
        yield kernels
    finally:
        for kernel in kernels.values():
            kernel.shutdown()


def _get(server: LabServer, path: str, query: str = "content=1") -> tuple[int, Any]:
    try:
        return 200, server.request("GET", f"/api/contents/{urllib.parse.quote(path)}?{query}", timeout=120)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")


def _disk_bytes(path: Path) -> int:
    return path.stat().st_blocks * 512


@pytest.mark.usefixtures("made")
def test_a_huge_file_or_notebook_is_refused_with_its_size_and_the_server_keeps_its_memory(
    servers: dict[str, LabServer],
) -> None:
    server = servers["guarded"]
    before = peak_mib(server.proc.pid)
    for path, query in (
        ("work/results.csv", "type=file&format=text&content=1"),  # how Lab's editor opens it
        ("work/results.csv", "content=1"),
        ("work/nb.ipynb", "type=notebook&content=1"),  # Lab reopening the notebook's tab
    ):
        status, message = _get(server, path, query)
        assert status == 403, (path, status, str(message)[:200])
        assert f"{path} is {HUGE:,} bytes" in message and "SandboxContents.max_open_bytes" in message, message
        assert "Download it instead" in message
    assert peak_mib(server.proc.pid) - before < 100, (before, peak_mib(server.proc.pid))
    # the listing and a file's model without its content are as before
    status, listing = _get(server, "work", "content=1")
    assert status == 200 and {"results.csv", "nb.ipynb", "data"} <= {m["name"] for m in listing["content"]}
    status, model = _get(server, "work/results.csv", "content=0")
    assert status == 200 and model["size"] == HUGE


def test_larger_than_the_configured_limit_is_refused_smaller_opens_and_the_control_opens_both(
    servers: dict[str, LabServer], made: dict[str, SandboxKernelHandle]
) -> None:
    status, message = _get(servers["guarded"], "work/table.csv")
    size = (LIMIT + 1_000_000) // 4 * 4
    assert status == 403 and f"work/table.csv is {size:,} bytes" in message and f"{LIMIT:,} bytes" in message
    status, model = _get(servers["guarded"], "work/small.csv")
    assert status == 200 and model["content"].startswith("x,y\n") and len(model["content"]) == (LIMIT - 1000) // 4 * 4
    # jupyter_server's own behaviour: any size is read whole (the 4 GiB would be too)
    status, model = _get(servers["control"], "work/table.csv")
    assert status == 200 and len(model["content"]) == size


@pytest.mark.usefixtures("made")
def test_a_download_of_a_file_too_large_to_open_is_streamed(servers: dict[str, LabServer]) -> None:
    server = servers["guarded"]
    before = peak_mib(server.proc.pid)
    request = urllib.request.Request(
        f"{server.base_url}/files/work/results.csv?download=1", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert int(answer.headers["Content-Length"]) == HUGE
        start = answer.read(8 * 2**20)
    assert start == bytes(8 * 2**20)
    assert peak_mib(server.proc.pid) - before < 100


def test_duplicating_a_folder_and_checkpointing_keep_holes_as_holes(
    servers: dict[str, LabServer], made: dict[str, SandboxKernelHandle]
) -> None:
    server = servers["guarded"]
    work = server.notebooks / "work"
    status = server.request("POST", "/api/contents/work", {"copy_from": "work/data"})
    copy = work / status["name"] / "big.bin"
    assert copy.stat().st_size == HUGE and _disk_bytes(copy) < 2**20, _disk_bytes(copy)
    checkpoint = server.request("POST", "/api/contents/work/nb.ipynb/checkpoints")
    saved = work / ".ipynb_checkpoints" / f"nb-{checkpoint['id']}.ipynb"
    assert saved.stat().st_size == HUGE and _disk_bytes(saved) < 2**20
    # the restore copies it back the same way
    (work / "nb.ipynb").write_text("{}")
    server.request("POST", f"/api/contents/work/nb.ipynb/checkpoints/{checkpoint['id']}")
    assert (work / "nb.ipynb").stat().st_size == HUGE and _disk_bytes(work / "nb.ipynb") < 2**20
    # a file's duplicate reads it whole, as the editor does: refused, not the memory exhausted
    status, message = _get_post(server, "work", {"copy_from": "work/results.csv"})
    assert status == 403 and f"work/results.csv is {HUGE:,} bytes" in message
    # what the sandbox reads of the copies: the same zeros
    run = made["guarded"].run(
        f"import os\nf = open('/workspace/{copy.parent.name}/big.bin', 'rb')\nf.seek({HUGE - 4})\nprint(f.read())"
    )
    assert run.stdout.strip() == repr(bytes(4)), run.stderr


def _get_post(server: LabServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    try:
        return 200, server.request("POST", f"/api/contents/{urllib.parse.quote(path)}", body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")


def test_a_file_grown_after_it_was_opened_is_refused_at_the_limit(tmp_path: Path) -> None:
    """The size is checked at the open, and the reads are counted: a sandbox
    growing the file between the two gets no more than the limit read."""
    manager = AsyncLargeFileManager(root_dir=str(tmp_path))
    assert lab_saves.guard(manager, 1000)
    (tmp_path / "grows.txt").write_text("x" * 900)
    with manager.open(str(tmp_path / "grows.txt"), "rb") as f:
        with open(tmp_path / "grows.txt", "a") as more:  # what a cell does meanwhile
            more.write("x" * 200)
        with pytest.raises(HTTPError) as refused:
            f.read()
    assert refused.value.status_code == 403 and "grows.txt has grown past the limit" in str(refused.value.log_message)
    # a file at the limit opens, one byte more does not
    (tmp_path / "exact.txt").write_text("y" * 1000)
    model = asyncio.run(manager.get("exact.txt", content=True, type="file", format="text"))
    assert model["content"] == "y" * 1000
    (tmp_path / "exact.txt").write_text("y" * 1001)
    with pytest.raises(HTTPError, match=r"exact\.txt is 1,001 bytes"):
        asyncio.run(manager.get("exact.txt", content=True, type="file", format="text"))


def test_the_default_limit_and_no_limit(tmp_path: Path) -> None:
    assert lab_saves.SandboxContents().max_open_bytes == lab_saves.DEFAULT_MAX_OPEN_BYTES == 100 * 2**20
    assert lab_saves.SandboxContents().max_listed_entries == lab_saves.DEFAULT_MAX_LISTED_ENTRIES == 20_000
    assert lab_saves.SandboxContents().max_notebook_cells == lab_saves.DEFAULT_MAX_NOTEBOOK_CELLS == 20_000
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(lab_saves.DEFAULT_MAX_OPEN_BYTES + 1)
    (tmp_path / "small.txt").write_text("z" * 5000)
    guarded = AsyncLargeFileManager(root_dir=str(tmp_path))
    assert lab_saves.guard(guarded)
    with pytest.raises(HTTPError, match=f"big.bin is {lab_saves.DEFAULT_MAX_OPEN_BYTES + 1:,} bytes"):
        asyncio.run(guarded.get("big.bin", content=True, type="file"))
    assert asyncio.run(guarded.get("small.txt", content=True, type="file"))["content"] == "z" * 5000
    unlimited = AsyncLargeFileManager(root_dir=str(tmp_path))
    assert lab_saves.guard(unlimited, 0)
    (tmp_path / "small.txt").write_text("z" * 5000)
    with open(tmp_path / "mid.bin", "wb") as f:
        f.truncate(3 * 2**20)
    assert len(asyncio.run(unlimited.get("mid.bin", content=True, type="file", format="base64"))["content"]) > 3 * 2**20


@pytest.mark.usefixtures("made")
def test_a_folder_of_too_many_entries_is_not_listed(servers: dict[str, LabServer]) -> None:
    """A sandbox makes 200,000 files in seconds, and each listing of them
    took the server 83 s and 755 MiB (an attack review): a folder of more
    than ``max_listed_entries`` gets a 403 saying so."""
    status, message = _get(servers["guarded"], "work/many")
    assert status == 403 and f"work/many holds {ENTRIES + 1:,} entries" in message, message
    assert "SandboxContents.max_listed_entries" in message
    status, listing = _get(servers["guarded"], "work")  # the folder holding it lists as before
    assert status == 200 and "many" in {m["name"] for m in listing["content"]}
    assert _get(servers["guarded"], "work/many", "content=0")[0] == 200
    status, listing = _get(servers["control"], "work/many")  # jupyter_server lists any number
    assert status == 200 and len(listing["content"]) == ENTRIES + 1


@pytest.mark.parametrize("manager", ["async", "sync"])
def test_a_folder_swapped_in_after_the_count_is_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manager: str
) -> None:
    """The folder was counted by one read and listed by jupyter_server's
    own, a second one: a sandbox watching the small folder it asked the user
    to open (inotify sees the server's read through the mount) swapped a
    folder of 100,000 entries in between (``renameat2(RENAME_EXCHANGE)``, an
    attack review: listed whole on the first try, 21 s of the server). The
    swap is made here just after the count, as the sandbox makes it; the
    listing's own read must refuse it."""
    from jupyter_server.services.contents import filecheckpoints, filemanager

    for module in (filemanager, filecheckpoints):  # install_calls replaces them: undone after the test
        monkeypatch.setattr(module, "os", module.os)
        monkeypatch.setattr(module, "shutil", module.shutil)
    monkeypatch.setattr(filemanager, "send2trash", filemanager.send2trash)
    monkeypatch.setattr(filecheckpoints, "ensure_dir_exists", filecheckpoints.ensure_dir_exists)
    (tmp_path / "view").mkdir()
    (tmp_path / "view" / "a.txt").write_text("a")
    (tmp_path / "big").mkdir()
    for number in range(50):
        (tmp_path / "big" / f"{number}.txt").touch()
    contents = (AsyncLargeFileManager if manager == "async" else FileContentsManager)(root_dir=str(tmp_path))
    assert lab_saves.guard(contents, max_listed_entries=20)
    lab_saves.install_calls(str(tmp_path))
    counted = lab_saves._counted

    def count_then_swap(path: str, os_path: str, limit: int) -> None:
        counted(path, os_path, limit)
        os.rename(tmp_path / "view", tmp_path / "swap")
        os.rename(tmp_path / "big", tmp_path / "view")
        os.rename(tmp_path / "swap", tmp_path / "big")

    monkeypatch.setattr(lab_saves, "_counted", count_then_swap)

    def listing(path: str) -> Any:
        got = contents.get(path, content=True, type="directory")
        return asyncio.run(got) if manager == "async" else got

    with pytest.raises(HTTPError) as refused:
        listing("view")
    assert refused.value.status_code == 403, refused.value
    assert "view holds more than 20 entries" in str(refused.value.log_message)
    # the sandbox swaps them back: the small folder lists as before
    monkeypatch.setattr(lab_saves, "_counted", counted)
    count_then_swap("", str(tmp_path / "big"), 100)
    assert [m["name"] for m in listing("view")["content"]] == ["a.txt"]


#: notebooks a cell writes: one over the cell limit, one at it, the one over
#: with its keys escaped (``\u0063ell_type``), and one cell holding many braces
MAKE_NOTEBOOKS = """
import json, os
os.chdir('/workspace')
def notebook(cells):
    return json.dumps({'nbformat': 4, 'nbformat_minor': 5, 'metadata': {}, 'cells': cells})
def cell(i, source='x'):
    return {'cell_type': 'code', 'id': f'c{i}', 'metadata': {}, 'source': source, 'outputs': [], 'execution_count': None}
over = notebook([cell(i) for i in range(CELLS + 1)])
open('cells_over.ipynb', 'w').write(over)
open('cells_escaped.ipynb', 'w').write(over.replace('"cell_type"', '"\\\\u0063ell_type"'))
open('cells_at.ipynb', 'w').write(notebook([cell(i) for i in range(CELLS)]))
open('braces.ipynb', 'w').write(notebook([cell(0, '{' * (4 * CELLS))]))
print('made')
""".replace("CELLS", str(CELLS))


def test_a_notebook_of_too_many_cells_is_not_opened(
    servers: dict[str, LabServer], made: dict[str, SandboxKernelHandle]
) -> None:
    """nbformat parses and validates a notebook cell by cell while the
    server waits: a sandbox's million-cell notebook (46 MB, under
    ``max_open_bytes``) took 61 s and 1.5 GiB to open. A notebook of more
    than ``max_notebook_cells`` gets a 403 saying so, counted on the text the
    server parses (escaped keys do not hide a cell)."""
    for kernel in made.values():
        run = kernel.run(MAKE_NOTEBOOKS)
        assert run.status == "ok" and run.stdout.strip() == "made", (run.stderr, run.errors)
    guarded, control = servers["guarded"], servers["control"]
    assert '"\\u0063ell_type"' in (guarded.notebooks / "work" / "cells_escaped.ipynb").read_text()
    for name in ("cells_over.ipynb", "cells_escaped.ipynb"):
        for query in ("type=notebook&content=1", "content=1", "type=notebook&content=1&hash=1"):
            status, message = _get(guarded, f"work/{name}", query)
            assert status == 403, (name, query, status, str(message)[:200])
            assert f"work/{name} holds {CELLS + 1:,} cells" in message, message
            assert "SandboxContents.max_notebook_cells" in message and "text editor" in message
        # opened as text (Lab's "Open With > Editor"), within max_open_bytes, it is a file like any other
        status, model = _get(guarded, f"work/{name}", "type=file&format=text&content=1")
        assert status == 200 and len(json.loads(model["content"])["cells"]) == CELLS + 1
        # jupyter_server's own behaviour: any number of cells is parsed
        status, model = _get(control, f"work/{name}", "type=notebook&content=1")
        assert status == 200 and len(model["content"]["cells"]) == CELLS + 1
    status, model = _get(guarded, "work/cells_at.ipynb", "type=notebook&content=1")
    assert status == 200 and len(model["content"]["cells"]) == CELLS
    status, model = _get(guarded, "work/braces.ipynb", "type=notebook&content=1")
    assert status == 200 and model["content"]["cells"][0]["source"] == "{" * (4 * CELLS)


def test_the_sync_manager_and_checkpoints_count_cells_too(tmp_path: Path) -> None:
    from jupyter_server.services.contents.filemanager import FileContentsManager

    cells = [{"cell_type": "markdown", "id": f"m{i}", "metadata": {}, "source": "m"} for i in range(11)]
    text = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})
    (tmp_path / "over.ipynb").write_text(text)
    manager = FileContentsManager(root_dir=str(tmp_path))
    assert lab_saves.guard(manager, max_notebook_cells=10)
    with pytest.raises(HTTPError, match=r"over\.ipynb holds 11 cells"):
        manager.get("over.ipynb", content=True, type="notebook")
    assert manager.get("over.ipynb", content=False, type="notebook")["content"] is None
    checkpoints = manager.checkpoints
    os_path = str(tmp_path / "over.ipynb")
    with pytest.raises(HTTPError, match=r"over\.ipynb holds 11 cells"):
        checkpoints._read_notebook(os_path)
    unlimited = FileContentsManager(root_dir=str(tmp_path))
    assert lab_saves.guard(unlimited, max_notebook_cells=0)
    assert len(unlimited.get("over.ipynb", content=True, type="notebook")["content"]["cells"]) == 11
