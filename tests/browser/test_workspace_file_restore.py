"""A workspace file a sandbox wrote, opened in JupyterLab, starts nothing on the host.

A ``.jupyterlab-workspace`` file is the page's saved layout; loading it runs,
for every tab it names, that tab's command with the arguments it holds. A cell
writes one into its workspace beside a ``.git`` whose config names a
``core.fsmonitor`` command; the user double-clicks the file; Lab restores a
terminal tab ``{"name": "evil", "cwd": "proj"}``: a host shell starts in
``proj``, its git-aware prompt runs ``git status``, and git runs the command.
A help tab with ``newBrowserTab`` opens an address of the sandbox's choosing in
a new browser tab. ``sandbox_kernel.lab_workspaces`` stores only what Lab saves
itself (a terminal only by the name of one that is running).

The control is the same Lab with that extension switched off: there the shell
starts in ``proj`` and the fsmonitor command runs, and the help tab connects.
The terminals' shell is bash with a prompt that runs ``git status``, as
oh-my-zsh's, starship's or ``__git_ps1``'s do; it records where it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kernel_helpers import LoopbackListener
from lab_helpers import JUPYTER, LabServer, serving
from playwright.sync_api import Page

pytestmark = pytest.mark.timeout(300)

APP_LOAD_TIMEOUT = 90_000


def _server(root: Path, log_copy: Path, guarded: bool) -> Iterator[LabServer]:
    root.mkdir(parents=True, exist_ok=True)
    record = root / "shell-started-in.txt"
    rc = root / "prompt.bashrc"
    rc.write_text(
        "PS1='$ '\n"
        # a git-aware prompt: git status before every prompt, the first one included
        f"PROMPT_COMMAND='pwd >> {record}; git status --porcelain >/dev/null 2>&1'\n"
    )
    config = root / "terminals_config.py"
    # --config replaces the config dir's file: apply the Lab's policy here too
    lines = [
        "from sandbox_kernel import lab_content_policy",
        "lab_content_policy.apply(c)",
        f"c.ServerApp.terminado_settings = {{'shell_command': ['bash', '--noprofile', '--rcfile', {str(rc)!r}, '-i']}}",
    ]
    if not guarded:
        lines.append("c.ServerApp.jpserver_extensions['sandbox_kernel.lab_workspaces'] = False")
    config.write_text("\n".join(lines) + "\n")
    with serving(root, log_copy, extra_args=[f"--config={config}"]) as server:
        server.shell_record = record  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def guarded_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    yield from _server(tmp_path_factory.mktemp("lab-ws-guarded"), artifacts / "jupyter-lab-workspaces.log", True)


@pytest.fixture(scope="module")
def plain_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    yield from _server(tmp_path_factory.mktemp("lab-ws-plain"), artifacts / "jupyter-lab-workspaces-plain.log", False)


def _plant(lab: LabServer, listener: LoopbackListener, name: str) -> Path:
    """What a cell can write into its workspace: a new repository whose config
    runs a command, and a workspace file naming a terminal there and a help tab."""
    folder = lab.notebooks / name
    repo = folder / "proj"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    flag = lab.root / f"fsmonitor-ran-{name}"
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", f"touch {flag}; echo"], check=True)
    workspace = {
        "data": {
            "layout-restorer:data": {
                "main": {
                    "dock": {"type": "tab-area", "currentIndex": 0, "widgets": ["terminal:evil", "help-doc:leak"]},
                    "current": "terminal:evil",
                },
                "down": {"size": 0, "widgets": []},
                "left": {"collapsed": True, "visible": True, "widgets": ["filebrowser"]},
                "right": {"collapsed": True, "visible": True, "widgets": []},
                "relativeSizes": [0, 1, 0],
                "top": {"simpleVisibility": True},
            },
            "terminal:evil": {"data": {"name": "evil", "cwd": f"{name}/proj"}},
            "help-doc:leak": {
                "data": {"url": f"http://127.0.0.1:{listener.port}/?d=private", "text": "Help", "newBrowserTab": True}
            },
        },
        "metadata": {"id": name},
    }
    (folder / "report.jupyterlab-workspace").write_text(json.dumps(workspace))
    return flag


def _open_workspace_file(page: Page, lab: LabServer, name: str) -> None:
    """Open the file as a double-click does (its default factory: Lab's workspace
    loader), which stores it and reloads the page into it."""
    page.goto(lab.url(f"/lab/tree/{name}/report.jupyterlab-workspace?reset"), wait_until="domcontentloaded")
    page.wait_for_url(f"**/lab/workspaces/{name}**", timeout=APP_LOAD_TIMEOUT)
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    page.wait_for_timeout(5000)  # restoring runs the commands after the page is up


def _started_in(lab: LabServer) -> list[str]:
    record: Path = lab.shell_record  # type: ignore[attr-defined]
    return record.read_text().split() if record.exists() else []


@contextmanager
def _attacked(page: Page, lab: LabServer, name: str) -> Iterator[tuple[Path, LoopbackListener]]:
    """The files planted and the workspace file opened in the page: the flag the
    fsmonitor command would make and the listener the help tab would reach."""
    listener = LoopbackListener(b"HTTP/1.0 200 OK\r\n\r\n")
    try:
        flag = _plant(lab, listener, name)
        _open_workspace_file(page, lab, name)
        page.wait_for_timeout(3000)
        yield flag, listener
    finally:
        listener.close()


def test_a_workspace_file_runs_a_host_command_without_the_guard(page: Page, plain_lab: LabServer) -> None:
    with _attacked(page, plain_lab, "control") as (flag, listener):
        assert "evil" in [t["name"] for t in plain_lab.request("GET", "/api/terminals")]
        assert str((plain_lab.notebooks / "control" / "proj").resolve()) in _started_in(plain_lab)
        assert flag.exists(), "the control did not run the repository's fsmonitor command"
        assert listener.accepted, "the control's help tab did not connect"


def test_a_workspace_file_a_sandbox_wrote_starts_no_shell(page: Page, guarded_lab: LabServer) -> None:
    with _attacked(page, guarded_lab, "attack") as (flag, listener):
        assert guarded_lab.request("GET", "/api/terminals") == []
        assert _started_in(guarded_lab) == []
        assert not flag.exists()
        assert listener.accepted == 0
        stored = guarded_lab.request("GET", "/lab/api/workspaces/attack")
        assert "terminal:evil" not in stored["data"] and "help-doc:leak" not in stored["data"]
        assert "restore entries dropped" in guarded_lab.log_tail()


@contextmanager
def _imported(page: Page, lab: LabServer, name: str) -> Iterator[tuple[Path, LoopbackListener]]:
    """The planted workspace file put into Lab's workspace folder by ``jupyter
    lab workspaces import`` (a host command the user runs on the file: no
    request to the server), then Lab opened on that workspace."""
    for terminal in lab.request("GET", "/api/terminals"):  # (an "evil" of an earlier test: Lab would reuse it)
        lab.request("DELETE", f"/api/terminals/{terminal['name']}")
    listener = LoopbackListener(b"HTTP/1.0 200 OK\r\n\r\n")
    try:
        flag = _plant(lab, listener, name)
        env = {**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(lab.root / "jupyter" / "workspaces")}
        subprocess.run(
            [str(JUPYTER), "lab", "workspaces", "import", str(lab.notebooks / name / "report.jupyterlab-workspace")],
            check=True,
            env=env,
            capture_output=True,
            timeout=120,
        )
        page.goto(lab.url(f"/lab/workspaces/{name}"), wait_until="domcontentloaded")
        page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
        page.wait_for_timeout(8000)  # restoring runs the commands after the page is up
        yield flag, listener
    finally:
        listener.close()


def test_an_imported_workspace_runs_a_host_command_without_the_guard(page: Page, plain_lab: LabServer) -> None:
    with _imported(page, plain_lab, "imported-control") as (flag, listener):
        assert "evil" in [t["name"] for t in plain_lab.request("GET", "/api/terminals")]
        assert flag.exists(), "the control did not run the repository's fsmonitor command"


def test_a_workspace_stored_unchecked_is_served_without_what_starts_things(page: Page, guarded_lab: LabServer) -> None:
    with _imported(page, guarded_lab, "imported") as (flag, listener):
        assert guarded_lab.request("GET", "/api/terminals") == []
        assert not flag.exists() and listener.accepted == 0
        served = guarded_lab.request("GET", "/lab/api/workspaces/imported")
        assert "terminal:evil" not in served["data"] and "help-doc:leak" not in served["data"]
        listed = guarded_lab.request("GET", "/lab/api/workspaces")["workspaces"]
        (value,) = [v for v in listed["values"] if v["metadata"]["id"] == "imported"]
        assert "terminal:evil" not in value["data"] and "layout-restorer:data" in value["data"]
        assert "stored workspace 'imported': restore entries left out" in guarded_lab.log_tail()


def test_the_users_own_terminal_tabs_are_restored(page: Page, guarded_lab: LabServer) -> None:
    """Lab's own layout, with a terminal the user opened, comes back after a reload."""
    page.goto(guarded_lab.url("/lab?reset"), wait_until="domcontentloaded")
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    page.locator(".jp-LauncherCard", has_text="Terminal").first.click()
    page.locator(".jp-Terminal").first.wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    names = [t["name"] for t in guarded_lab.request("GET", "/api/terminals")]
    assert len(names) == 1
    page.wait_for_timeout(3000)  # Lab saves the layout after a change
    stored = guarded_lab.request("GET", "/lab/api/workspaces/default")
    assert stored["data"][f"terminal:{names[0]}"] == {"data": {"name": names[0]}}
    page.reload(wait_until="domcontentloaded")
    page.locator(".jp-Terminal").first.wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    assert [t["name"] for t in guarded_lab.request("GET", "/api/terminals")] == names


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"data": {}, "metadata": {"id": "bad"}', "the workspace is not JSON"),
        (b'{"data": {"x": NaN}, "metadata": {"id": "bad"}}', "NaN is not JSON"),
        (b'{"data": [], "metadata": {"id": "bad"}}', "not a workspace: its 'data' is not an object"),
        (b'{"data": {}}', "not a workspace: its 'metadata' has no string 'id'"),
    ],
)
def test_a_malformed_workspace_is_refused_by_name(guarded_lab: LabServer, body: bytes, said: str) -> None:
    stored = guarded_lab.request("GET", "/lab/api/workspaces/bad")
    request = urllib.request.Request(
        f"{guarded_lab.base_url}/lab/api/workspaces/bad",
        data=body,
        method="PUT",
        headers={"Authorization": f"token {guarded_lab.token}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert said in json.loads(refused.value.read())["message"]
    assert guarded_lab.request("GET", "/lab/api/workspaces/bad") == stored


def test_what_the_warning_quotes_reaches_the_log_escaped(guarded_lab: LabServer) -> None:
    """The keys of the dropped entries are the file's words: the warning (LabApp's
    log, in the terminal that runs the server) shows them as text."""
    key = "terminal:\x1b]52;c;ZWNobyBwd25lZAo=\x07"
    workspace = {"data": {key: {"data": {"name": "x\x1b[2J"}}}, "metadata": {"id": "escapes"}}
    guarded_lab.request("PUT", "/lab/api/workspaces/escapes", workspace)
    log = guarded_lab.log_bytes()
    assert b"\x1b" not in log and b"\x07" not in log
    assert r"terminal:\x1b]52;c;ZWNobyBwd25lZAo=\x07: a terminal that is not running" in log.decode()
