"""End to end: JupyterLab + the sandbox-kernel-status extension + the sandboxed kernel.

A real ``jupyter lab`` (started by the ``lab`` fixture, its ratchet store in a
temporary ``SANDBOX_KERNEL_DATA_DIR``) is driven by Debian's chromium through
Playwright. The tests share that server and run in file order, like a user's
afternoon: nb1 is made private from a cell, nb2 from the widget's button, nb1's
kernel is restarted (from the UI, through the REST API) and replaced, Notebook 7
shows the item in its toolbar, the popup says what made a widget-marked session
private, and the widget still follows a kernel restarted by another client.
Each test sets up what it needs when run alone.

Screenshots of every step: test-artifacts/browser/NN-*.png (FAILED-*.png/.html
on failure); the server log and the browser console are kept beside them."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_helpers import LabServer, Shots, serving
from playwright.sync_api import Locator, Page, expect

pytestmark = pytest.mark.timeout(240)

RATCHET_CELL = "import sandbox_kernel.private as p; p.add_dataset('patients', 'CONFIDENTIAL')"
IFACES_CELL = "import socket; print([n for _, n in socket.if_nameindex()])"
SYSTEM_NOTICE = "[SYSTEM] Network access has been restricted"
#: the label of a public session in PROXIED mode (the default)
PROXIED = re.compile(r"^Network: proxied · \d+ domains?$")

APP_LOAD_TIMEOUT = 60_000  # JupyterLab's first load on a small machine
KERNEL_TIMEOUT = 60_000  # a kernel start / sandbox replacement
CELL_TIMEOUT = 60_000

ITEM = ".sk-status-item"


# ---- helpers ------------------------------------------------------------------------


def status_item(page: Page) -> Locator:
    """The visible status item (status bar in JupyterLab, toolbar in Notebook 7)."""
    return page.locator(f"{ITEM}:visible")


def open_notebook(page: Page, lab: LabServer, name: str, ui: str = "lab") -> Locator:
    """Open ``name`` in JupyterLab (a reset workspace) or Notebook 7 and wait until
    its kernel is idle and the status item has the kernel's state."""
    path = f"/lab/tree/{name}?reset" if ui == "lab" else f"/notebooks/{name}"
    page.goto(lab.url(path), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    item = status_item(page)
    expect(item).to_have_count(1, timeout=APP_LOAD_TIMEOUT)
    lab.wait_kernel_idle(name, timeout=KERNEL_TIMEOUT / 1000)
    expect(item).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    return item


def cells(page: Page) -> Locator:
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")


def run_cell(page: Page, code: str, timeout: int = CELL_TIMEOUT) -> tuple[Locator, int]:
    """Type ``code`` into the last cell of the visible notebook, Shift+Enter, wait for
    the execution count. Returns the cell and its execution count."""
    all_cells = cells(page)
    index = all_cells.count() - 1
    cell = all_cells.nth(index)
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Delete")
    page.keyboard.type(code)
    expect(editor).to_have_text(code)
    page.keyboard.press("Shift+Enter")
    prompt = cell.locator(".jp-InputArea-prompt")
    expect(prompt).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=timeout)
    count = int(re.search(r"\d+", prompt.inner_text()).group())  # type: ignore[union-attr]
    # Shift+Enter on the last cell appends a fresh one to type into next.
    expect(all_cells).to_have_count(index + 2)
    return cell, count


def output_text(cell: Locator) -> str:
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def stdout_text(cell: Locator) -> str:
    return "".join(
        cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]').all_inner_texts()
    )


def interfaces_of(page: Page) -> list[str]:
    """The sandbox's network interfaces, as printed by a cell (its stdout only: the
    first cell after a ratchet raised outside a cell also gets the notice, on stderr)."""
    cell, _ = run_cell(page, IFACES_CELL)
    text = stdout_text(cell).strip()
    match = re.fullmatch(r"\[('[^']*'(?:, '[^']*')*)?\]", text)
    assert match, f"unexpected output of the interfaces cell: {text!r}"
    return re.findall(r"'([^']*)'", text)


def toast(page: Page, text: str) -> Locator:
    return page.locator(".Toastify__toast", has_text=text)


def record_labels(page: Page) -> None:
    """Remember every label the status item shows from now on (window.__skLabels)."""
    page.evaluate(
        """() => {
            window.__skLabels = [];
            const seen = () => document.querySelectorAll('.sk-status-item .sk-status-label')
                .forEach(n => window.__skLabels.push(n.textContent));
            seen();
            window.__skObserver?.disconnect();
            window.__skObserver = new MutationObserver(seen);
            window.__skObserver.observe(document.body, {subtree: true, childList: true, characterData: true});
        }"""
    )


