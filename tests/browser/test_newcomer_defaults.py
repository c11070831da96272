"""Issue 15: a newcomer who never read the README lands in the sandbox.

The server is started with ``scripts/lab_config.py``, the configuration the
README's command (``scripts/lab.sh``) passes with ``--config``; one test checks
that lab.sh does pass it. What is attacked:

* a user clicking the launcher's first tile, opening a notebook saved with the
  stock ``python3`` kernel or one without kernel metadata: every path must end
  on ``sandbox-python``;
* a client (a script, another tab, a notebook's metadata) asking the server for
  the unsandboxed kernel by name, in several spellings and through each API that
  starts kernels: refused, and no unsandboxed kernel process appears;
* with the stock kernel asked back (``lab.sh --with-stock-kernel``), a
  ``python3`` notebook must say "Not sandboxed" in the item's place (JupyterLab
  status bar, Notebook 7 toolbar) and switch to the sandbox in one click.

nbclient (and so papermill), which do not go through the Lab server, still get
the ``python3`` they name. Screenshots: test-artifacts/browser/NN-newcomer-*.png.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_helpers import LAB_CONFIG, REPO, LabServer, notebook_json
from playwright.sync_api import Locator, Page, expect

from sandbox_kernel.lab_content_policy import REMOTE_CONTENT_ENV, SERVER_LOG_FORMATTER

pytestmark = pytest.mark.timeout(300)

APP_LOAD_TIMEOUT = 60_000
KERNEL_TIMEOUT = 60_000
CELL_TIMEOUT = 60_000
ITEM = ".sk-status-item"
STOCK_ENV = "SANDBOX_KERNEL_STOCK_KERNEL"
HOSTNAME_CELL = "import socket; print(socket.gethostname())"
VENV_PYTHON = Path(sys.executable)


class Shots:
    counter = 0

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, page: Page, name: str) -> Path:
        Shots.counter += 1
        path = self.directory / f"{Shots.counter:02d}-newcomer-{name}.png"
        page.screenshot(path=str(path))
        return path


@pytest.fixture
def shot(artifacts: Path) -> Shots:
    return Shots(artifacts)


# Another unsandboxed Python kernel, as ``ipykernel install --name host-python`` makes
# one: hidden too (by language, not only ipykernel's name).
HOST_PYTHON = "host-python"


def _serve(root: Path, artifacts: Path, log_name: str, stock: bool) -> Iterator[LabServer]:
    """A Lab server started as ``scripts/lab.sh [--with-stock-kernel]`` starts it."""
    kernels = root / "jupyter-path" / "kernels" / HOST_PYTHON
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(VENV_PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python (host)",
                "language": "python",
            }
        )
    )
    server = LabServer(
        root,
        extra_args=[f"--config={LAB_CONFIG}"],
        extra_env={STOCK_ENV: "1" if stock else "", "JUPYTER_PATH": str(root / "jupyter-path")},
    )
    try:
        yield server
    finally:
        leftovers = server.stop()
        shutil.copyfile(server.log_path, artifacts / log_name)
        assert not leftovers, f"processes of the server still alive after it stopped; killed now: {leftovers}"


@pytest.fixture(scope="module")
def lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """The README's Lab (overrides conftest's plain server; the browser fixtures use it)."""
    yield from _serve(tmp_path_factory.mktemp("readme-lab"), artifacts, "jupyter-lab-newcomer.log", stock=False)


@pytest.fixture(scope="class")
def stock_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """The README's Lab with the stock kernel asked back (``lab.sh --with-stock-kernel``)."""
    yield from _serve(tmp_path_factory.mktemp("stock-lab"), artifacts, "jupyter-lab-stock.log", stock=True)


# ---- helpers ------------------------------------------------------------------------


def put_notebook(lab: LabServer, name: str, kernelspec: dict[str, str] | None, cells: list[str] | None = None) -> None:
    """A notebook whose metadata names ``kernelspec`` (None: no metadata at all, not even a language)."""
    nb = notebook_json(cells or [""])
    if kernelspec is None:
        nb["metadata"] = {}
    else:
        nb["metadata"]["kernelspec"] = kernelspec
    lab.request("PUT", f"/api/contents/{name}", {"type": "notebook", "format": "json", "content": nb})


