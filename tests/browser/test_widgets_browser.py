"""ipywidgets in a real JupyterLab and Notebook 7, with the sandboxed kernel.

A slider is moved in the page and the sandbox sees the value; an ``interact``
output follows the slider; a tqdm progress bar renders as a widget; a progress
bar that a thread moves after its cell ended moves in the page; a widget
with a script in its HTML and one naming a module from a CDN are neutralised.
Screenshots: test-artifacts/browser/NN-widgets-*.png.
"""

from __future__ import annotations

import re

import pytest
from lab_helpers import LabServer, Shots
from playwright.sync_api import Page, expect
from test_status_widget import CELL_TIMEOUT, open_notebook, output_text, run_cell, stdout_text

pytestmark = pytest.mark.timeout(240)

pytest.importorskip("ipywidgets")


def set_slider(page: Page, cell_index: int, value: int) -> None:
    """Type a value into the slider's readout, as a user does for an exact value."""
    readout = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(cell_index).locator(".widget-readout").first
    readout.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def test_slider_moved_in_the_page_reaches_the_sandbox(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("w/slider.ipynb")
    open_notebook(page, lab, "w/slider.ipynb")
    cell, _ = run_cell(
        page,
        "import ipywidgets as w; s = w.IntSlider(value=3, max=50, description='n'); seen = []; "
        "s.observe(lambda ch: seen.append(ch['new']), 'value'); s",
    )
    slider = cell.locator(".widget-slider")
    expect(slider).to_be_visible(timeout=CELL_TIMEOUT)
    expect(cell.locator(".widget-readout")).to_have_text("3")
    set_slider(page, 0, 17)
    expect(cell.locator(".widget-readout")).to_have_text("17")
    shot(page, "widgets-slider")
    check, _ = run_cell(page, "print(s.value, seen)")
    assert stdout_text(check).strip() == "17 [17]"
    # and the other way: the sandbox moves the slider in the page
    run_cell(page, "s.value = 42")
    expect(cell.locator(".widget-readout")).to_have_text("42", timeout=CELL_TIMEOUT)


def test_interact_output_follows_the_slider(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("w/interact.ipynb")
    open_notebook(page, lab, "w/interact.ipynb")
    cell, _ = run_cell(page, "from ipywidgets import interact; _ = interact(lambda x: print('twice', 2 * x), x=5)")
    out = cell.locator(".widget-output")
    expect(out).to_contain_text("twice 10", timeout=CELL_TIMEOUT)
    set_slider(page, 0, 12)
    expect(out).to_contain_text("twice 24", timeout=CELL_TIMEOUT)
    expect(out).not_to_contain_text("twice 10")
    shot(page, "widgets-interact")


def test_progress_bar_renders_as_a_widget(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("w/tqdm.ipynb")
    open_notebook(page, lab, "w/tqdm.ipynb")
    cell, _ = run_cell(page, "from tqdm.auto import tqdm; _ = [i for i in tqdm(range(40), desc='work')]")
    bar = cell.locator(".widget-hprogress .progress-bar")
    expect(bar).to_be_visible(timeout=CELL_TIMEOUT)
    expect(cell.locator(".widget-html-content").first).to_contain_text("work")
    expect(cell.locator(".widget-html-content").last).to_contain_text("40/40")
    shot(page, "widgets-tqdm")


def test_progress_bar_a_thread_moves_after_its_cell_ended(page: Page, lab: LabServer, shot: Shots) -> None:
    """ipywidgets' own example ("Updating a widget in the background"): the
    bar used to stay at 0 until another cell ran."""
    lab.put_notebook("w/background.ipynb")
    open_notebook(page, lab, "w/background.ipynb")
    cell, _ = run_cell(
        page,
        "import threading, time, ipywidgets as w; from IPython.display import display; "
        "progress = w.FloatProgress(value=0.0, min=0.0, max=1.0); display(progress); "
        "threading.Thread(target=lambda: [(time.sleep(0.3), setattr(progress, 'value', (i + 1) / 10)) "
        "for i in range(10)]).start()",
    )
    expect(cell.locator(".widget-hprogress")).to_be_visible(timeout=CELL_TIMEOUT)
    bar = cell.locator(".widget-hprogress .progress-bar")
    expect(bar).to_have_attribute("style", re.compile(r"width:\s*100%"), timeout=CELL_TIMEOUT)
    shot(page, "widgets-background-progress")


def test_malicious_widgets_are_neutralised(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("w/evil.ipynb")
    open_notebook(page, lab, "w/evil.ipynb")
    cell, _ = run_cell(
        page,
        "import ipywidgets as w; "
        'w.HTML(value=\'<b id="sk-bold">bold</b><img src=x onerror="window.__skPwned=1">'
        "<script>window.__skPwned=2</script>')",
    )
    expect(cell.locator("#sk-bold")).to_have_text("bold", timeout=CELL_TIMEOUT)
    cell2, _ = run_cell(
        page,
        "import traitlets as t; Evil = type('Evil', (w.DOMWidget,), {"
        "'_view_module': t.Unicode('https://cdn.jsdelivr.net/npm/evil@1/dist/index.js').tag(sync=True), "
        "'_view_name': t.Unicode('EvilView').tag(sync=True)}); Evil()",
    )
    expect(cell2.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')).to_contain_text(
        "is not installed in this Jupyter server"
    )
    shot(page, "widgets-evil")
    page.wait_for_timeout(500)  # give an onerror handler its chance to run
    assert page.evaluate("() => window.__skPwned") is None
    assert cell.locator(".jp-OutputArea [onerror], .jp-OutputArea script").count() == 0
    assert "onerror" not in cell.locator(".jp-OutputArea").inner_html()
    assert re.search(r"Evil\(", output_text(cell2))  # the text fallback is what remains
    # buffer paths are walked by the frontend with o = o[key]: through
    # __proto__ a Label's buffer became Object.prototype.trusted, and every
    # markdown Lab rendered after it was trusted (an attack review)
    cell3, _ = run_cell(
        page,
        "lbl = w.Label('x'); [lbl.comm.send({'method': 'update', 'state': {}, 'buffer_paths': [p]}, buffers=[b'x']) "
        "for p in (['__proto__', 'skPolluted'], ['constructor', 'assign'], ['value', 'constructor', 'prototype', 'trim'])]; "
        "print('sent')",
    )
    expect(cell3.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')).to_contain_text(
        "does not lead to a place the state left for a buffer"
    )
    assert "sent" in stdout_text(cell3)
    assert page.evaluate("() => [({}).skPolluted, typeof Object.assign, typeof ''.trim]") == [
        None,
        "function",
        "function",
    ]


PROTO_CELL = (
    "import comm, ipywidgets as w; from IPython.display import display; "
    "P = {'_view_name': 'HTMLView', '_view_module': '@jupyter-widgets/controls', '_view_module_version': '2.0.0', "
    "'description': '', 'description_allow_html': False, 'placeholder': '', 'tooltip': None, '_dom_classes': [], "
    "'tabbable': None, 'layout': None, 'style': None, "
    "'value': '<b id=\"sk-proto\">p</b><img src=x onerror=\"window.__skPwned=3\">'}; "
    "c = comm.create_comm(target_name='jupyter.widget', data={'state': {'_model_name': 'LayoutModel', "
    "'_model_module': '@jupyter-widgets/base', '_model_module_version': '2.0.0', '__proto__': P}, "
    "'buffer_paths': []}, metadata={'version': '2.1.0'}); "
    "display({'application/vnd.jupyter.widget-view+json': {'model_id': c.comm_id, 'version_major': 2, "
    "'version_minor': 0}, 'text/plain': 'proto widget'}, raw=True)"
)
JSLINK_CELL = (
    't = w.Text(value=\'<b id="sk-linked">l</b><img src=x onerror="window.__skPwned=4">\'); '
    "h = w.HTML(value='still empty'); lk = w.jslink((t, 'value'), (h, 'value')); display(h)"
)


def test_prototype_state_and_jslink_render_no_markup(page: Page, lab: LabServer, shot: Shots) -> None:
    """Two vectors of an attack review that ran script in a plain Lab: a
    Layout model whose JSON state holds ``"__proto__"`` (ipywidgets makes it the
    state's prototype, and the model inherits ``_view_name: "HTMLView"`` and a
    ``value`` with markup), and ``jslink`` from a Text's value into an HTML's
    (the page copies the uncleaned text into ``innerHTML``). Under the page
    policy the handler would be blocked, so the markup itself must not reach
    the page; a jslink between two sliders still works."""
    lab.put_notebook("w/proto.ipynb")
    open_notebook(page, lab, "w/proto.ipynb")
    stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
    cell, _ = run_cell(page, PROTO_CELL)
    cell2, _ = run_cell(page, JSLINK_CELL)
    expect(cell2.locator(".widget-html").first).to_be_visible(timeout=CELL_TIMEOUT)
    cell3, _ = run_cell(
        page,
        "a = w.IntSlider(value=7, max=50); b = w.IntSlider(value=2, max=50); "
        "lk2 = w.jslink((a, 'value'), (b, 'value')); display(w.VBox([a, b]))",
    )
    expect(cell3.locator(".widget-readout")).to_have_text(["7", "7"], timeout=CELL_TIMEOUT)
    set_slider(page, 2, 20)
    expect(cell3.locator(".widget-readout")).to_have_text(["20", "20"], timeout=CELL_TIMEOUT)
    check, _ = run_cell(page, "print(a.value)")
    assert stdout_text(check).strip() == "20"
    shot(page, "widgets-proto-jslink")
    page.wait_for_timeout(500)  # give an onerror handler its chance to run
    assert page.evaluate("() => window.__skPwned") is None
    outputs = page.locator(".jp-NotebookPanel:visible .jp-OutputArea")
    assert page.locator("#sk-proto, #sk-linked").count() == 0
    assert outputs.locator("[onerror], script").count() == 0
    assert all("onerror" not in html for html in outputs.evaluate_all("els => els.map(e => e.innerHTML)"))
    expect(cell.locator(stderr)).to_contain_text("may not hold a key '__proto__'")
    expect(cell2.locator(stderr)).to_contain_text("widget link cannot join")
    expect(cell2.locator(".widget-html-content")).to_have_text("still empty")


def test_notebook7_slider(page: Page, lab: LabServer, shot: Shots) -> None:
    lab.put_notebook("w/nb7.ipynb")
    open_notebook(page, lab, "w/nb7.ipynb", ui="notebook")
    cell, _ = run_cell(page, "import ipywidgets as w; s = w.IntSlider(value=1, max=9); s")
    expect(cell.locator(".widget-slider")).to_be_visible(timeout=CELL_TIMEOUT)
    set_slider(page, 0, 8)
    expect(cell.locator(".widget-readout")).to_have_text("8")
    check, _ = run_cell(page, "print(s.value)")
    assert stdout_text(check).strip() == "8"
    shot(page, "widgets-notebook7")
