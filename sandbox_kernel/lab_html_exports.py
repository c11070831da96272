"""An HTML export of a notebook runs nothing the notebook holds and fetches nothing.

Why: "Save and Export Notebook As → HTML" (or "Reveal.js Slides") runs
nbconvert in the Jupyter server and downloads a page of its own: the
notebook's markdown and outputs as they are in the file, with the template's
scripts (MathJax, require.js, mermaid; reveal.js for slides). A cell can write
anything into a notebook of its workspace, the kernel's output policy does not
see the file, and a downloaded page opened from disk has no policy at all:
its scripts run, ``<meta http-equiv="refresh">`` navigates, images and
resource hints load, so a private session's data leaves when the user opens
the export (guarantee 8), and the saved widget state makes the page load
widget code from a CDN under names the notebook chose.

What this does to every exporter of the HTML family (``html``, ``slides``,
and ``webpdf``/``qtpdf``, whose HTML step is the same) that the Jupyter
server's nbconvert handlers construct:

- the notebook is exported as JupyterLab shows it: outputs pass the kernel's
  output policy (:func:`sandbox_kernel.outputs.sanitize_bundle`: scripts,
  widgets and unknown types dropped, HTML and SVG cleaned), markdown cells
  its markdown cleaner, and the saved widget state is left out (a widget
  shows its text, as in a notebook whose kernel is gone);
- the page carries a Content-Security-Policy ``<meta>`` before anything of
  the notebook's: scripts only the template's own (its inline scripts by
  hash, its script addresses by folder), ``'unsafe-eval'`` only when the
  template has a MathJax configuration block (MathJax 2 evaluates it), styles
  inline or from the template's addresses, images and media only ``data:``,
  fonts ``data:`` or beside the template's scripts (MathJax's), and no
  connections, frames, objects, forms or ``<base>``. The template's own
  resources are found by rendering an empty notebook with the same exporter:
  whatever differs in the real export is the notebook's.

nbconvert's own ``sanitize_html`` is not used: its allow-list has no headings,
paragraphs, images or table headers, so a markdown heading shows as escaped
text. ``SANDBOX_KERNEL_REMOTE_CONTENT=1`` (see :mod:`lab_content_policy`)
leaves exports as nbconvert makes them; ``jupyter nbconvert`` on the host is
not this server and is not changed (docs/security.md).
"""

from __future__ import annotations

import copy
import functools
import re
from html import escape
from typing import Any
from urllib.parse import urlsplit

from .page_scripts import read_page, script_hash

#: what may follow a whole address in a script (not more of an address)
_URL_ENDS = r"(?![A-Za-z0-9._~%!$&*+=:@/?#\-])"
#: what a folder address may hold to be written into the policy as it is
_SOURCE_SAFE = re.compile(r"https?://[A-Za-z0-9.\-]+(?::[0-9]{1,5})?/[A-Za-z0-9._~!$&*+=:@%/\-]*\Z")