STOCK_SPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def kernel_name_of(lab: LabServer, path: str) -> str | None:
    sess = lab.session_for(path)
    return sess["kernel"]["name"] if sess else None


def wait_kernel_name(lab: LabServer, path: str, expected: str, page: Page) -> None:
    """Poll /api/sessions until ``path``'s kernel is ``expected`` (the UI drives the change)."""
    for _ in range(int(KERNEL_TIMEOUT / 500)):
        if kernel_name_of(lab, path) == expected:
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"kernel of {path} is {kernel_name_of(lab, path)!r}, expected {expected!r}")


def run_cell(page: Page, code: str) -> Locator:
    """Type ``code`` into the last cell of the visible notebook and run it; the cell, once counted."""
    all_cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")
    cell = all_cells.nth(all_cells.count() - 1)
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Delete")
    page.keyboard.type(code)
    expect(editor).to_have_text(code)
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=CELL_TIMEOUT)
    return cell


def stdout_of(cell: Locator) -> str:
    return "".join(
        cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]').all_inner_texts()
    ).strip()


def goto(page: Page, lab: LabServer, path: str) -> None:
    page.goto(lab.url(path), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)


def item(page: Page) -> Locator:
    return page.locator(f"{ITEM}:visible")


def server_kernel_processes(lab: LabServer) -> list[str]:
    """Command lines of the kernels the server started (ipykernel's or ours)."""
    found = []
    for proc in lab.descendants():
        try:
            cmd = " ".join(proc.cmdline())
        except Exception:
            continue
        if "ipykernel_launcher" in cmd or "-m ipykernel" in cmd or "-m sandbox_kernel" in cmd:
            found.append(cmd)
    return found


# ---- the README's command ----------------------------------------------------------


def _show_config(*args: str, tmp: Path, cwd: Path | None = None, extra_env: dict[str, str] | None = None) -> str:
    env = {
        **{k: v for k, v in os.environ.items() if k != REMOTE_CONTENT_ENV},
        **(extra_env or {}),
        "SANDBOX_KERNEL_NOTEBOOKS": str(tmp / "notebooks"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
    }
    env.pop(STOCK_ENV, None)
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "lab.sh"), *args, "--show-config"],
        cwd=str(cwd or tmp),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def test_lab_sh_passes_the_shared_config(tmp_path: Path) -> None:
    """lab.sh loads scripts/lab_config.py (the file the tests use), and
    ``--with-stock-kernel`` is the documented way back to the stock kernel."""
    default = _show_config(tmp=tmp_path)
    assert str(LAB_CONFIG) in default, default
    assert "default_kernel_name = 'sandbox-python'" in default, default
    assert "SandboxKernelSpecManager" in default, default
    assert ".allow_unsandboxed_python = False" in default, default
    assert "'Content-Security-Policy': \"default-src 'self'" in default, default
    stock = _show_config("--with-stock-kernel", tmp=tmp_path)
    assert ".allow_unsandboxed_python = True" in stock, stock
    assert "default_kernel_name = 'sandbox-python'" in stock, stock
    # the content policy is off only when asked for, by name
    remote = _show_config(tmp=tmp_path, extra_env={REMOTE_CONTENT_ENV: "1"})
    assert "Content-Security-Policy" not in remote, remote
    # workspace files start no host shell, exports import nothing a notebook names, whatever the policy
    # and the server's log, and each extension's, escape what a sandbox named (test_server_log.py)
    for shown in (default, remote):
        assert "'sandbox_kernel.lab_workspaces': True" in shown, shown
        assert "'sandbox_kernel.lab_exports': True" in shown, shown
        assert shown.count(f"'class': '{SERVER_LOG_FORMATTER}'") == 2, shown


def test_lab_sh_never_opens_notebooks_in_the_repository(tmp_path: Path) -> None:
    """A notebook's folder is its sandbox's read-write workspace; the repository
    holds what the host runs (scripts, venv, package). Started from the
    repository, Lab opens on a notebooks folder outside it; started elsewhere,
    on that folder."""
    from_repo = _show_config(tmp=tmp_path, cwd=REPO)
    assert f"root_dir = '{tmp_path / 'notebooks'}'" in from_repo, from_repo
    assert (tmp_path / "notebooks").is_dir()
    elsewhere = _show_config(tmp=tmp_path)
    assert f"root_dir = '{tmp_path}'" in elsewhere, elsewhere