def recorded_labels(page: Page) -> list[str]:
    return page.evaluate("() => window.__skLabels")


def make_private_from_cell(page: Page) -> Locator:
    cell, _ = run_cell(page, RATCHET_CELL)
    expect(status_item(page)).to_have_attribute("data-network", "none", timeout=KERNEL_TIMEOUT)
    return cell


# ---- the tests ----------------------------------------------------------------------


def test_cell_raises_ratchet(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("a/nb1.ipynb")
    item = open_notebook(page, lab, "a/nb1.ipynb")
    expect(item).to_be_visible()
    expect(item).to_have_class(re.compile(r"\bsk-status-statusbar-item\b"))
    expect(item).to_have_attribute("data-network", "proxied")
    expect(item).to_have_attribute("data-level", "PUBLIC")
    expect(item.locator(".sk-status-label")).to_have_text(PROXIED)
    # The sandbox really reaches the web now, through the egress proxy only
    # (so the cut below means something); the label counts the domain.
    assert interfaces_of(page) == ["lo"]
    cell, _ = run_cell(
        page,
        f"import urllib.request; print(urllib.request.urlopen('http://files.example:{lab.origin_port}/small').read())",
    )
    assert "hello from the origin" in stdout_text(cell), output_text(cell)
    expect(item.locator(".sk-status-label")).to_have_text("Network: proxied · 1 domain")
    item.click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog.locator(".sk-status-egress-entry")).to_have_count(1)
    expect(dialog.locator(".sk-status-egress-entry")).to_contain_text("files.example")
    shot(page, "nb1-egress-popup")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    shot(page, "nb1-network-proxied")

    cell = make_private_from_cell(page)
    expect(item).to_have_attribute("data-level", "CONFIDENTIAL")
    expect(item.locator(".sk-status-label")).to_have_text("Network off · CONFIDENTIAL")
    expect(item).to_contain_text("Network off")
    expect(item).to_contain_text("CONFIDENTIAL")
    note = toast(page, "Network cut")
    expect(note).to_be_visible(timeout=10_000)
    expect(note).to_contain_text("private data (CONFIDENTIAL) entered this session (nb1.ipynb)")
    # bwrap cuts the network for real: the popup may say so, and nothing else
    expect(note).to_contain_text("Its sandbox has no network from now on.")
    expect(note).not_to_contain_text("NOT")
    expect(item).to_have_attribute("data-enforces-network", "true")
    expect(note.locator(".jp-toast-message")).to_have_count(1)
    expect(page.locator(".Toastify__toast", has_text="Network cut")).to_have_count(1)  # announced once
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text([SYSTEM_NOTICE])
    shot(page, "nb1-ratchet-from-cell")

    after = interfaces_of(page)
    assert after == ["lo"], f"after the ratchet the sandbox must have only lo, got {after}"
    expect(item.locator(".sk-status-label")).to_have_text("Network off · CONFIDENTIAL")
    shot(page, "nb1-only-lo")

    # The notification's "Details" opens the popup listing the dataset.
    note.get_by_role("button", name="Details").click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    rows = dialog.locator(".sk-status-dataset")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("patients")
    expect(rows.first).to_contain_text("CONFIDENTIAL")
    expect(rows.first).to_contain_text("cell")
    expect(dialog.locator("[data-field=network]")).to_contain_text("off")
    shot(page, "nb1-details-dialog")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


