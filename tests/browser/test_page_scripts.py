"""A script a sanitiser let through does not run in JupyterLab's page.

Everything a sandbox writes reaches the Lab page through a sanitiser: live
outputs through the kernel's output policy (Lab then shows them as trusted:
their HTML goes into the page as it is, and its scripts are run), files and
saved notebooks through Lab's, diagrams and math through mermaid's and
MathJax's. A script one of them misses runs in the Lab's origin, with the
page's powers: it starts a terminal, a shell on the host, through the REST
API. ``SandboxKernel.trust_outputs`` (the kernel's sanitiser switched off)
stands in here for a sanitiser that missed: the attack is a cell's HTML and
JavaScript outputs, each way a script can be written (Lab shows an SVG output
as an image, where nothing runs), and scripts the cell wrote into its
workspace, loaded from the page's own origin (``/files/``, and a notebook
whose script export is JavaScript through ``/nbconvert/``).

The page's policy (``lab_content_policy``) allows only the inline scripts the
installed pages ship, by hash, and the lab extension, told by the page config,
shows a JavaScript output as a note where Lab's renderer would run it with
``eval`` (which Lab needs allowed), and the server sends workspace files as
text, never as scripts (``lab_file_tabs``). The control is the same server
with all three as they were before: there every
vector runs and the host shell starts. Lab's, Notebook 7's and the login
page's own scripts run with nothing refused. The policy's cost is tested too:
a file the user trusts in Lab's HTML viewer runs its script in the control
only, and the guarded Lab says why.
"""

from __future__ import annotations

import html
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_helpers import LabServer, code_cell, notebook_json, serving, with_inline_scripts
from playwright.sync_api import Locator, Page, expect

from sandbox_kernel.lab_content_policy import content_security_policy, page_script_hashes
from sandbox_kernel.page_scripts import read_page, script_hash

pytestmark = pytest.mark.timeout(300)

APP_LOAD_TIMEOUT = 90_000
CELL_TIMEOUT = 90_000

#: what the attacker's script does with the page's powers: start a host shell
START_A_SHELL = (
    "const c = JSON.parse(document.getElementById('jupyter-config-data').textContent);"
    "const x = decodeURIComponent((document.cookie.match(/_xsrf=([^;]+)/) || [, ''])[1]);"
    "fetch(c.baseUrl + 'api/terminals', {method: 'POST', headers: {Authorization: 'token ' + c.token,"
    " 'X-XSRFToken': x}});"
)

#: each way a script can be written into an output (mime type, data), reporting to the test's probe
ATTACK_OUTPUTS = [
    ("text/html", f"""<img src="data:," onerror="window.__skRan('img-onerror'); {html.escape(START_A_SHELL)}">"""),
    ("text/html", "<b>report</b><script>window.__skRan('script-element')</script>"),
    ("application/javascript", "window.__skRan('javascript-output')"),
    ("text/html", '<iframe srcdoc="<script>parent.__skRan(&quot;srcdoc-frame&quot;)</script>"></iframe>'),
    ("text/html", """<svg><animate onbegin="window.__skRan('svg-animate')" attributeName="x" dur="1s"/></svg>"""),
]
#: a notebook whose script export is JavaScript (nbconvert takes the type from language_info)
JS_NOTEBOOK = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {"language_info": {"name": "javascript", "mimetype": "text/javascript", "file_extension": ".js"}},
    "cells": [
        {
            "cell_type": "code",
            "id": "js",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "window.__skRan('nbconvert-script')",
        }
    ],
}
#: the cell writes scripts into its workspace, which the server sends from the page's own origin
WORKSPACE_SCRIPTS = [
    "import json, pathlib",
    "pathlib.Path('evil.js').write_text(\"window.__skRan('files-script')\")",
    f"pathlib.Path('js.ipynb').write_text(json.dumps({JS_NOTEBOOK!r}))",
]
ATTACK_OUTPUTS += [
    ("text/html", '<script src="/files/attack/evil.js"></script>'),
    ("text/html", '<script src="/nbconvert/script/attack/js.ipynb"></script>'),
]
ATTACK_CELL = "\n".join(
    [
        *WORKSPACE_SCRIPTS,
        "from IPython.display import display",
        *(f"display({{{mime!r}: {data!r}}}, raw=True)" for mime, data in ATTACK_OUTPUTS),
        'print("attack cell done")',
    ]
)
VECTORS = {
    "img-onerror",
    "script-element",
    "javascript-output",
    "srcdoc-frame",
    "svg-animate",
    "files-script",
    "nbconvert-script",
}


