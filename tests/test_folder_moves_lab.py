"""Moving files in JupyterLab must not take private data out of the ratchet's reach.

End to end: real sandboxed kernels (bwrap, network while public) share their
ratchet store with a real ``jupyter lab`` server, and the file browser's own
requests (PATCH and POST of ``/api/contents``) move and copy what a private
session wrote. The control server has jupyter_server's own behaviour (no
``lab_content_policy.apply``, so no ``sandbox_kernel.lab_folder_moves``): there
each attack works, and a notebook with network reads the private rows.

Kept out of tests/browser: nothing here needs a browser, only the same server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser.lab_helpers import LabServer, contents_status, guarded_and_control
from kernel_helpers import SandboxKernelHandle, require_bwrap, shared_data_kernel, status_of

from sandbox_kernel.privacy import PrivacyStore
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"
ROWS = "ada,42\n"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LabServer]]:
    require_bwrap()
    with guarded_and_control(tmp_path_factory.mktemp("folder-moves")) as servers:
        yield servers


def _kernel(server: LabServer, folder: str) -> SandboxKernelHandle:
    workspace = server.notebooks / folder
    return shared_data_kernel(workspace, server.root / "kernels" / folder.replace("/", "_"), server.data_dir)


def _private_folder(server: LabServer, folder: str) -> None:
    """A private session's folder, with the rows it wrote; its kernel shut down."""
    k = _kernel(server, folder)
    try:
        k.run("%private patients CONFIDENTIAL")
        run = k.run(f"open('/workspace/rows.csv', 'w').write({ROWS!r})")
        assert run.status == "ok" and k.run(IFACES).stdout.strip() == "['lo']", (run.stderr, run.errors)
    finally:
        k.shutdown()


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_renamed_private_folder_stays_private(servers: dict[str, LabServer], which: str) -> None:
    """The file browser's "Untitled Folder", renamed into a folder 'done' once the
    work in it turned private. A notebook opened in 'done' (which now
    holds the rows) comes first: the folder's identity (privacy/folder_identity.py)
    keeps the renamed folder private even in the control, but only the Lab
    check records its new place before the move, so the folder around it knows."""
    server = servers[which]
    _private_folder(server, "Untitled Folder")
    (server.notebooks / "done").mkdir()
    assert contents_status(server, "PATCH", "Untitled Folder", {"path": "done/analysis"}) == (200, "")
    around = _kernel(server, "done")
    try:
        run = around.run(f"print(open('/workspace/analysis/rows.csv').read() == {ROWS!r})\n" + IFACES)
        lines = run.stdout.splitlines()
        assert lines[0] == "True", (run.stdout, run.stderr)
        if which == "control":  # the attack: the notebook in 'done' had network beside the rows
            assert lines[1] != "['lo']", "the control kept the level: the attack is not shown"
        else:
            assert lines[1] == "['lo']", f"a notebook around the renamed private folder has network: {run.stdout}"
    finally:
        around.shutdown()
    k = _kernel(server, "done/analysis")
    try:
        assert k.run(IFACES).stdout.strip() == "['lo']", "a notebook in the renamed private folder has network"
        # the status item says why (kernel_helpers reads its comm as the widget does)
        causes = [d["name"] for d in status_of(k).get("datasets", []) if d.get("source") == "workspace"]
        said = "moved here from" if which == "guarded" else "with this folder"
        assert any(said in c for c in causes), causes
        # the whole reason (the widget's line is cut at 200 characters) names the first folder
        levels = WorkspaceLevels.beside(PrivacyStore(server.data_dir / "privacy"))
        mark = levels.read(server.notebooks / "done" / "analysis").mark
        assert mark is not None and "Untitled Folder" in mark.reason, mark
    finally:
        k.shutdown()


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_private_rows_do_not_reach_a_notebook_with_network(servers: dict[str, LabServer], which: str) -> None:
    """A notebook with network works in 'public' and keeps descriptors on its
    folder and on 'public/sub'. Moving or copying private rows (or a private
    folder) there, moving 'sub' out of it, or moving its folder into a private
    one is refused; moving its folder elsewhere is not, and the notebook follows."""
    server = servers[which]
    _private_folder(server, "trial")
    (server.notebooks / "trial" / "vault").mkdir()
    (server.notebooks / "public" / "sub").mkdir(parents=True)
    (server.notebooks / "archive").mkdir()
    live = _kernel(server, "public")
    try:
        assert live.run(IFACES).stdout.strip() != "['lo']"
        live.run("import os\nheld, sub = os.open('/workspace', os.O_RDONLY), os.open('/workspace/sub', os.O_RDONLY)")
        attempts = {
            "file copied": contents_status(server, "POST", "public", {"copy_from": "trial/rows.csv"}),
            "folder copied": contents_status(server, "POST", "public", {"copy_from": "trial"}),
            "file moved": contents_status(server, "PATCH", "trial/rows.csv", {"path": "public/moved.csv"}),
            "private folder moved in": contents_status(server, "PATCH", "trial/vault", {"path": "public/vault-moved"}),
            "folder moved out of it": contents_status(server, "PATCH", "public/sub", {"path": "trial/sub"}),
        }
        if (server.notebooks / "trial" / "sub").is_dir():  # the private session writes into its folder
            (server.notebooks / "trial" / "sub" / "later.csv").write_text(ROWS)
        seen = live.run("import os\nprint(sorted(os.listdir(held)), sorted(os.listdir(sub)))").stdout
        attempts["its folder moved into a private one"] = contents_status(
            server, "PATCH", "public", {"path": "trial/public"}
        )
        if which == "control":
            assert all(status in (200, 201) for status, _ in attempts.values()), attempts
            assert "moved.csv" in seen and "vault-moved" in seen and "later.csv" in seen, seen
            return
        for what, (status, message) in attempts.items():
            assert status == 403, (what, status, message)
        messages = {what: message for what, (_, message) in attempts.items()}
        assert "Not moved: 'trial/rows.csv' holds data of a CONFIDENTIAL session" in messages["file moved"]
        assert "'public' is PUBLIC" in messages["file moved"]
        assert messages["file copied"].startswith("Not copied") and "Not copied" in messages["folder copied"]
        assert "where it would land" in messages["private folder moved in"]
        assert "'public/sub' is inside the folder of a sandbox with network" in messages["folder moved out of it"]
        assert "would work beside private data" in messages["its folder moved into a private one"]
        assert seen.split() == ["['sub']", "[]"], f"the notebook with network sees {seen}"
        assert (server.notebooks / "trial" / "rows.csv").read_text() == ROWS, "a refused move lost the file"
        # nothing private involved: the file browser works as before
        (server.notebooks / "public" / "notes.txt").write_text("hello")
        assert contents_status(server, "PATCH", "public/notes.txt", {"path": "archive/notes.txt"}) == (200, "")
        assert contents_status(server, "PATCH", "trial/rows.csv", {"path": "trial/rows-2026.csv"}) == (200, "")
        # its own folder renamed: the notebook follows it, network and all
        assert contents_status(server, "PATCH", "public", {"path": "public-renamed"}) == (200, "")
        run = live.run("open('/workspace/after.txt', 'w').write('x')\n" + IFACES)
        assert run.stdout.strip() != "['lo']" and (server.notebooks / "public-renamed" / "after.txt").exists()
    finally:
        live.shutdown()
