"""The ratchet's folder levels follow moves and copies (sandbox_kernel/privacy/folder_moves.py),
and JupyterLab's contents manager applies them (sandbox_kernel/lab_folder_moves.py).

Each rule against a real store and real folders, and the hook on jupyter_server's
own contents managers (sync and async). The end-to-end attack, with kernels and
a Lab server and its control, is tests/test_folder_moves_lab.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from jupyter_server.services.contents.filemanager import AsyncFileContentsManager, FileContentsManager
from tornado.web import HTTPError

from sandbox_kernel.lab_folder_moves import guard
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.enforcement import EnforcementRecord
from sandbox_kernel.privacy.folder_moves import MoveRefused, TargetTaken, guard_copy, guard_move
from sandbox_kernel.privacy.workspace_levels import EXACT, WorkspaceLevels, _key

CONF, SECRET, PUBLIC = Sensitivity.CONFIDENTIAL, Sensitivity.SECRET, Sensitivity.PUBLIC


#: the unprivileged user a check runs as when the tests run as root
NOBODY = 65534


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "data" / "privacy"


@pytest.fixture
def levels(store: Path) -> WorkspaceLevels:
    return WorkspaceLevels.beside(PrivacyStore(store))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """notebooks/: a private folder (with a file), a public one, and a project
    holding a private and a public folder."""
    nb = tmp_path / "notebooks"
    for folder in ("Untitled Folder", "public", "projects/a/deep", "projects/b"):
        (nb / folder).mkdir(parents=True)
    (nb / "Untitled Folder" / "rows.csv").write_text("ada,42\n")
    (nb / "projects" / "a" / "deep" / "rows.csv").write_text("bob,7\n")
    return nb


def _private(levels: WorkspaceLevels, folder: Path, level: Sensitivity = CONF) -> None:
    """As a kernel's ratchet records its workspace when its session rises."""
    levels.record(folder, level, f"session s-{folder.name} became {level.name} with this folder as its workspace")


def _level(levels: WorkspaceLevels, folder: Path) -> Sensitivity:
    """What a new session with ``folder`` as its workspace starts at."""
    return levels.read(folder).sensitivity


def _move(source: Path, target: Path, store: Path) -> None:
    guard_move(source, target, [store])
    os.rename(source, target)


def test_a_renamed_private_folder_stays_private(levels: WorkspaceLevels, store: Path, root: Path) -> None:
    _private(levels, root / "Untitled Folder")
    _move(root / "Untitled Folder", root / "analysis", store)
    assert _level(levels, root / "analysis") == CONF
    mark = levels.exact(root / "analysis").mark
    assert mark is not None and "moved here from" in mark.reason and "Untitled Folder" in mark.reason
    assert _level(levels, root / "public") == PUBLIC, "a sibling must not rise"


def test_a_folder_holding_private_folders_carries_each_and_no_more(
    levels: WorkspaceLevels, store: Path, root: Path
) -> None:
    _private(levels, root / "projects" / "a", SECRET)
    _private(levels, root / "projects" / "a" / "deep", CONF)  # lower, still recorded at its own place
    _move(root / "projects", root / "public" / "work", store)
    work = root / "public" / "work"
    assert _level(levels, work / "a") == SECRET
    assert levels.exact(work / "a" / "deep").sensitivity == CONF
    assert _level(levels, work / "b") == PUBLIC, "a public folder moved with a private one stays public"
    # the folders that now hold a private one rise for the sessions working in them
    assert _level(levels, work) == SECRET and _level(levels, root / "public") == SECRET


def test_a_folder_moved_out_of_a_private_one_takes_its_level(levels: WorkspaceLevels, store: Path, root: Path) -> None:
    (root / "Untitled Folder" / "sub").mkdir()
    _private(levels, root / "Untitled Folder")
    _move(root / "Untitled Folder" / "sub", root / "public" / "sub", store)
    assert _level(levels, root / "public" / "sub") == CONF
    assert _level(levels, root / "public") == CONF, "a session in the folder now holding it must rise too"


