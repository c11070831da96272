"""sandbox_kernel.no_follow: writes below a root go through no link, however
the folder changes while they run (the Lab server's saves use it:
tests/test_lab_saves.py attacks them with a real sandbox)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_kernel.no_follow import (
    Exists,
    LinkRefused,
    NotAFile,
    append,
    copy,
    copy_tree,
    make_folder,
    open_folder,
    reading,
    remove,
    rename,
    replacing,
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
    assert not (root / "copy2" / "notes.md").exists()
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
