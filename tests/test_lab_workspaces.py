"""What sandbox_kernel.lab_workspaces keeps of a workspace's restore entries.

The browser test (tests/browser/test_workspace_file_restore.py) shows the
attack and the guard end to end; these check each rule, and that a workspace
as JupyterLab 4 saves it passes unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sandbox_kernel.lab_workspaces import WORKSPACE_LOADER, guarded, shape_problem

#: a workspace as Lab 4.6 saves it: a notebook, an editor, an image, a running
#: terminal, a console, a help page, the plugin manager, a cloned output, layout
LABS_OWN: dict[str, Any] = {
    "data": {
        "layout-restorer:data": {
            "main": {
                "dock": {
                    "type": "tab-area",
                    "currentIndex": 1,
                    "widgets": ["notebook:a.ipynb", "editor:b.py", "terminal:1", "console:Console 1"],
                },
                "current": "notebook:a.ipynb",
            },
            "down": {"size": 0, "widgets": []},
            "left": {"collapsed": False, "visible": True, "current": "filebrowser", "widgets": ["filebrowser"]},
            "right": {"collapsed": True, "visible": True, "widgets": []},
            "relativeSizes": [0.2, 0.8, 0],
            "top": {"simpleVisibility": True},
        },
        "notebook:a.ipynb": {"data": {"path": "a.ipynb", "factory": "Notebook"}},
        "editor:b.py": {"data": {"path": "b.py", "factory": "Editor"}},
        "imageviewer:c.png": {"data": {"path": "c.png", "factory": "Image"}},
        "mimedocument:d.json:JSON": {"data": {"path": "d.json", "factory": "JSON"}},
        "terminal:1": {"data": {"name": "1"}},
        "console:Console 1": {
            "data": {
                "path": "Console 1",
                "name": "Console 1",
                "kernelPreference": {"name": "sandbox-python", "language": "python", "shouldStart": True},
            }
        },
        "help-doc:https://jupyterlab.readthedocs.io/en/latest/": {
            "data": {"url": "https://jupyterlab.readthedocs.io/en/latest/", "text": "JupyterLab Reference"}
        },
        "plugins:plugins": {"data": {"query": "widgets"}},
        "cloned-outputs:a.ipynb:3": {"data": {"path": "a.ipynb", "index": 3}},
        "inspector:inspector": {"data": {}},
        "file-browser-filebrowser:cwd": {"path": "work"},
        "workspace-ui:lastSave": "mine.jupyterlab-workspace",
    },
    "metadata": {"id": "default", "last_modified": "2026-11-28T01:00:00+00:00"},
}


def _entry(key: str, args: Any) -> dict[str, Any]:
    return {"data": {key: {"data": args}}, "metadata": {"id": "w"}}


def _kept(key: str, args: Any, running: tuple[str, ...] = ()) -> Any:
    clean, dropped = guarded(_entry(key, args), running)
    if key not in clean["data"]:
        assert dropped and dropped[0].startswith(f"{key}: ")
        return None
    assert not dropped
    return clean["data"][key]["data"]


def test_what_lab_saves_itself_passes_unchanged() -> None:
    before = copy.deepcopy(LABS_OWN)
    clean, dropped = guarded(LABS_OWN, ["1"])
    assert (clean, dropped) == (LABS_OWN, [])
    assert before == LABS_OWN, "the workspace given was changed"


def test_a_terminal_is_restored_only_by_the_name_of_a_running_one() -> None:
    assert _kept("terminal:1", {"name": "1", "cwd": "proj"}, running=("1",)) == {"name": "1"}
    assert _kept("terminal:evil", {"name": "evil", "cwd": "proj"}, running=("1",)) is None
    assert _kept("terminal:evil", {"name": "evil"}) is None  # a new shell, in the server's folder
    assert _kept("terminal:1", {"name": 1}, running=("1",)) is None
    assert _kept("terminal:1", {"cwd": "/"}, running=("1",)) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/?d=private",  # window.open when Lab is served over https
        "javascript:alert(1)",
        "/files/report.html",
        "//attacker.example/",
        " https://x.example/",
        7,
    ],
)
def test_a_help_tab_keeps_only_an_https_address(url: Any) -> None:
    assert _kept("help-doc:x", {"url": url, "text": "Help"}) is None


def test_a_help_tab_never_opens_a_browser_tab() -> None:
    args = {"url": "https://x.example/", "text": "Help", "newBrowserTab": True}
    assert _kept("help-doc:x", args) == {"url": "https://x.example/", "text": "Help"}


@pytest.mark.parametrize("namespace", ["notebook", "editor", "htmlviewer", "mimedocument", "anything"])
def test_a_document_tab_keeps_its_path_and_factory(namespace: str) -> None:
    args = {"path": "a.ipynb", "factory": "Notebook", "kernel": {"name": "python3"}, "options": {"mode": "split-right"}}
    assert _kept(f"{namespace}:a.ipynb", args) == {"path": "a.ipynb", "factory": "Notebook"}
    assert _kept(f"{namespace}:a.ipynb", {"path": "a.ipynb", "kernel": {"name": "python3"}}) is None
    assert _kept(f"{namespace}:a.ipynb", {"path": ["a.ipynb"], "factory": "Notebook"}) is None


@pytest.mark.parametrize(
    "args",
    [
        {"path": "next.jupyterlab-workspace", "factory": "Editor"},
        {"path": "Next.JupyterLab-Workspace", "factory": "Editor"},
        {"path": "next.json", "factory": WORKSPACE_LOADER},
    ],
)
def test_no_tab_loads_another_workspace(args: dict[str, str]) -> None:
    assert _kept("editor:next", args) is None


def test_a_console_keeps_its_path_name_and_kernel_preference() -> None:
    args = {
        "path": "c",
        "name": "c",
        "kernelPreference": {"name": "sandbox-python", "shouldStart": True, "shouldStart2": 1, "language": 3},
        "cwd": "/",
        "basePath": "..",
        "insertMode": "split-right",
    }
    assert _kept("console:c", args) == {
        "path": "c",
        "name": "c",
        "kernelPreference": {"name": "sandbox-python", "shouldStart": True},
    }


def test_the_plugin_manager_does_not_start_acknowledged() -> None:
    assert _kept("plugins:plugins", {"query": "hints", "isDisclaimed": True}) == {"query": "hints"}


def test_a_cloned_output_needs_a_path_and_an_index() -> None:
    assert _kept("cloned-outputs:a", {"path": "a.ipynb", "index": 1, "x": 2}) == {"path": "a.ipynb", "index": 1}
    assert _kept("cloned-outputs:a", {"path": "a.ipynb", "index": True}) is None


@pytest.mark.parametrize("args", ["cwd", ["proj"], 3, None])
def test_restore_arguments_that_are_not_an_object_are_dropped(args: Any) -> None:
    assert _kept("terminal:1", args, running=("1",)) is None


def test_the_namespace_is_the_first_token_as_in_lab() -> None:
    """Lab's state database lists a namespace's keys by the text before the first colon."""
    clean, _ = guarded(_entry("terminal:a:b", {"name": "evil"}), ())
    assert clean["data"] == {}
    clean, _ = guarded(_entry("terminalx:a", {"name": "evil", "cwd": "p"}), ())
    assert clean["data"]["terminalx:a"] == {"data": {"name": "evil", "cwd": "p"}}  # no tracker restores it


@pytest.mark.parametrize(
    ("workspace", "problem"),
    [
        ([], "a workspace is a JSON object"),
        ({"metadata": {"id": "w"}}, "its 'data' is not an object"),
        ({"data": [], "metadata": {"id": "w"}}, "its 'data' is not an object"),
        ({"data": {}}, "its 'metadata' has no string 'id'"),
        ({"data": {}, "metadata": {"id": 3}}, "its 'metadata' has no string 'id'"),
        ({"data": {}, "metadata": {"id": "w"}}, ""),
    ],
)
def test_shape_problems_are_named(workspace: Any, problem: str) -> None:
    assert shape_problem(workspace) == problem
