"""Vega charts in files a sandbox wrote run none of their code, in JupyterLab and Notebook 7.

The kernel drops Vega output of sandboxed cells, but a cell can write a
notebook with Vega outputs, or a ``.vl.json`` file, into the workspace, and
JupyterLab draws both with vega-embed, trusted or not. The sandbox then
writes the spec and vega-embed's options (the output's ``embed_options``, the
spec's ``usermeta.embedOptions``). Without the extension's ``vegaCharts``
plugin, "View Source" in the chart's menu wrote the spec and the
``sourceHeader``/``sourceFooter`` options unescaped into a new window of the
Lab's origin, whose scripts ran with the user's session (the server's API:
a terminal on the host); "Open in Vega Editor" posted the spec to the
``editorUrl`` the options named; a string ``defaultStyle`` was CSS in the
Lab's page; and the spec's expressions were compiled to JavaScript.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lab_helpers import LabServer, code_cell, notebook_json
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.timeout(300)

APP_LOAD_TIMEOUT = 60_000
FLAG = "__skVegaRan"
VEGA_LITE = "application/vnd.vegalite.v5+json"
#: the spec's expression: 2 * 7 + 12345 is drawn as 12359
EXPRESSION = "datum.a * 7 + 12345"
STYLE_MARKER = "#sk-vega-style-from-options"

#: every Function built in the page, its body kept (vega compiles expressions with it)
RECORD_FUNCTIONS = """
(() => {
  const bodies = [];
  const record = args => bodies.push(String(args.length ? args[args.length - 1] : ''));
  window.Function = new Proxy(window.Function, {
    apply(target, self, args) { record(args); return Reflect.apply(target, self, args); },
    construct(target, args, newTarget) { record(args); return Reflect.construct(target, args, newTarget); }
  });
  window.__skFunctionBodies = bodies;
})();
"""


def _script(where: str) -> str:
    return f"<script>window.opener.{FLAG} = (window.opener.{FLAG} || []).concat(['{where}'])</script>"


def _options() -> dict[str, Any]:
    return {
        "sourceHeader": _script("header"),
        "sourceFooter": _script("footer"),
        "editorUrl": "http://127.0.0.1:9/editor",
        "defaultStyle": STYLE_MARKER + " { color: red }",
        "actions": {"source": True, "compiled": True, "editor": True},
        "ast": False,
        "renderer": "svg",  # kept: the marks are then text in the page
    }


def _spec() -> dict[str, Any]:
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "sales </code></pre>" + _script("title"),
        "data": {"values": [{"a": 2}]},
        "transform": [{"calculate": EXPRESSION, "as": "b"}],
        "mark": "text",
        "encoding": {"text": {"field": "b", "type": "quantitative"}},
        # vega-embed merges these over the caller's (a string defaultStyle here it drops itself)
        "usermeta": {
            "embedOptions": {
                **{key: value for key, value in _options().items() if key != "defaultStyle"},
                "sourceFooter": _script("usermeta"),
            }
        },
    }


def _vega_spec() -> dict[str, Any]:
    """The same chart in Vega (a .vg.json file): no compiled spec to show."""
    return {
        "$schema": "https://vega.github.io/schema/vega/v5.json",
        "title": "sales </code></pre>" + _script("vega title"),
        "width": 120,
        "height": 40,
        "data": [
            {"name": "t", "values": [{"a": 2}], "transform": [{"type": "formula", "as": "b", "expr": EXPRESSION}]}
        ],
        "marks": [
            {
                "type": "text",
                "from": {"data": "t"},
                "encode": {"enter": {"text": {"field": "b"}, "x": {"value": 10}, "y": {"value": 20}}},
            }
        ],
        "usermeta": _spec()["usermeta"],
    }


def _notebook() -> dict[str, Any]:
    notebook = notebook_json()
    notebook["cells"] = [
        code_cell(
            "chart",
            "chart",
            [
                {
                    "output_type": "display_data",
                    "metadata": {VEGA_LITE: {"embed_options": _options()}},
                    "data": {VEGA_LITE: _spec(), "text/plain": "<VegaLite 5 object>"},
                }
            ],
            execution_count=1,
        ),
        code_cell(
            "by-url",
            "chart_by_url",
            [
                {
                    # vega-embed loads a spec named by URL, and the options in it, itself
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {VEGA_LITE: "chart.vl.json", "text/plain": "<VegaLite 5 object>"},
                }
            ],
            execution_count=2,
        ),
    ]
    return notebook


def _check_chart(page: Page, where: str, lite: bool = True) -> None:
    """The chart drawn, by vega's interpreter; its menu without the editor;
    its source shown as text; nothing of what the sandbox wrote ran."""
    chart = page.locator(".vega-embed").first
    expect(chart.locator("svg text", has_text="12359").first).to_be_attached(timeout=APP_LOAD_TIMEOUT)
    bodies = page.evaluate("() => window.__skFunctionBodies")
    compiled = [body for body in bodies if "12345" in body]
    assert not compiled, f"{where}: the spec's expression was compiled to JavaScript: {compiled[:2]}"
    style = page.evaluate("() => document.getElementById('vega-embed-style')?.innerHTML ?? ''")
    assert STYLE_MARKER not in style, f"{where}: the options' CSS went into the page"

    chart.locator("summary").click()
    links = chart.locator(".vega-actions a")
    expect(links.first).to_be_visible()
    texts = links.all_inner_texts()
    assert "Open in Vega Editor" not in texts, texts
    assert texts.count("View Source") == 1 and texts.count("View Compiled Vega") == int(lite), texts
    shown_items = [("View Source", "sales </code></pre><script>")]
    if lite:
        shown_items.append(("View Compiled Vega", '"text": "sales'))
    for text, shows in shown_items:
        with page.expect_popup() as opened:
            links.filter(has_text=text).click()
        popup = opened.value
        shown = popup.locator("pre").inner_text()
        assert shows in shown, f"{where}: {text} showed {shown[:300]!r}"
        assert popup.locator("script").count() == 0, f"{where}: {text} put the spec's HTML into the page"
        popup.close()
    assert page.evaluate(f"() => window.{FLAG}") is None, f"{where}: what the sandbox wrote ran in the Lab's origin"


def test_vega_charts_a_sandbox_wrote_run_nothing_and_show_their_source_as_text(page: Page, lab: LabServer) -> None:
    folder = lab.notebooks / "vega"
    folder.mkdir()
    written = json.dumps(_notebook())
    (folder / "report.ipynb").write_text(written)
    (folder / "chart.vl.json").write_text(json.dumps(_spec()))
    (folder / "chart.vg.json").write_text(json.dumps(_vega_spec()))
    page.add_init_script(RECORD_FUNCTIONS)

    page.goto(lab.url("/lab/tree/vega/report.ipynb?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    _check_chart(page, "a notebook's output in JupyterLab")
    by_url = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")
    expect(by_url).to_contain_text("names its spec by URL, and is not drawn")
    assert by_url.locator(".vega-embed").count() == 0

    page.goto(lab.url("/lab/tree/vega/chart.vl.json?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    _check_chart(page, "a .vl.json file in JupyterLab")

    page.goto(lab.url("/lab/tree/vega/chart.vg.json?reset"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    _check_chart(page, "a .vg.json file in JupyterLab", lite=False)

    page.goto(lab.url("/notebooks/vega/report.ipynb"), wait_until="domcontentloaded", timeout=APP_LOAD_TIMEOUT)
    _check_chart(page, "a notebook's output in Notebook 7")

    assert json.loads((folder / "report.ipynb").read_text())["cells"][0]["outputs"][0]["data"][VEGA_LITE] == _spec()
