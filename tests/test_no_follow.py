"""sandbox_kernel.no_follow: writes below a root go through no link, however
the folder changes while they run (the Lab server's saves use it:
tests/test_lab_saves.py attacks them with a real sandbox)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from sandbox_kernel.no_follow import (
    JUDGED,
    MAX_COPY_DEPTH,
    Changed,
    Exists,
    LinkRefused,
    NotAFile,
    TooDeep,
    TooLarge,
    append,
    copy,
    copy_data,
    copy_tree,
    judge,
    make_folder,
    make_folders,
    open_folder,
    reading,
    remove,
    remove_tree,
    rename,
    replacing,
    trash,
)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "folder").mkdir(parents=True)
    outside.mkdir()
    (outside / "host.txt").write_text("host")
    return root, outside


def test_a_link_renamed_into_place_during_the_write_is_replaced_not_followed(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    target = root / "folder" / "nb.ipynb"
    target.write_text("old")
    os.chmod(target, 0o600)
    with replacing(str(root), str(target)) as out:
        out.write("new")
        # what a sandbox does while the server writes: a link takes the name
        (root / "folder" / "link").symlink_to(outside / "host.txt")
        os.replace(root / "folder" / "link", target)
    assert not target.is_symlink() and target.read_text() == "new"
    assert (outside / "host.txt").read_text() == "host"
    assert sorted(p.name for p in (root / "folder").iterdir()) == ["nb.ipynb"]


def test_the_old_file_keeps_its_permissions_and_an_error_leaves_it(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    target = root / "folder" / "nb.ipynb"
    target.write_text("old")
    os.chmod(target, 0o640)
    with replacing(str(root), str(target)) as out:
        out.write("new\n")
    assert target.read_text() == "new\n" and oct(target.stat().st_mode & 0o777) == oct(0o640)
    with pytest.raises(RuntimeError), replacing(str(root), str(target)) as out:
        out.write("half")
        raise RuntimeError("the serializer failed")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in (root / "folder").iterdir()) == ["nb.ipynb"]


@pytest.mark.parametrize("where", ["name", "folder"])
def test_a_link_below_the_root_is_refused_by_name(tree: tuple[Path, Path], where: str) -> None:
    root, outside = tree
    if where == "name":
        (root / "folder" / "nb.ipynb").symlink_to(outside / "host.txt")
        path, link = root / "folder" / "nb.ipynb", root / "folder" / "nb.ipynb"
    else:
        (root / "folder" / "sub").symlink_to(outside, target_is_directory=True)
        path, link = root / "folder" / "sub" / "host.txt", root / "folder" / "sub"
    with pytest.raises(LinkRefused) as refused, replacing(str(root), str(path)) as out:
        out.write("sandbox")
    assert refused.value.link == str(link) and "is a symbolic link" in str(refused.value)
    with pytest.raises(LinkRefused):
        append(str(root), str(path), b"more")
    with pytest.raises(LinkRefused), reading(str(root), str(path)):
        pass
    assert (outside / "host.txt").read_text() == "host"


def test_a_root_reached_through_a_link_is_the_users_choice(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = tree
    (tmp_path / "via").symlink_to(root, target_is_directory=True)
    with replacing(str(tmp_path / "via"), str(tmp_path / "via" / "folder" / "a.txt")) as out:
        out.write("a")
    assert (root / "folder" / "a.txt").read_text() == "a"


def test_a_path_outside_the_root_checks_its_own_name(tree: tuple[Path, Path], tmp_path: Path) -> None:
    # (jupyter_server puts checkpoints in the system's temporary folder when
    # the file's folder is not writable)
    root, outside = tree
    (outside / "cp.txt").symlink_to(outside / "host.txt")
    with pytest.raises(LinkRefused), replacing(str(root), str(outside / "cp.txt")) as out:
        out.write("x")
    folder, name = open_folder(str(root), str(outside / "new.txt"))
    os.close(folder)
    assert name == "new.txt"


def test_copy_keeps_times_and_refuses_a_linked_source(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    source = root / "folder" / "nb.ipynb"
    source.write_text("content")
    os.utime(source, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    copy(str(root), str(source), str(root / "folder" / "copy.ipynb"))
    assert (root / "folder" / "copy.ipynb").read_text() == "content"
    assert (root / "folder" / "copy.ipynb").stat().st_mtime_ns == 1_000_000_000_000_000_000
    (root / "folder" / "notes.md").symlink_to(outside / "host.txt")
    with pytest.raises(LinkRefused):
        copy(str(root), str(root / "folder" / "notes.md"), str(root / "folder" / "stolen.md"))
    assert not (root / "folder" / "stolen.md").exists()
    append(str(root), str(source), b" more")
    assert source.read_text() == "content more"


def test_rename_moves_onto_a_free_name_only_and_through_no_link(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "folder" / "a.txt").write_text("a")
    # a link (to a host folder) at the new name: moved onto, not into
    (root / "folder" / "b.txt").symlink_to(outside, target_is_directory=True)
    with pytest.raises(Exists):
        rename(str(root), str(root / "folder" / "a.txt"), str(root / "folder" / "b.txt"))
    (root / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LinkRefused):
        rename(str(root), str(root / "folder" / "a.txt"), str(root / "linked" / "a.txt"))
    rename(str(root), str(root / "folder" / "a.txt"), str(root / "folder" / "c.txt"))
    assert (root / "folder" / "c.txt").read_text() == "a"
    assert sorted(p.name for p in outside.iterdir()) == ["host.txt"]


def test_copy_tree_copies_files_and_folders_and_refuses_a_link_inside(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "folder" / "sub").mkdir()
    (root / "folder" / "sub" / "x.csv").write_text("x")
    os.chmod(root / "folder" / "sub" / "x.csv", 0o640)
    copy_tree(str(root), str(root / "folder"), str(root / "copy"))
    assert (root / "copy" / "sub" / "x.csv").read_text() == "x"
    assert oct((root / "copy" / "sub" / "x.csv").stat().st_mode & 0o777) == oct(0o640)
    (root / "folder" / "notes.md").symlink_to(outside / "host.txt")
    with pytest.raises(LinkRefused, match=r"notes\.md is a symbolic link"):
        copy_tree(str(root), str(root / "folder"), str(root / "copy2"))
    assert not (root / "copy2").exists()  # a partial copy is removed
    with pytest.raises(FileExistsError):  # a taken name: what is there stays
        copy_tree(str(root), str(root / "folder"), str(root / "copy"))
    assert (root / "copy" / "sub" / "x.csv").read_text() == "x"
    (root / "target").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LinkRefused):
        copy_tree(str(root), str(root / "copy"), str(root / "target" / "copy"))
    assert sorted(p.name for p in outside.iterdir()) == ["host.txt"]


def test_a_folder_where_a_file_is_read_is_named_and_nothing_stays_open(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    (root / "folder" / "cp.ipynb").mkdir()
    open_fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        with pytest.raises(NotAFile), reading(str(root), str(root / "folder" / "cp.ipynb")):
            pass
    assert len(os.listdir("/proc/self/fd")) <= open_fds
    make_folder(str(root), str(root / "folder" / "new"))
    assert (root / "folder" / "new").is_dir()
    (root / "folder" / "gone.txt").symlink_to(root / "folder" / "new")
    remove(str(root), str(root / "folder" / "gone.txt"))  # the link itself
    assert not (root / "folder" / "gone.txt").is_symlink() and (root / "folder" / "new").is_dir()


def test_make_folders_makes_what_is_missing_and_refuses_a_link_on_the_way(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    make_folders(str(root), str(root / "folder" / "a" / "b"), 0o700)
    assert (root / "folder" / "a" / "b").is_dir() and oct((root / "folder" / "a").stat().st_mode & 0o777) == "0o700"
    make_folders(str(root), str(root / "folder" / "a" / "b"))  # exists: nothing to do
    (root / "folder" / "data").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LinkRefused, match="data is a symbolic link"):
        make_folders(str(root), str(root / "folder" / "data" / ".ipynb_checkpoints"))
    assert sorted(p.name for p in outside.iterdir()) == ["host.txt"]


def test_remove_tree_removes_links_themselves_and_refuses_a_linked_path(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "folder" / "old" / "sub").mkdir(parents=True)
    (root / "folder" / "old" / "sub" / "x.txt").write_text("x")
    (root / "folder" / "old" / "link").symlink_to(outside, target_is_directory=True)
    remove_tree(str(root), str(root / "folder" / "old"))
    assert not (root / "folder" / "old").exists() and (outside / "host.txt").read_text() == "host"
    (root / "folder" / "data").symlink_to(outside, target_is_directory=True)
    (outside / "sub").mkdir()
    with pytest.raises(LinkRefused, match="data is a symbolic link"):
        remove_tree(str(root), str(root / "folder" / "data" / "sub"))
    with pytest.raises(LinkRefused, match="data is a symbolic link"):
        remove_tree(str(root), str(root / "folder" / "data"))
    assert (outside / "sub").is_dir() and (root / "folder" / "data").is_symlink()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The data home whose ``Trash`` send2trash picks (the test's, not the user's)."""
    from send2trash import plat_other

    home = tmp_path / "share"
    monkeypatch.setattr(plat_other, "XDG_DATA_HOME", os.fsencode(home))
    monkeypatch.setattr(plat_other, "HOMETRASH_B", os.fsencode(home / "Trash"))
    return home