def _folder(url: str) -> str | None:
    """The folder of an http(s) address as a CSP source (``https://host/dir/``), or None."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        return None
    folder = f"{parts.scheme}://{parts.netloc}{parts.path.rsplit('/', 1)[0]}/"
    return folder if _SOURCE_SAFE.match(folder) else None


def _sources(urls: list[str]) -> list[str]:
    return sorted({folder for folder in map(_folder, urls) if folder})


def template_addresses(exporter: Any) -> dict[str, re.Pattern[str]]:
    """The addresses an exporter's configuration gives its template's scripts
    to load (``mathjax_url``, ``mermaid_js_url``, reveal's ``reveal_url_prefix``...):
    each address whose folder to allow (a prefix is a folder), with how it is
    written in a script that loads it (the whole address, or the prefix and
    then a path)."""
    addresses: dict[str, re.Pattern[str]] = {}
    for name in exporter.trait_names():
        value = getattr(exporter, name, None)
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            continue
        if name.endswith("_url"):
            addresses[value] = re.compile(re.escape(value) + _URL_ENDS)
        elif name.endswith("_url_prefix"):
            prefix = value.rstrip("/")
            addresses[prefix + "/"] = re.compile(re.escape(prefix) + "/")
    return addresses


def export_policy(template_page: str, addresses: dict[str, re.Pattern[str]] | None = None) -> str:
    """The Content-Security-Policy of an export whose template alone renders
    ``template_page`` (the export of an empty notebook). Scripts may come from
    the folders of the page's ``<script src>`` and of each of
    :func:`template_addresses` that the page's inline scripts load (mermaid's
    module, reveal's plugins); an address a script only mentions as part of a
    longer one (the widgets' CDN root in reveal's address) is not a source."""
    found = read_page(template_page)
    loaded = [url for url, written in (addresses or {}).items() if any(map(written.search, found.inline_scripts))]
    script_folders = _sources([*found.script_urls, *loaded])
    style_folders = _sources(found.style_urls)
    scripts = sorted({script_hash(text) for text in found.inline_scripts}) + script_folders
    if found.mathjax_config:
        scripts.append("'unsafe-eval'")
    directives = {
        "default-src": ["'none'"],
        "script-src": scripts or ["'none'"],
        "style-src": ["'unsafe-inline'", *style_folders],
        "img-src": ["data:"],
        "media-src": ["data:"],
        # MathJax's fonts lie beside its script, a reveal theme's beside its stylesheet
        "font-src": ["data:", *sorted({*script_folders, *style_folders})],
        "base-uri": ["'none'"],
        "form-action": ["'none'"],
    }
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


_HEAD = re.compile(r"<head\b[^>]*>", re.IGNORECASE)
_CHARSET = re.compile(r"\s*<meta\s+charset=[^>]*>", re.IGNORECASE)


def with_policy(page: str, policy: str) -> str:
    """``page`` with ``policy`` as a ``<meta>`` right after the template's
    ``<head>`` (and its charset declaration, which must stay in the first
    kilobyte): before any element the notebook put in the page. Raises
    ValueError for a page without a head (the export is then refused, not
    sent unconfined)."""
    head = _HEAD.search(page)
    if head is None:
        raise ValueError("the exported page has no <head> to put its Content-Security-Policy in")
    at = head.end()
    charset = _CHARSET.match(page, at)
    if charset is not None:
        at = charset.end()
    meta = f'\n<meta http-equiv="Content-Security-Policy" content="{escape(policy)}">'
    return page[:at] + meta + page[at:]


def shown_as_in_lab(notebook: Any) -> Any:
    """A copy of ``notebook`` (a NotebookNode) with what JupyterLab would show
    of it: outputs through the kernel's output policy, markdown cells through
    its markdown cleaner, no saved widget state."""
    from nbformat import from_dict

    from .outputs import sanitize_bundle

    shown = copy.deepcopy(notebook)
    metadata = shown.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("widgets", None)
    for cell in shown.get("cells", []) or []:
        if not isinstance(cell, dict):
            continue
        if cell.get("cell_type") == "markdown" and isinstance(cell.get("source"), str):
            # as a text/markdown output (one too large to clean becomes the note saying so)
            markdown = sanitize_bundle({"text/markdown": cell["source"]}, private=False).data
            cell["source"] = markdown.get("text/markdown", markdown.get("text/plain", ""))
        outputs = cell.get("outputs") if cell.get("cell_type") == "code" else None
        for output in outputs if isinstance(outputs, list) else []:
            if isinstance(output, dict) and output.get("output_type") in {"display_data", "execute_result"}:
                clean = sanitize_bundle(output.get("data") or {}, output.get("metadata"), private=False)
                output["data"] = from_dict(clean.data)  # type: ignore[no-untyped-call]
                output["metadata"] = from_dict(clean.metadata)  # type: ignore[no-untyped-call]
    return shown


@functools.cache
def _confining_class() -> type:
    from nbconvert.exporters import HTMLExporter
    from nbformat import v4

    class ConfiningHTMLExporter(HTMLExporter):
        """The HTML step of every exporter of the family, confined (module docstring)."""

        def from_notebook_node(self, nb: Any, resources: Any = None, **kw: Any) -> Any:
            # one empty cell: the slides exporter refuses a notebook without one
            empty = v4.new_notebook(cells=[v4.new_markdown_cell("")])  # type: ignore[no-untyped-call]
            template_page, _ = super().from_notebook_node(empty, None)
            page, resources = super().from_notebook_node(shown_as_in_lab(nb), resources, **kw)
            return with_policy(page, export_policy(template_page, template_addresses(self))), resources

    return ConfiningHTMLExporter


_CONFINED: dict[type, type] = {}


def confined_class(exporter_class: type) -> type:
    """The class to construct instead of ``exporter_class``: itself when it
    makes no HTML, else one whose HTML step is confined. (Its MRO puts the
    confining step right above ``HTMLExporter``, so ``webpdf``'s browser gets
    the confined page too; config sections keep applying by class name.)"""
    from nbconvert.exporters import HTMLExporter

    if not issubclass(exporter_class, HTMLExporter):
        return exporter_class
    if exporter_class not in _CONFINED:
        confining = _confining_class()
        if exporter_class is HTMLExporter:
            _CONFINED[exporter_class] = confining
        else:
            _CONFINED[exporter_class] = type(exporter_class.__name__, (exporter_class, confining), {})
    return _CONFINED[exporter_class]


__all__ = ["confined_class", "export_policy", "shown_as_in_lab", "with_policy"]
