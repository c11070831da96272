"""Attacks on the host's start-up and clean-up through a workspace (attack
review, helper 43): a shared temporary folder as the workspace, thousands of
planted repositories, and folder chains thousands deep.

- A workspace that was ``/tmp`` handed a cell every session's egress proxy
  socket (``/tmp/sk-egress-*``) and second kernels' state: refused now, while a
  folder inside ``/tmp`` (pytest's ``tmp_path``) stays a workspace.
- 3,000 planted ``r<i>/.git`` made one mount each (bwrap refuses more than
  9000 arguments: every later kernel on the folder failed every cell) and an
  O(N^2) plan (17.9 s for 4,000 in the kernel's event loop).
- A chain 3,000 folders deep made ``shutil.rmtree(..., ignore_errors=True)``
  raise RecursionError in ``collect_stale``, so no later kernel started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap

from sandbox_kernel import no_follow
from sandbox_kernel.engine import owned_dirs, workspace_policy
from sandbox_kernel.engine.workspace_policy import (
    WORKSPACE_SETTING,
    ProtectedPlaces,
    WorkspaceRefused,
    apply_policy,
    plan_workspace,
    workspace_mounts,
)
from sandbox_kernel.sandbox.base import SandboxSpec

NO_PLACES = ProtectedPlaces()


# ---------------------------------------------------------------- shared temporary folders


@pytest.mark.parametrize("folder", ["/tmp", "/var/tmp", "/dev/shm", "gettempdir"])
def test_a_shared_temporary_folder_is_no_workspace(folder: str) -> None:
    path = Path(os.path.realpath(tempfile.gettempdir() if folder == "gettempdir" else folder))
    if not path.is_dir():
        pytest.skip(f"{folder} is not on this host")
    with pytest.raises(WorkspaceRefused) as info:
        plan_workspace(path, NO_PLACES)
    message = str(info.value)
    assert str(path) in message and "shared temporary" in message and WORKSPACE_SETTING in message


def test_tmp_itself_is_refused_with_the_hosts_own_places() -> None:
    """The attack as it ran: a kernel whose workspace is /tmp (its policy,
    collected from this host), next to another session's proxy folder."""
    proxy_folder = owned_dirs.make("sk-egress-", "/tmp")
    try:
        with pytest.raises(WorkspaceRefused, match="the workspace /tmp is the shared temporary"):
            apply_policy(Path("/tmp"), "/workspace")
    finally:
        proxy_folder.rmdir()


def test_a_folder_inside_tmp_stays_a_workspace(tmp_path: Path) -> None:
    assert str(tmp_path).startswith(os.path.realpath(tempfile.gettempdir()) + "/") or tmp_path.is_dir()
    (tmp_path / "data.csv").write_text("a\n")
    plan = plan_workspace(tmp_path, NO_PLACES)
    assert not plan.read_only and workspace_mounts(plan, "/workspace")[0].readonly is False


def test_a_workspace_holding_the_temporary_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TMPDIR inside the workspace: a second kernel's state folder
    (``$TMPDIR/sandbox-kernel-<pid>-*``) would be in the sandbox's reach."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    with pytest.raises(WorkspaceRefused, match=f"contains the shared temporary or runtime folder {temporary}"):
        plan_workspace(tmp_path, NO_PLACES)
    inside = temporary / "project"
    inside.mkdir()
    plan_workspace(inside, NO_PLACES)  # a folder of its own inside it is fine


def test_a_sticky_world_writable_folder_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(WorkspaceRefused, match="sticky bit") as info:
        plan_workspace(shared, NO_PLACES)
    assert str(shared) in str(info.value) and WORKSPACE_SETTING in str(info.value)
    (shared / "project").mkdir()
    plan_workspace(shared / "project", NO_PLACES)


def test_the_runtime_folder_and_folders_inside_it_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run-user"
    (runtime / "gnupg").mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    for workspace in (runtime, runtime / "gnupg", tmp_path):
        with pytest.raises(WorkspaceRefused, match=str(runtime)):
            plan_workspace(workspace, NO_PLACES)


# ---------------------------------------------------------------- planted repositories


def plant(workspace: Path, count: int, under: str = "") -> None:
    for i in range(count):
        (workspace / under / f"r{i}" / ".git").mkdir(parents=True)


def bwrap_argv(plan: workspace_policy.WorkspacePlan) -> list[str]:
    from sandbox_kernel.sandbox.bwrap import BubblewrapSandbox

    spec = SandboxSpec(command=["true"], bind_mounts=workspace_mounts(plan, "/workspace"))
    return BubblewrapSandbox(executable="/bin/true").build_argv(spec)