def test_trash_moves_by_descriptor_with_send2trashs_record_and_refuses_a_linked_path(
    tree: tuple[Path, Path], home: Path
) -> None:
    root, outside = tree
    for _ in range(2):
        (root / "folder" / "old.csv").write_text("mine")
        trash(str(root), str(root / "folder" / "old.csv"))
    assert not (root / "folder" / "old.csv").exists()
    assert sorted(p.name for p in (home / "Trash" / "files").iterdir()) == ["old 1.csv", "old.csv"]
    record = (home / "Trash" / "info" / "old.csv.trashinfo").read_text()
    assert f"Path={root}/folder/old.csv\n" in record and record.startswith("[Trash Info]\n")
    (root / "folder" / "data").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LinkRefused, match="data is a symbolic link"):
        trash(str(root), str(root / "folder" / "data" / "host.txt"))
    assert (outside / "host.txt").read_text() == "host"
    trash(str(root), str(root / "folder" / "data"))  # the link itself goes, as with send2trash
    assert (home / "Trash" / "files" / "data").is_symlink() and (outside / "host.txt").exists()


def test_copy_data_keeps_holes_and_copies_the_data_between_them(tmp_path: Path) -> None:
    source, target = tmp_path / "sparse.bin", tmp_path / "copy.bin"
    with open(source, "wb") as f:
        f.truncate(2**32)
        f.seek(2**31)
        f.write(b"middle")
        f.seek(2**32 - 3)
        f.write(b"end")
    with open(source, "rb") as inp, open(target, "wb") as out:
        copy_data(inp.fileno(), out.fileno())
    assert target.stat().st_size == 2**32 and target.stat().st_blocks * 512 < 2**20
    with open(target, "rb") as f:
        f.seek(2**31 - 2)
        assert f.read(10) == b"\0\0middle\0\0"
        f.seek(2**32 - 4)
        assert f.read() == b"\0end"
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with open(empty, "rb") as inp, open(tmp_path / "empty-copy.bin", "wb") as out:
        copy_data(inp.fileno(), out.fileno())
    assert (tmp_path / "empty-copy.bin").stat().st_size == 0


