"""The workspace policy's decisions, without a sandbox: refusals, masks, the
home rule, the bounded scan, and the mounts (bwrap argv, Docker mounts) they
become. The attacks through real kernels are in test_workspace_policy.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandbox_kernel.engine.workspace_policy import (
    HIDE,
    READONLY,
    ProtectedPlaces,
    WorkspaceRefused,
    collect_protected_places,
    plan_workspace,
    prepare,
    workspace_mounts,
)
from sandbox_kernel.sandbox.base import BindMount, SandboxSpec


def places_for(home: Path, **extra: tuple[Path, ...]) -> ProtectedPlaces:
    """The places a host with ``home`` has (as collect_protected_places makes them)."""
    from sandbox_kernel.engine.workspace_policy import HOME_CONFIG, HOME_SECRETS

    return ProtectedPlaces(
        homes=(home,),
        hidden=tuple(home / n for n in HOME_SECRETS) + extra.get("hidden", ()),
        readonly=tuple(home / n for n in HOME_CONFIG) + extra.get("readonly", ()),
        allowed_roots=extra.get("allowed", ()),
    )


def masks_of(plan) -> dict[str, str]:
    return {str(m.path.relative_to(plan.workspace)): m.kind for m in plan.masks}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    return home


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("workspace", ["/", "{tmp}", "{tmp}/home"])
def test_root_and_folders_containing_a_home_are_refused(home: Path, tmp_path: Path, workspace: str) -> None:
    with pytest.raises(WorkspaceRefused) as info:
        plan_workspace(Path(workspace.format(tmp=tmp_path)), places_for(home))
    assert "--SandboxKernel.workspace=" in str(info.value)


@pytest.mark.parametrize("inside", [".jupyter", ".jupyter/sub", ".local/lib/python3.11/site-packages", ".ssh"])
def test_workspace_inside_a_protected_place_is_refused(home: Path, inside: str) -> None:
    with pytest.raises(WorkspaceRefused) as info:
        plan_workspace(home / inside, places_for(home))
    message = str(info.value)
    assert str(home / inside) in message and "--SandboxKernel.workspace=" in message


def test_workspace_inside_site_packages_and_prefix_refused(home: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    places = places_for(home, readonly=(venv, Path(sys.prefix)))
    for workspace in (venv, venv / "lib" / "site-packages" / "pkg", Path(sys.prefix) / "share"):
        with pytest.raises(WorkspaceRefused):
            plan_workspace(workspace, places)


def test_relative_workspace_refused(home: Path) -> None:
    with pytest.raises(WorkspaceRefused, match="absolute"):
        plan_workspace(Path("notebooks"), places_for(home))


def test_allowed_root_accepts_agent_workspaces_inside_the_data_dir(home: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ws = data / "workspaces" / "u" / "s"
    ws.mkdir(parents=True)
    places = places_for(home, hidden=(data,), allowed=(data / "workspaces",))
    assert plan_workspace(ws, places).masks == ()
    with pytest.raises(WorkspaceRefused):  # the root itself holds every session's folder
        plan_workspace(data / "workspaces", places)
    with pytest.raises(WorkspaceRefused):
        plan_workspace(data / "sessions", places)


def test_project_folder_in_the_home_is_accepted_without_masks(home: Path) -> None:
    ws = home / "projects" / "x"
    ws.mkdir(parents=True)
    (ws / "data.csv").write_text("a\n")
    plan = plan_workspace(ws, places_for(home))
    assert plan.masks == () and not plan.home_rule and plan.notes == ()
    assert workspace_mounts(plan, "/workspace") == [BindMount(ws, "/workspace")]


# ---------------------------------------------------------------- the home rule


def test_home_rule_top_level_read_only_user_entries_writable(home: Path, tmp_path: Path) -> None:
    (home / "notes.txt").write_text("n")
    (home / "data").mkdir()
    (home / ".bashrc").write_text("# rc")
    (home / ".jupyter").mkdir()
    (home / ".ssh").mkdir()
    (home / ".netrc").write_text("machine x")
    (home / "link").symlink_to(tmp_path)  # would expose tmp_path if bound
    plan = plan_workspace(home, places_for(home))
    assert plan.home_rule
    assert {p.name for p in plan.writable_entries} == {"notes.txt", "data"}
    # read-only entries need no mask (the top level is read-only); secrets are hidden
    assert masks_of(plan) == {".ssh": HIDE, ".netrc": HIDE}
    mounts = workspace_mounts(plan, "/workspace")
    assert mounts[0] == BindMount(home, "/workspace", readonly=True)
    assert BindMount(home / "data", "/workspace/data") in mounts
    assert BindMount(home / ".ssh", "/workspace/.ssh", readonly=True, kind="hide") in mounts
    assert len(plan.notes) == 1 and "--SandboxKernel.workspace=" in plan.notes[0]


def test_home_rule_creates_nothing_at_the_top_level(home: Path) -> None:
    plan = plan_workspace(home, places_for(home))
    prepare(plan)
    assert list(home.iterdir()) == []  # no empty .bash_profile, no .ipython


def test_missing_protected_dir_inside_a_writable_folder_is_created_and_masked(home: Path) -> None:
    (home / "work").mkdir()
    conf = home / "work" / "jupyter-config"
    plan = plan_workspace(home, places_for(home, readonly=(conf,)))
    assert masks_of(plan) == {"work/jupyter-config": READONLY}
    assert plan.masks[0].create
    prepare(plan)
    assert conf.is_dir() and (conf.stat().st_mode & 0o777) == 0o700


def test_secret_inside_a_read_only_config_dir_is_still_hidden(home: Path) -> None:
    (home / ".config" / "gcloud").mkdir(parents=True)
    plan = plan_workspace(home, places_for(home))
    assert masks_of(plan) == {".config/gcloud": HIDE}


# ---------------------------------------------------------------- the scan


def test_scan_marks_git_hg_and_venvs_read_only(tmp_path: Path, home: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / ".git" / "hooks").mkdir(parents=True)
    (ws / "b" / "c" / ".hg").mkdir(parents=True)
    (ws / "env" / "bin").mkdir(parents=True)
    (ws / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (ws / "deep" / "1" / "2" / "3" / "4" / ".git").mkdir(parents=True)  # beyond the depth bound
    plan = plan_workspace(ws, places_for(home))
    assert masks_of(plan) == {"a/.git": READONLY, "b/c/.hg": READONLY, "env": READONLY}


def test_hook_managers_configs_and_hooks_path_of_a_repo_are_read_only(tmp_path: Path, home: Path) -> None:
    """git commit runs what pre-commit, husky and lefthook configs say, and
    the hooks in core.hooksPath: read-only like .git, and so is a submodule's
    .git file (rewritten, it would send git to a planted git dir). Missing
    ones are not created; links are left alone, and a hooksPath through a
    link a sandbox made to a host folder masks nothing outside the workspace."""
    ws = tmp_path / "ws"
    (ws / "app" / ".git").mkdir(parents=True)
    (ws / "app" / ".git" / "config").write_text('[core]\n\tbare = false\n[Core]\n\thooksPath = "githooks"\n')
    (ws / "app" / ".pre-commit-config.yaml").write_text("repos: []\n")
    (ws / "app" / ".husky").mkdir()
    (ws / "app" / "githooks").mkdir()
    (ws / "app" / "lefthook.yml").symlink_to(ws / "app" / "other.yml")
    (ws / "app" / "other.yml").write_text("")
    (ws / "lib" / ".git").mkdir(parents=True)
    (ws / "lib" / ".git" / "config").write_text("[core]\n\thookspath = tools/hooks ; where husky puts them\n")
    (ws / "lib" / "sub").mkdir()
    (ws / "lib" / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")  # a submodule's pointer
    (ws / "lib" / "sub" / ".husky").mkdir()
    outside = tmp_path / "host-folder"
    (outside / "hooks").mkdir(parents=True)
    (ws / "lib" / "tools").symlink_to(outside)
    (ws / "notes.txt").write_text("")
    plan = plan_workspace(ws, places_for(home))
    assert masks_of(plan) == {
        "app/.git": READONLY,
        "app/.husky": READONLY,
        "app/.pre-commit-config.yaml": READONLY,
        "app/githooks": READONLY,
        "lib/.git": READONLY,
        "lib/sub/.git": READONLY,
        "lib/sub/.husky": READONLY,
    }
    assert not (ws / "app" / ".lefthook.yml").exists()  # nothing created


def test_protected_files_with_other_names_are_named_to_the_user(tmp_path: Path, home: Path) -> None:
    """A hard link made while a file was not yet protected still writes to it:
    the user is told which protected files have other names."""
    ws = tmp_path / "ws"
    (ws / "app" / ".git" / "hooks").mkdir(parents=True)
    (ws / "app" / ".git" / "config").write_text("[core]\n")
    (ws / "app" / ".git" / "hooks" / "pre-push").write_text("#!/bin/sh\n")
    (ws / "app" / ".pre-commit-config.yaml").write_text("repos: []\n")
    clean = plan_workspace(ws, places_for(home))
    assert not any("hard links" in note for note in clean.notes)
    os.link(ws / "app" / ".pre-commit-config.yaml", ws / "app" / "innocent.yaml")
    os.link(ws / "app" / ".git" / "hooks" / "pre-push", ws / "notes.txt")
    plan = plan_workspace(ws, places_for(home))
    (note,) = [note for note in plan.notes if "hard links" in note]
    assert (
        str(ws / "app" / ".pre-commit-config.yaml") in note and str(ws / "app" / ".git" / "hooks" / "pre-push") in note
    )
    assert str(ws / "app" / ".git" / "config") not in note


def test_scan_is_bounded_and_never_follows_symlinks(tmp_path: Path, home: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(50):
        (ws / f"f{i}").write_text("")
    (ws / "z" / ".git").mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / ".git").mkdir(parents=True)
    (ws / "link").symlink_to(outside)
    plan = plan_workspace(ws, places_for(home), scan_entries=10)
    assert plan.scan_truncated
    full = plan_workspace(ws, places_for(home))
    assert not full.scan_truncated and masks_of(full) == {"z/.git": READONLY}


def test_python_places_inside_a_project_folder_are_read_only(tmp_path: Path, home: Path) -> None:
    ws = tmp_path / "proj"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / ".venv" / "lib").mkdir(parents=True)
    plan = plan_workspace(ws, places_for(home, readonly=(ws / "src", ws / ".venv")))
    assert masks_of(plan) == {"src": READONLY, ".venv": READONLY}


# ---------------------------------------------------------------- the host's places


def test_collect_protected_places_covers_the_host(fake_host: Path) -> None:
    home = fake_host
    places = collect_protected_places(store_dirs=[home / "sk" / "privacy"])
    real = Path(os.path.realpath(home))
    assert real in places.homes
    hidden, readonly = set(places.hidden), set(places.readonly)
    assert {real / "jd", real / "jr", real / "sk", real / ".ssh"} <= hidden
    assert {real / "jc", real / "ipy", real / ".local", real / ".bashrc"} <= readonly
    assert Path(os.path.realpath(sys.prefix)) in readonly or any(
        Path(os.path.realpath(sys.prefix)).is_relative_to(p) for p in readonly
    )
    package = Path(__import__("sandbox_kernel").__file__).resolve().parent
    assert any(package == p or package.is_relative_to(p) for p in readonly)
    assert real / "sk" / "workspaces" in places.allowed_roots


# ---------------------------------------------------------------- the backends


def test_bwrap_hides_dirs_with_a_read_only_tmpfs_and_files_with_dev_null(tmp_path: Path) -> None:
    from sandbox_kernel.sandbox.bwrap import BubblewrapSandbox

    secret_dir = tmp_path / ".ssh"
    secret_dir.mkdir()
    secret_file = tmp_path / ".netrc"
    secret_file.write_text("x")
    spec = SandboxSpec(
        command=["true"],
        bind_mounts=[
            BindMount(tmp_path, "/workspace"),
            BindMount(secret_dir, "/workspace/.ssh", readonly=True, kind="hide"),
            BindMount(secret_file, "/workspace/.netrc", readonly=True, kind="hide"),
        ],
    )
    argv = BubblewrapSandbox(executable="/bin/true").build_argv(spec)
    joined = " ".join(argv)
    assert "--tmpfs /workspace/.ssh --remount-ro /workspace/.ssh" in joined
    assert "--ro-bind /dev/null /workspace/.netrc" in joined
    assert str(secret_dir) not in argv and str(secret_file) not in argv
    assert joined.index("--bind " + str(tmp_path)) < joined.index("/workspace/.ssh")


def test_docker_mounts_for_masks(tmp_path: Path) -> None:
    pytest.importorskip("docker")
    from sandbox_kernel.sandbox.docker_backend import to_docker_mount

    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    hidden_dir = to_docker_mount(BindMount(tmp_path / "d", "/workspace/d", readonly=True, kind="hide"))
    hidden_file = to_docker_mount(BindMount(tmp_path / "f", "/workspace/f", readonly=True, kind="hide"))
    ro = to_docker_mount(BindMount(tmp_path / "d", "/workspace/d", readonly=True))
    assert hidden_dir["Type"] == "tmpfs" and hidden_dir["ReadOnly"] and not hidden_dir.get("Source")
    assert hidden_file["Source"] == "/dev/null" and hidden_file["ReadOnly"]
    assert ro["Type"] == "bind" and ro["ReadOnly"] and ro["Source"] == str(tmp_path / "d")


def test_import_roots_refuse_the_root_and_its_packages_not_plain_folders(tmp_path: Path, home: Path) -> None:
    """A project installed in editable mode (its root on sys.path): the root and
    its packages are refused, its notebooks/ folder is not (nothing imports it),
    and a workspace containing the root gets it read-only."""
    top = tmp_path / "work"
    repo = top / "repo"
    (repo / "mypkg").mkdir(parents=True)
    (repo / "mypkg" / "__init__.py").write_text("")
    (repo / "notebooks").mkdir()
    site = top / "venv" / "lib" / "site-packages"
    (site / "nspkg").mkdir(parents=True)
    places = ProtectedPlaces(homes=(home,), import_roots=(repo, site))
    for refused in (repo, repo / "mypkg", repo / "mypkg" / "sub", site, site / "nspkg"):
        with pytest.raises(WorkspaceRefused, match="import path"):
            plan_workspace(refused, places)
    assert plan_workspace(repo / "notebooks", places).masks == ()
    assert masks_of(plan_workspace(top, places)) == {"repo": READONLY, "venv/lib/site-packages": READONLY}


def test_a_venv_as_workspace_is_refused(tmp_path: Path, home: Path) -> None:
    venv = tmp_path / "env"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(WorkspaceRefused, match="virtual environment"):
        plan_workspace(venv, places_for(home))


def test_a_secret_linked_into_a_dotfiles_folder_is_hidden_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    (home / "dotfiles").mkdir(parents=True)
    (home / "dotfiles" / "netrc").write_text("machine x password y")
    (home / ".netrc").symlink_to("dotfiles/netrc")
    monkeypatch.setenv("HOME", str(home))
    plan = plan_workspace(Path(os.path.realpath(home)), collect_protected_places())
    assert masks_of(plan).get("dotfiles/netrc") == HIDE


def test_host_places_below_a_renamable_folder_are_refused(tmp_path: Path, home: Path) -> None:
    """A sandbox could rename code/proj and create a new code/proj/.venv/bin/python,
    which the kernelspec runs by path: such a workspace is refused; one level down
    (the place directly in the workspace, a mount point) is fine."""
    code = tmp_path / "code"
    venv = code / "proj" / ".venv"
    venv.mkdir(parents=True)
    places = places_for(home, readonly=(venv,))
    with pytest.raises(WorkspaceRefused, match="rename"):
        plan_workspace(code, places)
    assert masks_of(plan_workspace(code / "proj", places)) == {".venv": READONLY}
    # under the home rule the top-level entries are pinned: one more level is fine
    (home / "work" / "conf").mkdir(parents=True)
    (home / "work" / "a" / "conf").mkdir(parents=True)
    assert masks_of(plan_workspace(home, places_for(home, readonly=(home / "work" / "conf",)))) == {
        "work/conf": READONLY
    }
    with pytest.raises(WorkspaceRefused, match="rename"):
        plan_workspace(home, places_for(home, readonly=(home / "work" / "a" / "conf",)))