def test_kernelspecs_offer_only_the_sandboxed_python(lab: LabServer) -> None:
    specs = lab.request("GET", "/api/kernelspecs")
    assert specs["default"] == "sandbox-python", specs["default"]
    python_specs = sorted(
        name for name, spec in specs["kernelspecs"].items() if spec["spec"]["language"].lower() == "python"
    )
    assert python_specs == ["sandbox-python"], f"unsandboxed Python kernels are offered: {python_specs}"
    for name in ("python3", "PYTHON3"):
        with pytest.raises(urllib.error.HTTPError) as err:
            lab.request("GET", f"/api/kernelspecs/{name}")
        assert err.value.code == 404, (name, err.value.code)


@pytest.mark.parametrize("name", ["python3", "PYTHON3", "Python3", HOST_PYTHON])
def test_client_cannot_start_the_stock_kernel(lab: LabServer, name: str) -> None:
    """Attack: a client (a script with the token, a notebook's metadata, another
    tab) asks the README's Lab for ipykernel's kernel by name, through each API
    that starts kernels. Every request is refused and no unsandboxed kernel runs."""
    before = {k["id"] for k in lab.kernels()}
    attempts: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/api/kernels", {"name": name}),
        (
            "POST",
            "/api/sessions",
            {"path": f"attack-{name.strip()}.ipynb", "type": "notebook", "name": "", "kernel": {"name": name}},
        ),
    ]
    for method, path, body in attempts:
        try:
            answer = lab.request(method, path, body, timeout=KERNEL_TIMEOUT / 1000)
        except urllib.error.HTTPError as exc:
            assert exc.code >= 400
            continue
        raise AssertionError(f"{method} {path} {body} started something: {answer}")
    # Swap the kernel of an existing sandboxed session for the stock one.
    sess = lab.request(
        "POST",
        "/api/sessions",
        {"path": f"swap-{name.strip()}.ipynb", "type": "notebook", "name": "", "kernel": {"name": "sandbox-python"}},
        timeout=KERNEL_TIMEOUT / 1000,
    )
    assert sess["kernel"]["name"] == "sandbox-python"
    try:
        try:
            lab.request(
                "PATCH", f"/api/sessions/{sess['id']}", {"kernel": {"name": name}}, timeout=KERNEL_TIMEOUT / 1000
            )
        except urllib.error.HTTPError as exc:
            assert exc.code >= 400
        now = lab.request("GET", f"/api/sessions/{sess['id']}")
        assert now["kernel"]["name"] == "sandbox-python", now
        new = [k for k in lab.kernels() if k["id"] not in before]
        assert all(k["name"] == "sandbox-python" for k in new), new
        stock = [c for c in server_kernel_processes(lab) if "sandbox_kernel" not in c]
        assert not stock, f"an unsandboxed kernel process runs: {stock}"
    finally:
        lab.request("DELETE", f"/api/sessions/{sess['id']}")