def _flip(stop: threading.Event, folder: Path, outside: Path) -> None:
    """What a sandbox does in a loop: the user's link and the real folder swap names."""
    real, link, spare = folder / "res", folder / "link", folder / "spare"
    while not stop.is_set():
        os.rename(real, spare)
        os.rename(link, real)
        os.rename(real, link)
        os.rename(spare, real)
        time.sleep(0.0002)  # a while as the real folder too, however loaded the machine


@pytest.mark.usefixtures("home")
def test_trash_never_takes_the_linked_host_file_while_a_folder_flips_with_a_link(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    folder = root / "folder"
    (folder / "res").mkdir()
    (folder / "link").symlink_to(outside, target_is_directory=True)
    (outside / "old.csv").write_text("the user's host file")
    real = os.open(folder / "res", os.O_RDONLY | os.O_DIRECTORY)
    stop = threading.Event()
    flipper = threading.Thread(target=_flip, args=(stop, folder, outside))
    flipper.start()
    trashed = refused = 0
    try:
        tries = 0
        while tries < 300 or (not (trashed and refused) and tries < 5000):
            tries += 1
            # the sandbox's own old.csv, in the real folder whatever its name now
            os.close(os.open("old.csv", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=real))
            try:
                trash(str(root), str(folder / "res" / "old.csv"))
                trashed += 1
            except (LinkRefused, OSError):  # a link, or a name gone or changed meanwhile
                refused += 1
    finally:
        stop.set()
        flipper.join()
        os.close(real)
    assert (outside / "old.csv").read_text() == "the user's host file", (trashed, refused)
    assert trashed and refused, (trashed, refused)  # the race was run both ways


def test_a_judged_move_or_copy_acts_only_on_the_entry_judged(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    folder = root / "folder"
    (folder / "a.csv").write_text("judged")
    (folder / "dest").mkdir()
    judged = judge(str(root), str(folder / "a.csv"), str(folder / "dest" / "a.csv"))
    assert not judged.is_folder and judged.folder == str(folder) and judged.destination_folder == str(folder / "dest")
    # what a sandbox does between the guard's look and the move: another file takes the name
    os.rename(folder / "a.csv", folder / "judged.csv")
    (folder / "a.csv").write_text("swapped in")
    token = JUDGED.set(judged)
    try:
        with pytest.raises(Changed, match="changed while the server was checking it"):
            rename(str(root), str(folder / "a.csv"), str(folder / "dest" / "a.csv"))
        with pytest.raises(Changed), reading(str(root), str(folder / "a.csv")):
            pass
    finally:
        JUDGED.reset(token)
    assert not (folder / "dest" / "a.csv").exists()
    # the judged entry back at its name moves
    os.replace(folder / "judged.csv", folder / "a.csv")
    token = JUDGED.set(judged)
    try:
        rename(str(root), str(folder / "a.csv"), str(folder / "dest" / "a.csv"))
    finally:
        JUDGED.reset(token)
    assert (folder / "dest" / "a.csv").read_text() == "judged"


def test_a_folder_copy_past_its_limit_stops_and_leaves_nothing(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    heavy = root / "folder" / "heavy"
    (heavy / "sub").mkdir(parents=True)
    (heavy / "a.bin").write_bytes(os.urandom(600_000))
    (heavy / "sub" / "b.bin").write_bytes(os.urandom(600_000))
    with open(heavy / "sparse.bin", "wb") as f:  # holes take no disk, and copy as holes
        f.truncate(2**32)
    with pytest.raises(TooLarge, match=r"heavy takes more than 1,000,000 bytes of disk"):
        copy_tree(str(root), str(heavy), str(root / "folder" / "copy"), max_bytes=1_000_000)
    assert not (root / "folder" / "copy").exists()
    copy_tree(str(root), str(heavy), str(root / "folder" / "copy"), max_bytes=2_000_000)
    assert (root / "folder" / "copy" / "sub" / "b.bin").read_bytes() == (heavy / "sub" / "b.bin").read_bytes()
    assert (root / "folder" / "copy" / "sparse.bin").stat().st_blocks == 0


@pytest.mark.parametrize("depth", [MAX_COPY_DEPTH, MAX_COPY_DEPTH + 1, 600])
def test_a_folder_copy_goes_so_deep_and_refuses_deeper_trees_cleanly(tree: tuple[Path, Path], depth: int) -> None:
    """A sandbox can make a chain of folders thousands deep in a second; a Lab
    "duplicate" of it ended in a RecursionError (an HTTP 500). A copy goes
    MAX_COPY_DEPTH folders deep, and a deeper tree is refused (400, naming
    the folder) with nothing left of the copy."""
    root, _ = tree
    source = root / "folder" / "deep"
    os.makedirs(os.path.join(source, *(["d"] * depth)))
    (source.joinpath(*(["d"] * depth)) / "leaf.txt").write_text("leaf")
    destination = root / "folder" / "copy"
    if depth <= MAX_COPY_DEPTH:
        copy_tree(str(root), str(source), str(destination))
        assert destination.joinpath(*(["d"] * depth), "leaf.txt").read_text() == "leaf"
        return
    with pytest.raises(TooDeep, match=f"more than {MAX_COPY_DEPTH} deep") as refused:
        copy_tree(str(root), str(source), str(destination))
    assert refused.value.status == 400 and str(source) in str(refused.value)
    assert not destination.exists()


def test_a_file_emptied_behind_the_copy_and_filled_ahead_is_charged_what_it_writes(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit was charged once, from the blocks a file took when opened:
    a writer punching holes behind the copy and writing as much ahead kept
    the source at 1 MiB while the copy of its 32 MiB grew (an attack review,
    with a thread racing the copy). Here the writer acts at each read."""
    import ctypes

    root, _ = tree
    heavy = root / "folder" / "heavy"
    heavy.mkdir()
    window = 1 << 20
    with open(heavy / "moving.bin", "wb") as f:
        f.truncate(32 * window)
        f.write(b"d" * window)
    libc = ctypes.CDLL(None, use_errno=True)
    writer = os.open(heavy / "moving.bin", os.O_WRONLY)
    ahead = [window]
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        data = real_pread(fd, length, offset)
        if data and ahead[0] + len(data) <= 32 * window:
            assert libc.fallocate(writer, 3, ctypes.c_long(offset), ctypes.c_long(len(data))) == 0  # punch, keep size
            os.pwrite(writer, b"d" * len(data), ahead[0])
            ahead[0] += len(data)
        return data

    monkeypatch.setattr(os, "pread", pread)
    try:
        with pytest.raises(TooLarge):
            copy_tree(str(root), str(heavy), str(root / "folder" / "copy"), max_bytes=4 * window)
    finally:
        os.close(writer)
    assert not (root / "folder" / "copy").exists()
    assert (heavy / "moving.bin").stat().st_blocks * 512 <= 2 * window  # (the source stayed small)