def test_a_private_file_does_not_move_into_a_lower_folder(levels: WorkspaceLevels, store: Path, root: Path) -> None:
    _private(levels, root / "Untitled Folder")
    with pytest.raises(MoveRefused) as refused:
        guard_move(root / "Untitled Folder" / "rows.csv", root / "public" / "rows.csv", [store])
    message = str(refused.value)
    assert "Not moved" in message and "CONFIDENTIAL" in message and "PUBLIC" in message and "rows.csv" in message
    assert _level(levels, root / "public") == PUBLIC, "a refusal records nothing"
    # into a folder as private, or inside the private folder itself: allowed
    _private(levels, root / "projects" / "b", SECRET)
    guard_move(root / "Untitled Folder" / "rows.csv", root / "projects" / "b" / "rows.csv", [store])
    (root / "Untitled Folder" / "old").mkdir()
    guard_move(root / "Untitled Folder" / "rows.csv", root / "Untitled Folder" / "old" / "rows.csv", [store])
    # a public file goes anywhere
    (root / "public" / "notes.txt").write_text("hello")
    guard_move(root / "public" / "notes.txt", root / "projects" / "notes.txt", [store])


def test_copies_of_private_data_stay_where_every_reader_is_as_private(
    levels: WorkspaceLevels, store: Path, root: Path
) -> None:
    _private(levels, root / "projects" / "a" / "deep")
    for source, destination in (
        (root / "projects" / "a" / "deep" / "rows.csv", root / "public"),  # a file
        (root / "projects" / "a" / "deep", root / "projects" / "a"),  # duplicated beside itself
        (root / "projects", root / "public"),  # a folder holding a private one
    ):
        with pytest.raises(MoveRefused, match="Not copied"):
            guard_copy(source, destination, [store])
    guard_copy(root / "projects" / "a" / "deep" / "rows.csv", root / "projects" / "a" / "deep", [store])
    guard_copy(root / "projects" / "b", root / "public", [store])  # nothing private in it
    assert _level(levels, root / "public") == PUBLIC


def test_an_unreadable_record_refuses_and_names_it(levels: WorkspaceLevels, store: Path, root: Path) -> None:
    _private(levels, root / "Untitled Folder")
    record = levels.store.path_for(EXACT, _key(root / "Untitled Folder"))
    record.write_text("{not json")
    with pytest.raises(MoveRefused, match="cannot be read"):
        guard_move(root / "Untitled Folder", root / "analysis", [store])
    assert not levels.exact(root / "analysis").has_private_data


def test_links_and_taken_names_carry_nothing(levels: WorkspaceLevels, store: Path, root: Path) -> None:
    _private(levels, root / "Untitled Folder")
    (root / "link").symlink_to(root / "Untitled Folder")
    guard_move(root / "link", root / "public" / "link", [store])  # the link moves, not the folder
    with pytest.raises(TargetTaken, match="already exists"):  # nothing may be recorded there
        guard_move(root / "Untitled Folder", root / "public", [store])
    assert _level(levels, root / "public" / "link") == PUBLIC
    assert levels.exact(root / "public").sensitivity == PUBLIC