def test_nbclient_still_gets_the_python3_it_names(tmp_path: Path) -> None:
    """papermill/nbclient do not read the Lab's config: naming ``python3`` in the
    project venv gives the stock kernel of that venv (not refused, not swapped)."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import sys, socket; print(sys.prefix); print(socket.gethostname())")]
    nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    lines = "".join(o.get("text", "") for o in nb.cells[0].outputs).split()
    assert Path(lines[0]).resolve() == Path(sys.prefix).resolve(), lines
    assert lines[1] != "sandbox", "python3 ran in the sandbox: nbclient did not get the kernel it named"


# ---- the README's Lab in the browser -------------------------------------------------


def test_launcher_first_tile_opens_a_sandboxed_notebook(page: Page, lab: LabServer, shot: Shots) -> None:
    goto(page, lab, "/lab?reset")
    tiles = page.locator('.jp-LauncherCard[data-category="Notebook"]')
    expect(tiles.first).to_be_visible(timeout=APP_LOAD_TIMEOUT)
    titles = [t or "" for t in tiles.evaluate_all("els => els.map(e => e.getAttribute('title') || e.innerText)")]
    assert titles and "sandboxed" in titles[0], f"first Notebook tile: {titles}"
    assert not any("ipykernel" in t for t in titles), f"the launcher offers the stock kernel: {titles}"
    shot(page, "launcher")
    before = {s["path"] for s in lab.sessions()}
    tiles.first.click()
    page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").first.wait_for(timeout=APP_LOAD_TIMEOUT)
    new: list[dict[str, Any]] = []
    for _ in range(120):
        new = [s for s in lab.sessions() if s["path"] not in before]
        if new:
            break
        page.wait_for_timeout(500)
    assert len(new) == 1, new
    assert new[0]["kernel"]["name"] == "sandbox-python", new[0]
    path = new[0]["path"]
    lab.wait_kernel_idle(path, timeout=KERNEL_TIMEOUT / 1000)
    expect(item(page)).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    expect(item(page).locator(".sk-status-label")).to_have_text(re.compile(r"^Network: proxied · \d+ domains?$"))
    expect(page.locator(".jp-NotebookPanel:visible .jp-NotebookPanel-toolbar")).to_contain_text("Python 3 (sandboxed)")
    cell = run_cell(page, HOSTNAME_CELL)
    assert stdout_of(cell) == "sandbox", stdout_of(cell)
    shot(page, "launcher-notebook-sandboxed")

    # Once private, the popup says that links in outputs are disabled.
    cell = run_cell(page, "import sandbox_kernel.private as p; p.add_dataset('patients', 'CONFIDENTIAL')")
    expect(item(page).locator(".sk-status-label")).to_have_text("Network off · CONFIDENTIAL", timeout=KERNEL_TIMEOUT)
    item(page).click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog.locator(".sk-status-links-disabled")).to_contain_text("Links in outputs are disabled")
    # this Lab applies the page policy: no warning that files could still fetch
    expect(dialog.locator(".sk-status-no-page-policy")).to_have_count(0)
    shot(page, "popup-links-disabled")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


def test_stock_kernel_notebook_opens_on_the_sandbox(page: Page, lab: LabServer, shot: Shots) -> None:
    """A notebook saved with the stock kernel, opened in the README's Lab, runs sandboxed."""
    put_notebook(lab, "saved-with-python3.ipynb", STOCK_SPEC)
    goto(page, lab, "/lab/tree/saved-with-python3.ipynb?reset")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=APP_LOAD_TIMEOUT)
    dialog = page.locator(".jp-Dialog")
    wait_kernel_name(lab, "saved-with-python3.ipynb", "sandbox-python", page)
    expect(dialog).to_have_count(0)
    expect(item(page)).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    cell = run_cell(page, HOSTNAME_CELL)
    assert stdout_of(cell) == "sandbox", stdout_of(cell)
    shot(page, "python3-notebook-sandboxed")


def test_notebook_without_kernel_metadata_gets_the_sandbox(page: Page, lab: LabServer, shot: Shots) -> None:
    put_notebook(lab, "no-metadata.ipynb", None)
    goto(page, lab, "/lab/tree/no-metadata.ipynb?reset")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=APP_LOAD_TIMEOUT)
    # JupyterLab asks which kernel (its autoStartDefaultKernel setting is off):
    # the preselected one is the sandbox, and nothing unsandboxed is offered.
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible(timeout=KERNEL_TIMEOUT)
    select = dialog.locator("select")
    expect(select).to_have_count(1)
    assert "sandbox-python" in select.input_value(), f"preselected kernel: {select.input_value()}"
    options = select.locator("option").all_inner_texts()
    assert not any("ipykernel" in o or "host" in o.lower() for o in options), options
    shot(page, "no-metadata-dialog")
    dialog.locator(".jp-mod-accept").click()
    wait_kernel_name(lab, "no-metadata.ipynb", "sandbox-python", page)
    expect(item(page)).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    shot(page, "no-metadata-sandboxed")


# ---- the stock kernel asked back: "Not sandboxed" and the switch ----------------------


