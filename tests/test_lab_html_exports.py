"""What sandbox_kernel.lab_html_exports makes of a notebook a sandbox wrote.

The browser test, which opens the downloaded export from disk in Chromium
next to jupyter_server's own export of the same notebook, is in
tests/browser/test_notebook_exports.py. Here: the page itself, parsed.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from typing import Any

import nbformat
import pytest
from export_attack import UNREACHABLE, attack_notebook
from nbconvert.exporters import HTMLExporter, MarkdownExporter, ScriptExporter, SlidesExporter
from nbconvert.exporters.webpdf import WebPDFExporter
from traitlets.config import Config

from sandbox_kernel.lab_html_exports import confined_class, export_policy, shown_as_in_lab, with_policy


class _Page(HTMLParser):
    """Elements as a browser's tokenizer sees them: (tag, attributes), and each script's text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[tuple[dict[str, str], str]] = []
        self._script: dict[str, str] | None = None
        self._text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.elements.append((tag, values))
        if tag == "script":
            self._script, self._text = values, []

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None


def _export(exporter_class: type, nb: Any, **config: Any) -> str:
    page, _ = confined_class(exporter_class)(config=Config(config)).from_notebook_node(copy.deepcopy(nb))
    return str(page)


def _policy(page: _Page) -> dict[str, list[str]]:
    metas = [
        a for tag, a in page.elements if tag == "meta" and a.get("http-equiv", "").lower() == "content-security-policy"
    ]
    assert len(metas) == 1, metas
    return {d.split()[0]: d.split()[1:] for d in metas[0]["content"].split(";") if d.strip()}


@pytest.mark.parametrize("exporter_class", [HTMLExporter, SlidesExporter])
def test_the_policy_comes_before_anything_of_the_notebooks(exporter_class: type) -> None:
    text = _export(exporter_class, attack_notebook())
    page = _Page(text)
    # the charset (first kilobyte), then the policy: no element of the notebook's before it
    assert [tag for tag, _ in page.elements[:3]] == ["html", "head", "meta"]
    assert page.elements[2][1] == {"charset": "utf-8"}
    assert page.elements[3][1].get("http-equiv") == "Content-Security-Policy"
    policy = _policy(page)
    assert policy["default-src"] == ["'none'"]
    assert policy["img-src"] == ["data:"] and policy["media-src"] == ["data:"]
    assert policy["base-uri"] == ["'none'"] and policy["form-action"] == ["'none'"]
    assert "'unsafe-inline'" not in policy["script-src"]
    assert all(not s.startswith("http") or s.endswith("/") for s in policy["script-src"])


@pytest.mark.parametrize("exporter_class", [HTMLExporter, SlidesExporter])
def test_no_script_of_the_notebooks_is_allowed_and_every_one_of_the_templates_is(exporter_class: type) -> None:
    page = _Page(_export(exporter_class, attack_notebook()))
    allowed = set(_policy(page)["script-src"])
    runs = [(a, text) for a, text in page.scripts if a.get("type", "").lower() in {"", "text/javascript", "module"}]
    # (the text of a script with src never runs)
    hashes = {text: export_hash(text) for a, text in runs if text and not a.get("src")}
    notebook_scripts = [text for text in hashes if "127.0.0.1:9" in text]
    assert not notebook_scripts, "the notebook's scripts reached the page"
    # every inline script that is on the page is the template's, and allowed
    assert all(h in allowed for h in hashes.values()), [t[:80] for t, h in hashes.items() if h not in allowed]
    # and every script address is in an allowed folder
    for attributes, _ in runs:
        if attributes.get("src"):
            assert any(attributes["src"].startswith(s) for s in allowed if s.startswith("http")), attributes["src"]


def export_hash(text: str) -> str:
    import base64
    import hashlib

    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("exporter_class", [HTMLExporter, SlidesExporter])
def test_what_the_page_loads_of_the_notebook_is_gone_or_under_the_policy(exporter_class: type) -> None:
    page = _Page(_export(exporter_class, attack_notebook()))
    policy = _policy(page)
    kinds = {tag for tag, _ in page.elements}
    assert "iframe" not in kinds and "base" not in kinds
    refreshes = [a for tag, a in page.elements if tag == "meta" and a.get("http-equiv", "").lower() == "refresh"]
    assert not refreshes
    hints = [a for tag, a in page.elements if tag == "link" and "stylesheet" not in a.get("rel", "")]
    assert not hints
    handlers = [(tag, a) for tag, a in page.elements if any(name.startswith("on") for name in a)]
    assert not handlers
    # what stays (a markdown image's address) is one the policy refuses to load
    images = [a.get("src", "") for tag, a in page.elements if tag == "img"]
    assert f"{UNREACHABLE}/markdown_image" in images and "data:" in policy["img-src"]
    assert not any(src.startswith(("http:", "https:")) and "data:" not in src for src in policy["img-src"])
    # no widget manager from a CDN, no widget state
    assert "html-manager" not in str(page.elements) and "widget-state" not in str(page.scripts)


def test_the_notebook_still_reads_as_in_lab() -> None:
    text = _export(HTMLExporter, attack_notebook())
    page = _Page(text)
    tags = [tag for tag, _ in page.elements]
    # the heading, both tables with their header cells, the styled block, the math source
    assert "h1" in tags and tags.count("table") == 2 and "th" in tags
    assert "styled" in text and "$x^2$" in text
    # the error's text, as text
    assert "url=http://127.0.0.1:9/attr" in text