def _server(root: Path, log_copy: Path, guarded: bool) -> Iterator[LabServer]:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "page_scripts_config.py"
    lines = ["from sandbox_kernel import lab_content_policy", "lab_content_policy.apply(c)"]
    if not guarded:  # as it was: any inline script runs, Lab's JavaScript renderer, workspace files as scripts
        policy = with_inline_scripts(content_security_policy("/"))
        lines += [
            "c.ServerApp.jpserver_extensions['sandbox_kernel.lab_file_tabs'] = False",
            f"headers = {{**c.ServerApp.tornado_settings['headers'], 'Content-Security-Policy': {policy!r}}}",
            "settings = {k: v for k, v in c.ServerApp.tornado_settings.items() if k != 'page_config_hook'}",
            "c.ServerApp.tornado_settings = {**settings, 'headers': headers}",
        ]
    config.write_text("\n".join(lines) + "\n")
    with serving(
        root, log_copy, kernel_config="c.SandboxKernel.trust_outputs = True\n", extra_args=[f"--config={config}"]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def guarded_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    yield from _server(tmp_path_factory.mktemp("lab-scripts-guarded"), artifacts / "jupyter-lab-scripts.log", True)


@pytest.fixture(scope="module")
def plain_lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    yield from _server(tmp_path_factory.mktemp("lab-scripts-plain"), artifacts / "jupyter-lab-scripts-plain.log", False)


def _attack(page: Page, lab: LabServer, ui: str = "lab") -> tuple[set[str], int]:
    """Run the attack cell in JupyterLab (or Notebook 7); what ran, and how
    many host shells it started."""
    lab.request("PUT", "/api/contents/attack", {"type": "directory"})
    notebook = notebook_json()
    notebook["cells"] = [code_cell("attack", ATTACK_CELL.strip())]
    lab.request(
        "PUT", "/api/contents/attack/outputs.ipynb", {"type": "notebook", "format": "json", "content": notebook}
    )
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    path = "/lab/tree/attack/outputs.ipynb?reset" if ui == "lab" else "/notebooks/attack/outputs.ipynb"
    page.goto(lab.url(path), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    page.evaluate("() => { window.__skVectors = []; window.__skRan = (v) => window.__skVectors.push(v); }")
    cell = page.locator(".jp-Notebook .jp-Cell").first
    cell.wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    # Lab's page ran as it is: its own inline script (allowed by its hash) and everything else
    assert not refused, f"the policy refused part of Lab's own page: {refused}"
    lab.wait_kernel_idle("attack/outputs.ipynb", timeout=APP_LOAD_TIMEOUT / 1000)
    shells_before = len(lab.request("GET", "/api/terminals"))
    cell.locator(".jp-InputArea-prompt").click()
    page.keyboard.press("Shift+Enter")
    outputs = cell.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="attack cell done")).to_have_count(1, timeout=CELL_TIMEOUT)
    # the HTML itself was shown (trusted: as it is), only its scripts are in question
    expect(outputs.locator("img[onerror]")).to_have_count(1)
    expect(outputs.locator("iframe[srcdoc]")).to_have_count(1)
    page.wait_for_timeout(2000)  # an onerror, a frame's script, an animation's begin, a fetch
    ran = set(page.evaluate("() => window.__skVectors"))
    shells = len(lab.request("GET", "/api/terminals")) - shells_before
    return ran, shells