def test_live_sandboxes_with_network_keep_what_they_can_reach(store: Path, root: Path) -> None:
    """A cell may hold a descriptor on a folder inside its workspace (it would
    reach it at its new place), and a sandbox reads its new place's level only
    at its next poll; its own folder may move elsewhere (its session follows it)."""
    levels = WorkspaceLevels.beside(PrivacyStore(store))
    _private(levels, root / "Untitled Folder")
    (root / "public" / "sub").mkdir()
    record = EnforcementRecord(store, "u", "s", workspace=root / "public")
    try:
        record.report(Sensitivity.PUBLIC, has_network=True)  # as a live engine session does
        with pytest.raises(MoveRefused, match=r"inside the folder of a sandbox with network \(kernel process \d+"):
            guard_move(root / "public" / "sub", root / "projects" / "sub", [store])
        for source in (root / "public", root):  # its folder, a folder holding it: not into a private one
            with pytest.raises(MoveRefused, match="would work beside private data"):
                guard_move(source, root / "Untitled Folder" / "x", [store])
        # private data does not land where it works: it would read it before its next poll cuts it
        with pytest.raises(MoveRefused, match="where it would land"):
            guard_move(root / "Untitled Folder", root / "public" / "sub" / "rows", [store])
        guard_move(root / "projects" / "b", root / "public" / "b", [store])  # public data: allowed
        (root / "public" / "notes.txt").write_text("x")
        guard_move(root / "public" / "notes.txt", root / "notes.txt", [store])  # a file, to a public folder
        # into a private folder, a file a cell keeps open would show it what a private session writes there
        with pytest.raises(MoveRefused, match="may keep the file open"):
            guard_move(root / "public" / "notes.txt", root / "Untitled Folder" / "notes.txt", [store])
        (root / "projects" / "b" / "other.txt").write_text("x")  # a file from elsewhere: allowed
        guard_move(root / "projects" / "b" / "other.txt", root / "Untitled Folder" / "other.txt", [store])
        guard_move(root / "public", root / "projects" / "renamed", [store])  # its own folder, to a public place
        assert levels.read(root / "projects" / "renamed").sensitivity == PUBLIC
        record.report(Sensitivity.CONFIDENTIAL, has_network=False)  # cut: nothing can leave any more
        guard_move(root / "public" / "sub", root / "projects" / "sub", [store])
        guard_move(root / "Untitled Folder", root / "public" / "sub" / "rows", [store])
        guard_move(root / "public" / "notes.txt", root / "Untitled Folder" / "notes.txt", [store])
    finally:
        record.close()


@pytest.mark.parametrize("manager", [FileContentsManager, AsyncFileContentsManager])
def test_jupyter_servers_contents_managers_apply_the_rules(
    manager: type, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook on the managers Lab's file browser calls (PATCH and POST of /api/contents)."""
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "data"))
    levels = WorkspaceLevels.beside(PrivacyStore(tmp_path / "data" / "privacy"))
    _private(levels, root / "Untitled Folder")
    cm = manager(root_dir=str(root))
    assert guard(cm)

    async def call(result: object) -> object:
        return await result if asyncio.iscoroutine(result) else result

    async def scenario() -> None:
        with pytest.raises(HTTPError) as refused:
            await call(cm.rename("Untitled Folder/rows.csv", "public/rows.csv"))
        assert refused.value.status_code == 403 and "'Untitled Folder/rows.csv'" in str(refused.value.log_message)
        assert (root / "Untitled Folder" / "rows.csv").exists()
        with pytest.raises(HTTPError, match="Not copied"):
            await call(cm.copy("Untitled Folder/rows.csv", "public"))
        await call(cm.copy("Untitled Folder/rows.csv"))  # a copy beside it stays in the private folder
        assert (root / "Untitled Folder" / "rows-Copy1.csv").exists()
        await call(cm.rename("Untitled Folder", "analysis"))
        assert _level(levels, root / "analysis") == CONF
        await call(cm.copy("public", "projects"))  # public data: as jupyter_server does it

    asyncio.run(scenario())


def test_a_taken_name_does_not_skip_the_refusals(store: Path, root: Path) -> None:
    """The contents manager refuses a taken name only at its own later look. A
    sandbox flipping the target name (mkdir/rmdir in a loop) made this guard
    see it taken and return early, while the manager then found it free and
    moved the private folder into the networked sandbox's folder (about one
    try in 30 in the attack). The refusals now run whatever the name holds;
    only the records wait for a move that can happen."""
    levels = WorkspaceLevels.beside(PrivacyStore(store))
    _private(levels, root / "Untitled Folder")
    (root / "public" / "rows").mkdir()  # the name, taken at the guard's look
    record = EnforcementRecord(store, "u", "s", workspace=root / "public")
    try:
        record.report(Sensitivity.PUBLIC, has_network=True)
        with pytest.raises(MoveRefused, match="where it would land"):
            guard_move(root / "Untitled Folder", root / "public" / "rows", [store])
        (root / "public" / "rows.csv").write_text("taken")
        with pytest.raises(MoveRefused, match="PUBLIC"):
            guard_move(root / "Untitled Folder" / "rows.csv", root / "public" / "rows.csv", [store])
    finally:
        record.close()
    assert levels.exact(root / "public" / "rows").sensitivity == PUBLIC  # a taken name records nothing


