"""A cell's style sheet cannot rewrite the sandbox status item.

An attack review: JupyterLab inserts a trusted output's HTML into its page,
where a ``<style>`` applies to the whole page. A public cell with network
shrank the status label to nothing and put "Network off, CONFIDENTIAL" in
its place with ``::after``, and hid the popup's "Mark session private…"
button: the user's authority on the session's network said the opposite of
the truth. The kernel now limits every kept style sheet to its own output
(``@scope (.sk-output)``, ``sandbox_kernel/outputs/_scoped_css.py``); the same
sheet still styles the output itself.
"""

from __future__ import annotations

import json

from lab_helpers import LabServer
from playwright.sync_api import Page, expect
from test_status_widget import PROXIED, open_notebook, run_cell, status_item

SPOOF = (
    ".sk-status-label{font-size:0!important}"
    ".sk-status-item::after{content:'Network off, CONFIDENTIAL';font-size:13px}"
    "button.sk-mark-private{display:none!important}"
    ".sk-probe{color:rgb(1, 2, 3)}"
)
#: one line (the editor is typed into)
CELL = f"from IPython.display import HTML, Markdown, display; style = {json.dumps(SPOOF)}; " + (
    "display(HTML(f'<style>{style}</style><p class=\"sk-probe\">Loaded 3 rows.</p>')); "
    "display(Markdown(f'<style>{style}</style>\\n\\n<p class=\"sk-probe\">Loaded 3 rows.</p>')); "
    # inside a line (the renderer rewrites its text), with both of its changes
    "display(Markdown('Loaded 3 rows. <style>.a\\\\\"\\\\}\\\\\" .b{} ' + style + '</style>'))"
)