class TestStockKernelAskedBack:
    def test_lab_marks_not_sandboxed_and_switches(self, page: Page, stock_lab: LabServer, shot: Shots) -> None:
        lab = stock_lab
        specs = lab.request("GET", "/api/kernelspecs")
        assert "python3" in specs["kernelspecs"] and specs["default"] == "sandbox-python", specs
        put_notebook(lab, "stock.ipynb", STOCK_SPEC)
        goto(page, lab, "/lab/tree/stock.ipynb?reset")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=APP_LOAD_TIMEOUT)
        lab.wait_kernel_idle("stock.ipynb", timeout=KERNEL_TIMEOUT / 1000)
        assert kernel_name_of(lab, "stock.ipynb") == "python3"
        status = item(page)
        expect(status).to_have_count(1, timeout=KERNEL_TIMEOUT)
        expect(status).to_have_attribute("data-phase", "unsandboxed")
        expect(status.locator(".sk-status-label")).to_have_text("Not sandboxed")
        expect(status).to_have_class(re.compile(r"\bsk-mod-unsandboxed\b"))
        expect(status).to_have_class(re.compile(r"\bsk-status-statusbar-item\b"))
        cell = run_cell(page, HOSTNAME_CELL)
        assert stdout_of(cell) not in ("", "sandbox"), "the stock kernel should run on the host here"
        shot(page, "lab-not-sandboxed")

        # The popup explains; the item's own button switches in one click.
        status.locator(".sk-status-label").click()
        dialog = page.locator(".sk-unsandboxed-dialog")
        expect(dialog.locator(".sk-status-unsandboxed")).to_contain_text("not sandboxed")
        expect(dialog.locator("button.sk-switch-kernel")).to_be_visible()
        shot(page, "lab-not-sandboxed-popup")
        page.keyboard.press("Escape")
        expect(dialog).to_have_count(0)

        status.locator("button.sk-switch-kernel").click()
        wait_kernel_name(lab, "stock.ipynb", "sandbox-python", page)
        expect(status).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
        expect(status.locator(".sk-status-label")).to_have_text(re.compile(r"^Network: proxied · \d+ domains?$"))
        expect(page.locator(".jp-NotebookPanel:visible .jp-NotebookPanel-toolbar")).to_contain_text(
            "Python 3 (sandboxed)"
        )
        cell = run_cell(page, HOSTNAME_CELL)
        assert stdout_of(cell) == "sandbox", stdout_of(cell)
        assert not [c for c in server_kernel_processes(lab) if "sandbox_kernel" not in c], (
            "the stock kernel kept running after the switch"
        )
        shot(page, "lab-switched")

    def test_notebook7_toolbar_marks_not_sandboxed_and_switches(
        self, page: Page, stock_lab: LabServer, shot: Shots
    ) -> None:
        lab = stock_lab
        put_notebook(lab, "stock-nb7.ipynb", STOCK_SPEC)
        goto(page, lab, "/notebooks/stock-nb7.ipynb")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=APP_LOAD_TIMEOUT)
        lab.wait_kernel_idle("stock-nb7.ipynb", timeout=KERNEL_TIMEOUT / 1000)
        assert kernel_name_of(lab, "stock-nb7.ipynb") == "python3"
        status = page.locator(f".jp-NotebookPanel-toolbar {ITEM}:visible")
        expect(status).to_have_count(1, timeout=KERNEL_TIMEOUT)
        expect(status).to_have_attribute("data-phase", "unsandboxed")
        expect(status.locator(".sk-status-label")).to_have_text("Not sandboxed")
        shot(page, "nb7-not-sandboxed")
        # This time through the popup's button.
        status.locator(".sk-status-label").click()
        dialog = page.locator(".sk-unsandboxed-dialog")
        dialog.locator(".jp-Dialog-footer button.sk-switch-kernel").click()
        wait_kernel_name(lab, "stock-nb7.ipynb", "sandbox-python", page)
        expect(status).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
        expect(status.locator(".sk-status-label")).to_have_text(re.compile(r"^Network: proxied · \d+ domains?$"))
        cell = run_cell(page, HOSTNAME_CELL)
        assert stdout_of(cell) == "sandbox", stdout_of(cell)
        shot(page, "nb7-switched")


def test_lab_sh_refuses_a_server_extension_list_that_would_drop_the_guards(tmp_path: Path) -> None:
    """On the command line, ``--ServerApp.jpserver_extensions`` replaces the
    whole list that ``lab_content_policy.apply`` set: no guard would load.
    lab.sh says so before it starts anything."""
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "lab.sh"), "--ServerApp.jpserver_extensions", "jupyter_lsp=True"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "would drop the sandbox's server extensions" in run.stderr
    assert "c.ServerApp.jpserver_extensions['name'] = True" in run.stderr
    assert not (tmp_path / "notebooks").exists()  # nothing was started or made