def test_template_scripts_by_folder_and_hash_only() -> None:
    page = (
        '<html><head><meta charset="utf-8"><script src="https://cdn.example/lib/1.0/lib.js?x=1"></script>'
        '<script type="text/x-mathjax-config">MathJax.Hub.Config({})</script>'
        "<script>// see https://docs.example/guide/page for why\nrequire(['https://cdn.example/reveal/4/dist/reveal.js'])</script>"
        '<link rel="stylesheet" href="https://styles.example/theme/a.css"><link rel="icon" href="https://x.example/i.png">'
        '<script type="application/json">{"not": "run"}</script></head></html>'
    )
    addresses = {
        "https://cdn.example/reveal/4/": re.compile(re.escape("https://cdn.example/reveal/4") + "/"),
        "https://cdn.example/": re.compile(re.escape("https://cdn.example/") + r"(?![A-Za-z0-9])"),
    }
    policy = {d.split()[0]: d.split()[1:] for d in export_policy(page, addresses).split("; ")}
    scripts = policy["script-src"]
    # the folder of a script address, and of a configured address a script loads; no comment's link;
    # not the CDN's root, which the page only names as part of a longer address
    assert "https://cdn.example/lib/1.0/" in scripts and "https://cdn.example/reveal/4/" in scripts
    assert not any("docs.example" in s for s in scripts) and "https://cdn.example/" not in scripts
    # one hash (the classic script), not the JSON block; eval for the MathJax block
    assert sum(s.startswith("'sha256-") for s in scripts) == 1 and "'unsafe-eval'" in scripts
    assert policy["style-src"] == ["'unsafe-inline'", "https://styles.example/theme/"]
    assert "https://styles.example/theme/" in policy["font-src"] and not any("x.example" in s for s in scripts)


def test_no_mathjax_block_no_eval() -> None:
    policy = export_policy("<html><head><script>var a = 1</script></head></html>")
    assert "'unsafe-eval'" not in policy and "'sha256-" in policy


def test_a_page_without_a_head_is_refused() -> None:
    with pytest.raises(ValueError, match="no <head>"):
        with_policy("<html><body>x</body></html>", "default-src 'none'")
    assert with_policy("<html><HEAD lang=x>", "p").startswith(
        '<html><HEAD lang=x>\n<meta http-equiv="Content-Security-Policy" content="p">'
    )


def test_a_policy_value_cannot_close_its_attribute() -> None:
    page = with_policy("<head>", 'x"><script>alert(1)</script>')
    assert "<script>" not in page and "&quot;&gt;&lt;script&gt;" in page


@pytest.mark.parametrize("exporter_class", [ScriptExporter, MarkdownExporter])
def test_exporters_that_make_no_page_are_left_alone(exporter_class: type) -> None:
    assert confined_class(exporter_class) is exporter_class


def test_the_confined_step_is_the_html_step_of_every_html_exporter() -> None:
    # webpdf renders its HTML with HTMLExporter's step, called from its own: the
    # confining step must sit between the two for the browser it starts to get the policy
    mro = confined_class(WebPDFExporter).__mro__
    at = mro.index(WebPDFExporter)
    assert mro[at + 1].__name__ == "ConfiningHTMLExporter" and mro[at + 2] is HTMLExporter
    assert confined_class(SlidesExporter).__mro__[2].__name__ == "ConfiningHTMLExporter"
    assert confined_class(SlidesExporter) is confined_class(SlidesExporter)


def test_configuration_keeps_applying_by_class_name() -> None:
    nb = attack_notebook()
    page = _Page(_export(SlidesExporter, nb, SlidesExporter={"reveal_url_prefix": "https://reveal.example/r"}))
    assert "https://reveal.example/r/" in _policy(page)["script-src"]
    page = _Page(_export(HTMLExporter, nb, HTMLExporter={"mathjax_url": "https://math.example/mj/MathJax.js"}))
    assert "https://math.example/mj/" in _policy(page)["script-src"]
    assert not any("cdnjs.cloudflare.com/ajax/libs/mathjax" in s for s in _policy(page)["script-src"])
    # another template is confined the same way
    page = _Page(_export(HTMLExporter, nb, HTMLExporter={"template_name": "classic"}))
    assert _policy(page)["default-src"] == ["'none'"] and not [t for _, t in page.scripts if "127.0.0.1:9" in t]


def test_what_is_shown_is_a_copy() -> None:
    nb = attack_notebook()
    before = nbformat.writes(nb)
    shown = shown_as_in_lab(nb)
    assert nbformat.writes(nb) == before
    assert "widgets" not in shown.metadata
    outputs = shown.cells[1].outputs
    assert "<script" not in outputs[0].data["text/html"] and "application/javascript" not in outputs[1].data


def _get_exporter_in_a_fresh_server_process(environ: dict[str, str]) -> str:
    code = (
        "from sandbox_kernel import lab_exports\n"
        "print(lab_exports.install_exporters())\n"
        "from jupyter_server.nbconvert import handlers\n"
        "print(type(handlers.get_exporter('html')).__mro__[2].__name__)\n"
        "print(type(handlers.get_exporter('script')).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_KERNEL_REMOTE_CONTENT"} | environ
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    return done.stdout


def test_the_servers_handlers_construct_confined_exporters() -> None:
    assert _get_exporter_in_a_fresh_server_process({}).split() == ["True", "HTMLExporter", "ScriptExporter"]


def test_remote_content_leaves_exports_as_nbconvert_makes_them() -> None:
    out = _get_exporter_in_a_fresh_server_process({"SANDBOX_KERNEL_REMOTE_CONTENT": "1"}).split()
    assert out == ["False", "TemplateExporter", "ScriptExporter"]