def test_lab_is_served_with_its_own_scripts_allowed_by_hash_and_no_other_inline(guarded_lab: LabServer) -> None:
    request = urllib.request.Request(guarded_lab.url("/lab"))
    with urllib.request.urlopen(request, timeout=30) as response:
        script_src = next(
            d.split()[1:]
            for d in response.headers["Content-Security-Policy"].split("; ")
            if d.startswith("script-src ")
        )
        lab_page = response.read().decode()
    assert "'unsafe-inline'" not in script_src
    # the Lab page runs one script of its own inline (the token removal): allowed
    inline = read_page(lab_page).inline_scripts
    assert len(inline) == 1 and "token" in inline[0]
    assert script_hash(inline[0]) in script_src
    assert set(page_script_hashes()) <= set(script_src)


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_a_script_in_an_output_does_not_run_in_the_page(page: Page, guarded_lab: LabServer, ui: str) -> None:
    ran, shells = _attack(page, guarded_lab, ui)
    assert ran == set(), f"scripts ran in the Lab's page: {sorted(ran)}"
    # the JavaScript output is shown as a note (the lab extension's renderer in Lab's place)
    expect(page.locator(".sk-output-script-not-run")).to_contain_text("was not run")
    assert shells == 0, "a script from a sandbox's output started a host shell"
    assert guarded_lab.wait_kernel_idle("attack/outputs.ipynb")


def test_control_the_same_outputs_under_the_old_policy_start_a_host_shell(page: Page, plain_lab: LabServer) -> None:
    ran, shells = _attack(page, plain_lab)
    assert ran == VECTORS, f"the control ran only {sorted(ran)}"
    assert shells == 1, "the control's script did not start a host shell"


def test_the_login_page_works_under_the_policy(page: Page, guarded_lab: LabServer) -> None:
    # the server's own page (a template of jupyter_server's, its token-removal script hashed)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.context.clear_cookies()
    page.goto(f"{guarded_lab.base_url}/lab", wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.locator("#password_input").fill(guarded_lab.token)
    page.locator("#password_input").press("Enter")
    page.locator(".jp-LabShell").wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    assert not refused, f"the policy refused part of the login page or Lab's: {refused}"


TRUSTED_PAGE = "<p>report</p><script>document.body.dataset.ran = 'yes'</script>"


def _trust_an_html_file(page: Page, lab: LabServer) -> Locator:
    """Open an HTML file with a script in Lab's viewer and press "Trust HTML";
    the viewer's frame's body."""
    lab.request("PUT", "/api/contents/trusted", {"type": "directory"})
    lab.request("PUT", "/api/contents/trusted/page.html", {"type": "file", "format": "text", "content": TRUSTED_PAGE})
    page.goto(lab.url("/lab/tree/trusted/page.html?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    frame = page.frame_locator(".jp-HTMLViewer iframe")
    expect(frame.locator("p")).to_have_text("report", timeout=APP_LOAD_TIMEOUT)
    page.get_by_role("button", name="Trust HTML").click()
    expect(page.locator(".jp-HTMLViewer iframe")).to_have_attribute("sandbox", re.compile("allow-scripts"))
    expect(frame.locator("p")).to_have_text("report")
    page.wait_for_timeout(1000)
    return frame.locator("body")


def test_a_trusted_html_file_runs_no_script_and_the_user_is_told(page: Page, guarded_lab: LabServer) -> None:
    # the cost of the policy: the frame's blob: document inherits it
    body = _trust_an_html_file(page, guarded_lab)
    expect(body).not_to_have_attribute("data-ran", "yes")
    expect(page.locator(".Toastify__toast", has_text="scripts do not run, trusted or not")).to_have_count(1)


def test_control_a_trusted_html_file_runs_its_script_under_the_old_policy(page: Page, plain_lab: LabServer) -> None:
    body = _trust_an_html_file(page, plain_lab)
    expect(body).to_have_attribute("data-ran", "yes")
    expect(page.locator(".Toastify__toast", has_text="trusted or not")).to_have_count(0)