def test_widget_button_raises_ratchet(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("b/nb2.ipynb")
    item = open_notebook(page, lab, "b/nb2.ipynb")
    # Another notebook, another session: public, whatever happened to nb1.
    expect(item).to_have_attribute("data-network", "proxied")
    expect(item.locator(".sk-status-label")).to_have_text(PROXIED)
    shot(page, "nb2-network-on")

    item.click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".sk-status-no-datasets")).to_be_visible()
    expect(dialog.locator("[data-field=session]")).to_contain_text("nb2")
    shot(page, "nb2-status-dialog")
    dialog.locator("button.sk-mark-private").click()
    expect(dialog).to_have_count(0)

    mark = page.locator(".sk-mark-private-dialog")
    expect(mark).to_be_visible()
    level = mark.locator("select.sk-mark-private-level")
    expect(level).to_have_value("CONFIDENTIAL")  # the preselected choice
    level.select_option("SECRET")
    mark.locator("input.sk-mark-private-reason").fill("browser test: loaded the HR export")
    shot(page, "nb2-mark-private-dialog")
    # Nothing happens before the confirmation.
    expect(item).to_have_attribute("data-network", "proxied")
    mark.locator("button.sk-mark-private-confirm").click()
    expect(mark).to_have_count(0)

    expect(item).to_have_attribute("data-network", "none", timeout=KERNEL_TIMEOUT)
    expect(item).to_have_attribute("data-level", "SECRET")
    expect(item.locator(".sk-status-label")).to_have_text("Network off · SECRET")
    note = toast(page, "private data (SECRET)")
    expect(note).to_be_visible(timeout=10_000)
    expect(note).to_contain_text("(nb2.ipynb)")
    shot(page, "nb2-ratchet-from-widget")

    after = interfaces_of(page)
    assert after == ["lo"], f"after the ratchet the sandbox must have only lo, got {after}"
    shot(page, "nb2-only-lo")

    # At SECRET there is nothing left to raise: no "Mark session private…".
    item.click()
    expect(dialog).to_be_visible()
    expect(dialog.locator("button.sk-mark-private")).to_have_count(0)
    expect(dialog.locator("[data-field=level]")).to_have_text("SECRET")
    expect(dialog.locator("[data-field=network]")).to_contain_text("off")
    shot(page, "nb2-status-dialog-secret")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


def dataset_rows(page: Page, expected: int) -> list[str]:
    """Open the item's popup, wait for ``expected`` dataset rows (the popup asks
    the kernel for its state again), read them, close it."""
    status_item(page).click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".sk-status-dataset")).to_have_count(expected, timeout=10_000)
    # The first cell of each row is the name; textContent does not depend on
    # layout (innerText of a row being re-rendered can lose its separators).
    rows = dialog.locator(".sk-status-dataset td:first-child").all_text_contents()
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    return rows


def wait_restarted(page: Page, lab: LabServer, name: str) -> None:
    """The restarted kernel is idle, the widget ready, and its comm re-opened
    with the new kernel process (the ready phase alone is kept across a
    restart, with the last state shown)."""
    lab.wait_kernel_idle(name, timeout=KERNEL_TIMEOUT / 1000)
    expect(status_item(page)).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    deadline = time.monotonic() + KERNEL_TIMEOUT / 1000
    while (count := lab.status_comms(name)) == 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert count >= 1, f"the widget did not re-open its status comm with the restarted kernel of {name}"


def test_ratchet_survives_restart_and_new_kernel(page: Page, lab: LabServer, shot: Shots) -> None:
    if lab.session_for("a/nb1.ipynb") is None:  # run alone: set nb1 up as the first test does
        lab.put_notebook("a/nb1.ipynb")
        open_notebook(page, lab, "a/nb1.ipynb")
        make_private_from_cell(page)
    item = open_notebook(page, lab, "a/nb1.ipynb")
    label = item.locator(".sk-status-label")
    expect(item).to_have_attribute("data-network", "none")
    expect(label).to_have_text("Network off · CONFIDENTIAL")
    kernel_id = lab.session_for("a/nb1.ipynb")["kernel"]["id"]  # type: ignore[index]
    _, count_before = run_cell(page, "1 + 1")
    assert count_before >= 2
    record_labels(page)

    # 1. Restart from the UI: Kernel > Restart Kernel…, confirm.
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    wait_restarted(page, lab, "a/nb1.ipynb")
    expect(label).to_have_text("Network off · CONFIDENTIAL")
    cell, count = run_cell(page, IFACES_CELL)
    assert count == 1, f"the kernel did not restart from the UI (execution count {count}, was {count_before})"
    assert stdout_text(cell).strip() == "['lo']", output_text(cell)
    # The widget re-opened its comm with the new kernel process: a dataset
    # added now shows in the popup, and a rise of the level in the label.
    run_cell(page, "import sandbox_kernel.private as p; p.add_dataset('visits', 'CONFIDENTIAL')")
    rows = dataset_rows(page, 2)
    assert sorted(r.split()[0] for r in rows) == ["patients", "visits"], rows
    run_cell(page, "p.add_dataset('salaries', 'SECRET')")
    expect(label).to_have_text("Network off · SECRET", timeout=KERNEL_TIMEOUT)
    expect(toast(page, "private data (SECRET) entered this session (nb1.ipynb)")).to_be_visible(timeout=10_000)
    shot(page, "nb1-after-ui-restart")

    # 2. Restart through the REST API (as another client would): still off.
    lab.request("POST", f"/api/kernels/{kernel_id}/restart", timeout=KERNEL_TIMEOUT / 1000)
    wait_restarted(page, lab, "a/nb1.ipynb")
    cell, count = run_cell(page, IFACES_CELL)
    assert count == 1, f"the kernel did not restart through the API (execution count {count})"
    assert stdout_text(cell).strip() == "['lo']", output_text(cell)
    expect(item).to_have_attribute("data-network", "none")
    expect(label).to_have_text("Network off · SECRET")
    assert lab.session_for("a/nb1.ipynb")["kernel"]["id"] == kernel_id  # type: ignore[index]
    labels = recorded_labels(page)
    assert not any(PROXIED.match(x) for x in labels), f"the item showed network around a restart: {labels}"
    shot(page, "nb1-after-rest-restart")

    # 3. A brand-new kernel on the same notebook (session deleted, notebook re-opened).
    session = lab.session_for("a/nb1.ipynb")
    assert session is not None
    lab.request("DELETE", f"/api/sessions/{session['id']}")
    item = open_notebook(page, lab, "a/nb1.ipynb")
    new_kernel = lab.session_for("a/nb1.ipynb")["kernel"]["id"]  # type: ignore[index]
    assert new_kernel != kernel_id
    expect(item).to_have_attribute("data-network", "none")
    expect(item.locator(".sk-status-label")).to_have_text("Network off · SECRET")
    assert interfaces_of(page) == ["lo"]
    shot(page, "nb1-new-kernel")