def test_an_outputs_style_sheet_leaves_the_status_item_alone(page: Page, lab: LabServer) -> None:
    lab.put_notebook("styles/spoof.ipynb")
    item = open_notebook(page, lab, "styles/spoof.ipynb")
    label = item.locator(".sk-status-label")
    expect(label).to_have_text(PROXIED)
    cell, _ = run_cell(page, CELL)
    probes = cell.locator(".sk-probe")
    expect(probes).to_have_count(2)
    # the sheets still style their own outputs
    for index in range(2):
        assert probes.nth(index).evaluate("e => getComputedStyle(e).color") == "rgb(1, 2, 3)"
    assert label.evaluate("e => getComputedStyle(e).fontSize") != "0px"
    after = status_item(page).evaluate("e => getComputedStyle(e, '::after').content")
    assert after in ("none", "normal", ""), f"an output's style wrote into the status item: {after}"
    expect(label).to_have_text(PROXIED)
    item.click()
    dialog = page.locator(".sk-status-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("button.sk-mark-private")).to_be_visible()


#: outputs that draw outside themselves: a fixed banner over the notebook, a
#: paragraph moved up over the cells above, a transform, a Lab class placed
#: absolutely (one line: the editor is typed into)
ESCAPES = (
    "from IPython.display import HTML, Markdown, display; "
    'display(HTML(\'<div class="sk-x" style="position:fixed;left:0;bottom:0;width:100vw;height:80px;'
    "z-index:2147483647;background:#fff\">Network: off, session private</div>')); "
    'display(HTML(\'<p class="sk-x" style="margin-top:-400px;height:300px;background:#fee">moved up</p>\')); '
    'display(Markdown(\'<p class="sk-x" style="transform:translate(-300px,-300px);height:200px">moved</p>\')); '
    'display(HTML(\'<div class="sk-x lm-Menu" style="top:0;left:0;width:100vw;height:100vh">menu</div>\')); '
    # (reviews of the wrapper) a sheet taking its box away, for this output and
    # every other; markdown closing a div wrapper early
    'display(HTML(\'<style>:scope{display:contents}</style><div class="sk-x" style="position:fixed;left:0;'
    "top:0;width:100vw;height:80px;background:#fee\">Network: off</div>')); "
    'display(Markdown(\'</div><div class="sk-x" style="position:fixed;left:0;top:200px;width:100vw;'
    "height:80px;background:#efe\">Network: off</div>')); "
    # a sheet moving the scope root itself (a review of the second version)
    "display(HTML('<style>:scope{position:fixed!important;top:0;left:0;width:100vw;height:100vh;"
    'z-index:2147483647}</style><div class="sk-x" style="background:#eef">Network: off</div>\'))'
)

#: points of the page where what is drawn belongs to a marked element of an
#: output, outside the output's own area
STRAYS = """() => {
  const strays = [];
  for (let x = 3; x < innerWidth; x += 25) {
    for (let y = 3; y < innerHeight; y += 25) {
      const hit = document.elementFromPoint(x, y);
      const marked = hit && hit.closest('.sk-x');
      if (!marked) continue;
      const area = marked.closest('.jp-OutputArea-output').getBoundingClientRect();
      if (x < area.left || x > area.right || y < area.top || y > area.bottom) strays.push([x, y]);
    }
  }
  return strays;
}"""


def test_an_output_draws_nothing_outside_its_own_area(page: Page, lab: LabServer) -> None:
    """An attack review: an output's ``position:fixed`` banner reading
    "Network: off · session private" drew over the notebook, and caught clicks
    meant for other cells (Lab shows a kernel's outputs as trusted, without
    its own sanitiser). Each output's element now contains its paint."""
    lab.put_notebook("styles/escape.ipynb")
    open_notebook(page, lab, "styles/escape.ipynb")
    first, _ = run_cell(page, "print('the cell above')")
    cell, _ = run_cell(page, ESCAPES)
    expect(cell.locator(".sk-x")).to_have_count(7)
    strays = page.evaluate(STRAYS)
    assert strays == [], f"an output drew outside its area at {len(strays)} points, e.g. {strays[:5]}"
    # the kernel's own wrapper alone (a Lab without the extension's rule)
    page.add_style_tag(content=".jp-OutputArea-output { contain: none !important; }")
    strays = page.evaluate(STRAYS)
    assert strays == [], f"without the extension an output drew outside its area at {len(strays)} points"
    # the cell above can still be clicked, and what it shows is its own
    box = first.locator(".jp-OutputArea-output").bounding_box()
    assert box is not None
    hit = page.evaluate(
        "([x, y]) => !!document.elementFromPoint(x, y).closest('.sk-x')", [box["x"] + 5, box["y"] + box["height"] / 2]
    )
    assert not hit, "the output above is covered by the next cell's output"


#: a widget's HTML value with a fixed banner (the widget manager renders it:
#: no output HTML the kernel could contain; the Lab extension contains it). MathJax's own filter drops ``\\style``'s position
#: and ``\\class`` in Lab: a text/latex output stays in place (seen here).
WIDGET = (
    "import ipywidgets as w; from IPython.display import Latex, display; "
    'display(w.HTML(\'<div class="sk-x" style="position:fixed;left:0;bottom:0;width:100vw;height:80px;'
    "z-index:99999;background:#fff\">Network: off, session private</div>')); "
    "display(Latex(r'$\\class{sk-x}{\\style{position:fixed;left:0;top:0;font-size:80px}{\\text{Network off}}}$'))"
)


def test_a_widget_draws_nothing_outside_its_own_area(page: Page, lab: LabServer) -> None:
    lab.put_notebook("styles/escape-widget.ipynb")
    open_notebook(page, lab, "styles/escape-widget.ipynb")
    run_cell(page, "print('the cell above')")
    cell, _ = run_cell(page, WIDGET)
    expect(cell.locator(".sk-x")).to_have_count(1, timeout=30_000)
    expect(cell.locator("mjx-container")).to_have_count(1, timeout=30_000)
    math = cell.locator("mjx-container").evaluate("e => e.innerHTML")
    assert "fixed" not in math and "sk-x" not in math, math
    strays = page.evaluate(STRAYS)
    assert strays == [], f"an output drew outside its area at {len(strays)} points, e.g. {strays[:5]}"
    page.add_style_tag(content=".jp-OutputArea-output { contain: none !important; }")  # (the control)
    assert page.evaluate(STRAYS), "without the extension's containment the widget stays in place: no control"
