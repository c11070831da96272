"""The notebook the export tests attack with (tests/test_lab_html_exports.py,
tests/test_export_cli.py, tests/browser/test_notebook_exports.py).

A notebook as a private session's cell can write it: in markdown, in outputs
and in a raw cell, each thing a page can run, load or follow, at an address
of its own (``url(name)`` for each of :data:`ATTACKS`: the browser test gives
each a loopback listener), the saved widget state (which makes nbconvert's
page load the widget manager from a CDN), and a string that closes its
attribute in every metadata field the template writes. Outputs that nbconvert
shows before HTML (a widget view, JavaScript) are outputs of their own, so
the control page shows the HTML.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbformat import v4

#: where nothing listens (the discard port): the address of every attack by default
UNREACHABLE = "http://127.0.0.1:9"
#: a string field that closes its attribute and adds a refresh, where a template writes it unescaped
BREAK_OUT = f'"><meta http-equiv="refresh" content="0;url={UNREACHABLE}/attr"><b x="'
#: the attacks, by the name in their address
ATTACKS = (
    "markdown_image",
    "markdown_onerror",
    "markdown_script",
    "html_script",
    "html_image",
    "html_css",
    "html_frame",
    "html_preconnect",
    "html_base",
    "html_refresh",
    "javascript_output",
    "markdown_output_image",
    "raw_script",
)


def attack_notebook(url: Callable[[str], str] = lambda name: f"{UNREACHABLE}/{name}") -> Any:
    """The attack notebook (a NotebookNode), each attack at ``url(name)``."""
    nb = v4.new_notebook()
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3", "nbconvert_exporter": "python"}
    nb.metadata["title"] = BREAK_OUT
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2, "version_minor": 0}
    }
    markdown = v4.new_markdown_cell(
        "# Quarterly results\n\n"
        f"![chart]({url('markdown_image')}) "
        f'<img src="missing.png" onerror="fetch(\'{url("markdown_onerror")}\')">\n\n'
        f"<script>window.pageScriptRan = true; fetch('{url('markdown_script')}')</script>\n\n"
        "| region | total |\n|---|---|\n| north | 12 |\n\n$x^2$"
    )
    markdown.metadata["tags"] = [BREAK_OUT]
    code = v4.new_code_cell("report()", execution_count=1)
    code.metadata["tags"] = [BREAK_OUT]
    code.outputs = [
        v4.new_output(
            "display_data",
            data={
                "text/html": (
                    "<table><thead><tr><th>total</th></tr></thead><tbody><tr><td>12</td></tr></tbody></table>"
                    f"<script>window.pageScriptRan = true; fetch('{url('html_script')}')</script>"
                    f"<img src='{url('html_image')}'>"
                    f"<div style=\"background-image: url('{url('html_css')}')\">styled</div>"
                    f"<iframe src='{url('html_frame')}'></iframe>"
                    f"<link rel='preconnect' href='{url('html_preconnect')}'><base href='{url('html_base')}/'>"
                    f"<meta http-equiv='refresh' content='2;url={url('html_refresh')}'>"
                ),
                "text/plain": "report",
            },
        ),
        v4.new_output(
            "display_data",
            data={"application/javascript": f"fetch('{url('javascript_output')}')", "text/plain": "js"},
        ),
        v4.new_output(
            "display_data",
            data={
                "application/vnd.jupyter.widget-view+json": {"model_id": "m", "version_major": 2, "version_minor": 0},
                "text/plain": "the widget",
            },
        ),
        v4.new_output(
            "execute_result", data={"text/markdown": f"![o]({url('markdown_output_image')})"}, execution_count=1
        ),
        v4.new_output("stream", name="stdout", text=BREAK_OUT),
        v4.new_output("error", ename="Error", evalue=BREAK_OUT, traceback=[BREAK_OUT]),
    ]
    raw = v4.new_raw_cell(f"<script>fetch('{url('raw_script')}')</script><p>raw</p>")
    raw.metadata["raw_mimetype"] = "text/html"
    nb.cells = [markdown, code, raw]
    return nb


#: what a planted template writes into the export, so a test sees it was used
PLANTED_TEXT = "PLANTED-TEMPLATE-RAN"


def plant_templates(folder: Path, marker: Path, conf: bool = True) -> list[Path]:
    """What a cell writes into its workspace to have the host run its code at
    export: a folder named after every template nbconvert has installed
    (``lab``, ``reveal``, ``python``, ``script``, ``base``...), each file of
    the installed one replaced by Jinja that runs a shell command appending to
    ``marker`` (templates are Jinja run unsandboxed), and a ``conf.json``
    naming a preprocessor in ``this`` (unless not ``conf``: nbconvert imports
    it, the Zen of Python is printed, and fails). nbconvert searched the
    working directory first. Returns the folders made."""
    from jupyter_core.paths import jupyter_path

    payload = (
        "{%- set _ = cycler.__init__.__globals__.os.system('echo template-ran >> "
        + shlex.quote(str(marker))
        + "') -%}"
        + PLANTED_TEXT
        + "\n"
    )
    made: list[Path] = []
    for root in map(Path, jupyter_path("nbconvert", "templates")):
        if not root.is_dir():
            continue
        for installed in sorted(root.iterdir()):
            planted = folder / installed.name
            if not installed.is_dir() or planted in made:
                continue
            planted.mkdir(exist_ok=True)
            made.append(planted)
            for file in installed.iterdir():
                if file.suffix in (".j2", ".tpl"):
                    (planted / file.name).write_text(payload)
            if conf:
                (planted / "conf.json").write_text(json.dumps({"preprocessors": {"00": {"type": "this.planted"}}}))
    return made