def test_notebook7_toolbar_item(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("c/nb3.ipynb")
    item = open_notebook(page, lab, "c/nb3.ipynb", ui="notebook7")
    # Notebook 7 has no status bar: the item sits in the notebook toolbar, before the kernel name.
    expect(item).to_have_class(re.compile(r"\bsk-status-toolbar-item\b"))
    expect(page.locator(".jp-NotebookPanel-toolbar .sk-status-item")).to_be_visible()
    expect(item.locator(".sk-status-label")).to_have_text(PROXIED)
    expect(item).to_have_attribute("data-network", "proxied")
    shot(page, "nb7-network-on")

    cell = make_private_from_cell(page)
    expect(item.locator(".sk-status-label")).to_have_text("Network off · CONFIDENTIAL")
    expect(toast(page, "private data (CONFIDENTIAL) entered this session (nb3.ipynb)")).to_be_visible(timeout=10_000)
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text([SYSTEM_NOTICE])
    shot(page, "nb7-network-off")

    # nb2 (made SECRET by the widget in the test above) in Notebook 7 too.
    if lab.session_for("b/nb2.ipynb") is not None:
        item = open_notebook(page, lab, "b/nb2.ipynb", ui="notebook7")
        expect(item.locator(".sk-status-label")).to_have_text("Network off · SECRET")
        expect(item).to_have_attribute("data-network", "none")
        shot(page, "nb7-nb2-secret")


def test_popup_says_what_made_a_widget_marked_session_private(page: Page, lab: LabServer, shot: Shots) -> None:
    """docs/comm.md: ``datasets`` is "what made it private", ``source`` one of cell,
    *widget*, tool, connector, mount. A session marked from the widget must not be
    shown as SECRET with "None has entered this session" and the reason lost."""
    name = "b/nb2.ipynb"
    if lab.session_for(name) is None:  # run alone: mark a notebook from the widget first
        name = "d/nb4.ipynb"
        lab.put_notebook(name)
        item = open_notebook(page, lab, name)
        item.click()
        page.locator(".sk-status-dialog button.sk-mark-private").click()
        mark = page.locator(".sk-mark-private-dialog")
        mark.locator("select.sk-mark-private-level").select_option("SECRET")
        mark.locator("input.sk-mark-private-reason").fill("browser test: loaded the HR export")
        mark.locator("button.sk-mark-private-confirm").click()
        expect(item).to_have_attribute("data-network", "none", timeout=KERNEL_TIMEOUT)
    item = open_notebook(page, lab, name)
    expect(item.locator(".sk-status-label")).to_have_text("Network off · SECRET")
    item.click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    shot(page, "widget-marked-session-popup")
    expect(dialog.locator(".sk-status-no-datasets")).to_have_count(0)
    body = dialog.locator(".sk-status-body")
    expect(body).to_contain_text("widget")
    expect(body).to_contain_text("loaded the HR export")


def test_widget_follows_kernel_after_rest_restart(page: Page, lab: LabServer, shot: Shots) -> None:
    """docs/comm.md: the frontend re-opens the comm after every kernel restart,
    including one made by another client (the REST API, nbclient, a second tab):
    a rise after such a restart must still reach the widget."""
    lab.put_notebook("e/nb5.ipynb")
    item = open_notebook(page, lab, "e/nb5.ipynb")
    label = item.locator(".sk-status-label")
    expect(label).to_have_text(PROXIED)
    # Let the kernel's sandbox finish starting first: a restart during that start
    # is another matter (today it leaks the sandbox's pasta helper, which the lab
    # fixture's leftover check reports).
    run_cell(page, "1 + 1")
    kernel_id = lab.session_for("e/nb5.ipynb")["kernel"]["id"]  # type: ignore[index]
    lab.request("POST", f"/api/kernels/{kernel_id}/restart", timeout=KERNEL_TIMEOUT / 1000)
    wait_restarted(page, lab, "e/nb5.ipynb")
    expect(label).to_have_text(PROXIED)
    cell = run_cell(page, RATCHET_CELL)[0]
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text([SYSTEM_NOTICE])
    assert lab.session_for("e/nb5.ipynb")["kernel"]["id"] == kernel_id  # type: ignore[index]
    try:
        expect(label).to_have_text("Network off · CONFIDENTIAL", timeout=15_000)
        expect(toast(page, "entered this session (nb5.ipynb)")).to_be_visible(timeout=10_000)
    finally:
        shot(page, "nb5-after-rest-restart-and-ratchet")


def test_item_warns_on_other_kernels(page: Page, lab: LabServer, shot: Shots) -> None:
    """On a stock ipykernel notebook the item is not hidden: it says "Not sandboxed"
    (a user must not take a host kernel for a sandboxed one) and switches the
    notebook to the sandboxed kernel in one click."""
    from lab_helpers import notebook_json

    nb = notebook_json(["1 + 1"])
    nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    lab.request("PUT", "/api/contents/f", {"type": "directory"})  # a folder of its own (rule 1)
    lab.request("PUT", "/api/contents/f/plain.ipynb", {"type": "notebook", "format": "json", "content": nb})
    page.goto(lab.url("/lab/tree/f/plain.ipynb?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(state="visible", timeout=APP_LOAD_TIMEOUT)
    lab.wait_kernel_idle("f/plain.ipynb", timeout=KERNEL_TIMEOUT / 1000)
    assert lab.session_for("f/plain.ipynb")["kernel"]["name"] == "python3"  # type: ignore[index]
    item = status_item(page)
    expect(item).to_have_count(1, timeout=KERNEL_TIMEOUT)
    expect(item).to_have_attribute("data-phase", "unsandboxed")
    expect(item.locator(".sk-status-label")).to_have_text("Not sandboxed")
    shot(page, "plain-python3-not-sandboxed")
    item.locator("button.sk-switch-kernel").click()
    expect(item).to_have_attribute("data-phase", "ready", timeout=KERNEL_TIMEOUT)
    expect(item.locator(".sk-status-label")).to_have_text(PROXIED)
    assert lab.session_for("f/plain.ipynb")["kernel"]["name"] == "sandbox-python"  # type: ignore[index]
    shot(page, "plain-switched-to-sandbox")


def test_pager_payload_script_never_runs(page: Page, lab: LabServer, shot: Shots) -> None:
    """The attack that landed: a cell calls ``IPython.core.page.page`` with HTML
    carrying a script; JupyterLab shows execute_reply pager payloads as trusted
    output in the cell, so the script ran in the user's browser (and could use
    the Jupyter server's API). The text shows; the script does not run."""
    lab.put_notebook("g/pager.ipynb")
    open_notebook(page, lab, "g/pager.ipynb")
    page.evaluate("() => { window.__pwned = 0; }")
    code = (
        "from IPython.core import page; "
        "page.page({'text/html': '<img src=x onerror=\"window.__pwned=1\"><b>PAGER-TEXT</b>', 'text/plain': 'PAGER-TEXT'})"
    )
    cell, _ = run_cell(page, code)
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text("PAGER-TEXT", timeout=KERNEL_TIMEOUT)
    page.wait_for_timeout(1000)  # an onerror fires as soon as the broken image is in the page
    assert page.evaluate("() => window.__pwned") == 0, "the pager's script ran in the browser"
    assert cell.locator("img[onerror]").count() == 0
    shot(page, "pager-payload-sanitised")


def test_egress_entry_shows_its_count(page: Page, lab: LabServer, shot: Shots) -> None:
    """The egress log writes identical refusals as one entry with a ``count``
    (network/egress_log.py); the popup must say how many there were, not show
    one refusal where a cell made twenty."""
    lab.put_notebook("h/egress.ipynb")
    item = open_notebook(page, lab, "h/egress.ipynb")
    expect(item.locator(".sk-status-label")).to_have_text(PROXIED)
    # 20 identical requests the proxy refuses (a private address), well within
    # the log's 10 s window; an opener without the error processor returns the 403s
    cell, _ = run_cell(
        page,
        "import urllib.request as u; o = u.OpenerDirector(); o.add_handler(u.ProxyHandler()); "
        "o.add_handler(u.HTTPHandler()); print([o.open('http://10.1.2.3:1/', timeout=5).status for _ in range(20)])",
    )
    assert stdout_text(cell).strip() == str([403] * 20), output_text(cell)
    item.click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".sk-status-egress-summary")).to_contain_text("0 allowed, 20 refused", timeout=10_000)
    entry = dialog.locator(".sk-status-egress-entry", has_text="10.1.2.3:1")
    expect(entry).to_have_count(1)
    expect(entry).to_have_attribute("data-count", "20")
    expect(entry.locator(".sk-status-egress-count")).to_have_text("×20")
    shot(page, "egress-counted-refusals")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


# ---- the development fallback: a backend that cuts no network ----------------------


@pytest.fixture(scope="module")
def unisolated_lab(lab: LabServer, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """A second server whose kernels run on the subprocess backend (no isolation;
    ``Sandbox.enforces_network`` is False). ``lab`` first: the page fixture's
    browser belongs to it, and this server is stopped before it."""
    config = "c.SandboxKernel.backend = 'subprocess'\n"
    with serving(tmp_path_factory.mktemp("lab-subprocess"), artifacts / "jupyter-lab-subprocess.log", config) as server:
        yield server


def test_rise_on_the_subprocess_backend_says_the_network_was_not_cut(
    page: Page, unisolated_lab: LabServer, shot: Shots
) -> None:
    """On the subprocess fallback a rise cuts nothing: the kernel refuses every
    later cell instead (its notices say the network was NOT cut). The popup,
    the item and the details must say the same, never "Network cut"."""
    lab = unisolated_lab
    lab.put_notebook("u/nb.ipynb")
    item = open_notebook(page, lab, "u/nb.ipynb")
    expect(item).to_have_attribute("data-backend", "subprocess")
    expect(item).to_have_attribute("data-enforces-network", "false")
    expect(item).to_have_attribute("data-network", "full")
    expect(item.locator(".sk-status-label")).to_have_text("Not sandboxed · Network on")
    shot(page, "subprocess-public")

    run_cell(page, RATCHET_CELL)
    expect(item).to_have_attribute("data-level", "CONFIDENTIAL", timeout=KERNEL_TIMEOUT)
    # what the kernel reports: no code of the session runs, so no network is used
    expect(item).to_have_attribute("data-network", "none")
    expect(item.locator(".sk-status-label")).to_have_text("Not sandboxed · cells refused · CONFIDENTIAL")
    note = toast(page, "Network NOT cut")
    expect(note).to_be_visible(timeout=10_000)
    expect(note).to_contain_text("Network NOT cut: this kernel is NOT sandboxed and runs no more code.")
    expect(note).to_contain_text("Private data (CONFIDENTIAL) entered this session (nb.ipynb).")
    expect(note).not_to_contain_text("…")  # the toast shows 140 characters: all of it fits
    expect(page.locator(".Toastify__toast", has_text="Network cut")).to_have_count(0)
    expect(page.locator(".Toastify__toast", has_text="no network from now on")).to_have_count(0)
    shot(page, "subprocess-rise-popup")

    # the kernel does what the popup says: the next cell is refused
    cell, _ = run_cell(page, "print('still ' + 'running')")
    assert "still running" not in stdout_text(cell), output_text(cell)
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text("refused")

    note.get_by_role("button", name="Details").click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".jp-Dialog-header")).to_have_text("Not sandboxed")
    expect(dialog.locator("[data-field=network]")).to_have_text(
        "NOT cut (this kernel is not sandboxed): it runs no more code in this session"
    )
    expect(dialog.locator("[data-field=backend]")).to_contain_text("NOT sandboxed")
    expect(dialog.locator(".sk-status-body")).not_to_contain_text("off, for good")
    shot(page, "subprocess-details")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