def test_thousands_of_planted_repositories_make_the_workspace_read_only_quickly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    plant(ws, 3000)
    (ws / "notes.txt").write_text("mine")
    mounts, plan = apply_policy(ws, "/workspace")  # (bench: 0.1 s, 8 to 13 s before; tests assert no times)
    # every planted .git is covered: the workspace itself is read-only
    assert plan.read_only and plan.home_rule and plan.writable_entries == ()
    assert mounts[0].readonly and len(mounts) <= workspace_policy.MAX_MASKS + 1
    assert len(bwrap_argv(plan)) < 9000
    (note,) = [n for n in plan.notes if "3,000" in n]
    assert "r0/.git" in note and "read-only" in note and f"find {ws}" in note


def test_a_crowded_folder_is_read_only_and_the_rest_stays_writable(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    plant(ws, workspace_policy.MAX_MASKS + 100, under="clones")
    (ws / "mine" / ".git" / "hooks").mkdir(parents=True)
    plan = plan_workspace(ws, NO_PLACES)
    masks = {str(m.path.relative_to(ws)): m.kind for m in plan.masks}
    assert masks == {"clones": "readonly", "mine/.git": "readonly"}
    assert not plan.read_only and not workspace_mounts(plan, "/workspace")[0].readonly
    assert any("clones" in note for note in plan.notes)


def test_masks_stay_one_by_one_up_to_the_cap(tmp_path: Path) -> None:
    plant(tmp_path, 50)
    plan = plan_workspace(tmp_path, NO_PLACES)
    assert len(plan.masks) == 50 and not plan.read_only and plan.notes == ()


def test_repositories_configs_are_read_within_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the budget the hooks' places are unknown: nothing is left writable."""
    monkeypatch.setattr(workspace_policy, "CONFIG_BUDGET", 1000)
    plant(tmp_path, 3)
    for i in range(3):
        (tmp_path / f"r{i}" / ".git" / "config").write_text("#" * 600 + "\n[core]\n\thooksPath = ../../h\n")
    plan = plan_workspace(tmp_path, NO_PLACES)
    assert plan.read_only


def test_hard_link_search_lists_a_bounded_number_of_hooks(tmp_path: Path) -> None:
    hooks = tmp_path / "r" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (tmp_path / "keep").write_text("x")
    for i in range(300):
        os.link(tmp_path / "keep", hooks / f"h{i}")
    found = workspace_policy._aliased({hooks.parent: workspace_policy.Mask(hooks.parent, "readonly")})
    assert 0 < len(found) <= workspace_policy.ALIAS_HOOKS


# ---------------------------------------------------------------- deep folder chains


@pytest.fixture
def chain() -> Iterator[Callable[..., None]]:
    """Makes chains ``depth`` folders deep, by descriptor (no path is that
    long); what a failing test leaves is removed by ``rm -rf`` (iterative),
    since pytest's own clean-up of old temporary folders (``shutil.rmtree``)
    would raise RecursionError at the end of every later session."""
    made: list[Path] = []

    def make(top: Path, depth: int = 3000, files: bool = False) -> None:
        made.append(top)
        _chain(top, depth, files)

    yield make
    subprocess.run(["rm", "-rf", "--one-file-system", *map(str, made)], check=False)


def _chain(top: Path, depth: int, files: bool) -> None:
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            if files:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_collect_stale_removes_a_chain_thousands_deep(tmp_path: Path, chain: Callable[..., None]) -> None:
    stale = tmp_path / f"sandbox-kernel-{dead_pid()}-abc"
    chain(stale, files=True)
    assert owned_dirs.collect_stale("sandbox-kernel-", str(tmp_path)) == 1
    assert not stale.exists()


def test_remove_tree_follows_no_link_and_never_raises(tmp_path: Path, chain: Callable[..., None]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host")
    tree = tmp_path / "tree"
    chain(tree, depth=200)
    bottom = Path(os.path.join(tree, *["d"] * 50))
    (bottom / "link").symlink_to(outside, target_is_directory=True)
    assert owned_dirs.remove_tree(tree) is True
    assert not tree.exists() and (outside / "keep").read_text() == "host"
    link = tmp_path / "link"
    link.symlink_to(outside, target_is_directory=True)
    assert owned_dirs.remove_tree(link) is False  # a link AT the path is left, its target untouched
    assert link.is_symlink() and (outside / "keep").read_text() == "host"
    assert owned_dirs.remove_tree(tmp_path / "missing") is True


def test_remove_tree_is_bounded_and_finishes_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, chain: Callable[..., None]
) -> None:
    tree = tmp_path / "tree"
    chain(tree, depth=100, files=True)
    assert owned_dirs.remove_tree(tree, limit=50) is False and tree.exists()
    assert "left" in caplog.text
    assert owned_dirs.remove_tree(tree) is True and not tree.exists()


def test_remove_tree_empties_a_folder_a_cell_made_unwritable(tmp_path: Path, chain: Callable[..., None]) -> None:
    tree = tmp_path / "tree"
    chain(tree, depth=5, files=True)
    (tree / "d" / "d").chmod(0o500)
    (tree / "d" / "d" / "d").chmod(0o000)
    assert owned_dirs.remove_tree(tree) is True and not tree.exists()


def test_the_lab_servers_remove_tree_takes_a_chain_thousands_deep(tmp_path: Path, chain: Callable[..., None]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    chain(root / "deep", files=True)
    no_follow.remove_tree(str(root), str(root / "deep"))
    assert not (root / "deep").exists()


def test_a_cell_planting_thousands_of_repositories_does_not_stop_later_kernels(tmp_path: Path) -> None:
    """The attack itself: a cell plants 3,000 repositories; every later kernel
    on the folder failed every cell ("bwrap: Exceeded maximum number of
    arguments 9000"). It now starts, reads the folder, and cannot write it."""
    require_bwrap()
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir()
    first = SandboxKernelHandle(ws, tmp, extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        run = first.run(
            "import os\n"
            "for i in range(3000):\n"
            "    os.makedirs(f'/workspace/r{i}/.git/hooks')\n"
            "open('/workspace/notes.txt', 'w').write('mine')\n"
            "print('planted')",
            timeout=120,
        )
        assert run.stdout == "planted\n", (run.stdout, run.stderr)
    finally:
        first.shutdown()
    later = SandboxKernelHandle(ws, tmp, extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        run = later.run(
            "print(open('/workspace/notes.txt').read())\n"
            "try:\n"
            "    open('/workspace/r5/.git/hooks/pre-commit', 'w')\n"
            "except OSError as e:\n"
            "    print(e.errno)",
            timeout=120,
        )
        assert run.status == "ok" and run.stdout.splitlines() == ["mine", "30"], (run.stdout, run.stderr)
        assert "read-only" in run.stderr and "3,000" in run.stderr, run.stderr
    finally:
        later.shutdown()


def test_another_kernels_runtime_folder_in_a_workspace_is_hidden(tmp_path: Path) -> None:
    """A kernel's TMPDIR may lie in another kernel's workspace; its runtime
    folder (``sandbox-kernel-<pid>-*``: a second kernel's state, granted to the
    sandboxes' uid) is then hidden from that workspace's sandboxes."""
    require_bwrap()
    ws_b, tmp_b = tmp_path / "b-ws", tmp_path / "b-tmp"
    ws_b.mkdir()
    tmp_b.mkdir()
    tmp_a = ws_b / "a-tmp"
    tmp_a.mkdir()
    (tmp_path / "a-ws").mkdir()
    a = SandboxKernelHandle(tmp_path / "a-ws", tmp_a, extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        assert a.run("x = 1").status == "ok"
        (runtime,) = [p.name for p in tmp_a.iterdir() if p.name.startswith("sandbox-kernel-")]
        assert any((tmp_a / runtime).iterdir())
        b = SandboxKernelHandle(ws_b, tmp_b, extra_args=["--SandboxKernel.backend=bwrap"])
        try:
            run = b.run(f"import os\nprint(os.listdir('/workspace/a-tmp/{runtime}'))")
            assert run.stdout == "[]\n", (run.stdout, run.stderr)
        finally:
            b.shutdown()
    finally:
        a.shutdown()


def test_folders_named_like_runtime_folders_cannot_exceed_the_mount_limit(tmp_path: Path) -> None:
    """A kernel not run as root writes as the host's user, so a cell can make
    thousands of folders that look like other kernels' runtime folders (name,
    owner, mode); each was hidden by a mount of its own, kept through the
    collapse: 1,500 made every later kernel on the folder fail (an attack
    review). At most MAX_RUNTIME_HIDES are hidden."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(3000):
        (ws / f"sandbox-kernel-{i}-abcdefgh").mkdir(mode=0o700)
    plan = plan_workspace(ws, NO_PLACES)
    hidden = [m for m in plan.masks if m.kind == "hide"]
    assert len(hidden) == workspace_policy.MAX_RUNTIME_HIDES, len(hidden)
    assert len(bwrap_argv(plan)) < 9000