def test_a_file_with_other_names_does_not_go_into_a_more_private_folder(
    levels: WorkspaceLevels, store: Path, root: Path
) -> None:
    """A public sandbox may hard-link a file (``os.link``: its own files, in its
    folder). Moved into a private folder, the file keeps its other name where
    it was, and what a private session writes into it there (open('w'),
    to_csv, jupyter_server's own save) was readable through that name by the
    next public notebook, with network."""
    _private(levels, root / "Untitled Folder")
    results = root / "public" / "results.csv"
    results.write_text("a,b\n")
    os.link(results, root / "public" / ".results.csv.swp")
    with pytest.raises(MoveRefused, match=r"1 other name\(s\) \(hard links\)"):
        guard_move(results, root / "Untitled Folder" / "results.csv", [store])
    guard_move(results, root / "projects" / "results.csv", [store])  # as public there: nothing to show
    os.unlink(root / "public" / ".results.csv.swp")
    guard_move(results, root / "Untitled Folder" / "results.csv", [store])  # one name: it may go


def test_a_folder_holding_files_with_other_names_does_not_go_into_a_more_private_folder(
    levels: WorkspaceLevels, store: Path, root: Path
) -> None:
    """The same through a folder: a public sandbox hard-links a file of a
    subfolder to a name outside it, and the user drags the subfolder into a
    private one (an attack review found the folder move unchecked)."""
    _private(levels, root / "Untitled Folder")
    (root / "public" / "run" / "deep").mkdir(parents=True)
    rows = root / "public" / "run" / "deep" / "rows.csv"
    rows.write_text("a,b\n")
    os.link(rows, root / "public" / ".rows.csv.swp")
    with pytest.raises(MoveRefused, match=r"holds files with other names \(hard links: .*rows\.csv\)"):
        guard_move(root / "public" / "run", root / "Untitled Folder" / "run", [store])
    guard_move(root / "public" / "run", root / "projects" / "run", [store])  # as public there
    os.unlink(root / "public" / ".rows.csv.swp")
    guard_move(root / "public" / "run", root / "Untitled Folder" / "run", [store])


def test_a_folder_that_cannot_be_looked_through_does_not_go_into_a_more_private_folder(tmp_path: Path) -> None:
    """A public sandbox hard-links a file of a subfolder to a name outside
    it, then takes the subfolder's read bit (mode 0o300: its files stay
    usable by their known names): the look for hard links skipped folders it
    could not list (an attack review). Run as an ordinary user: root reads
    any folder."""
    if os.geteuid() != 0 and os.geteuid() != NOBODY:
        pytest.skip("needs root (to run the check as another user) or that user")
    # a folder the other user can reach (pytest's own are its owner's only)
    tree = Path(tempfile.mkdtemp(prefix="sandbox-kernel-test-"))
    tree.chmod(0o777)
    script = f"""
import os, sys
from pathlib import Path
from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.folder_moves import MoveRefused, guard_move
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels
root = Path({str(tree)!r})
store = root / "store"
levels = WorkspaceLevels.beside(PrivacyStore(store))
(root / "private").mkdir(parents=True)
levels.record(root / "private", Sensitivity.CONFIDENTIAL, "a private session's folder")
(root / "public" / "run" / "locked").mkdir(parents=True)
rows = root / "public" / "run" / "locked" / "rows.csv"
rows.write_text("a,b\\n")
os.link(rows, root / "public" / ".cache")
os.chmod(root / "public" / "run" / "locked", 0o300)
try:
    guard_move(root / "public" / "run", root / "private" / "run", [store])
except MoveRefused as exc:
    print(exc)
else:
    print("moved")
"""
    try:
        run = subprocess.run(
            [
                *(
                    []
                    if os.geteuid() == NOBODY
                    else ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
                ),
                sys.executable,
                "-c",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(tree)},
        )
    finally:
        if os.geteuid() == 0:
            shutil.rmtree(tree)
        else:
            (tree / "public" / "run" / "locked").chmod(0o700)
            shutil.rmtree(tree)
    assert run.returncode == 0, run.stderr
    assert "public/run/locked cannot be looked at (Permission denied)" in run.stdout, run.stdout
    assert "could not all be checked for other names" in run.stdout
