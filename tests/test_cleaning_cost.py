"""Cleaning an output costs the host time linear in its size.

Everything a sandbox sends is cleaned on the kernel's event loop, and a
regular expression runs there holding the GIL: the cut watchdog's thread,
which takes a risen sandbox's network while the loop is busy, cannot run
meanwhile. An attack review (helper 57) found two cleaners quadratic in an
ordinary display far below every size cap: an SVG attribute of unclosed
``url(`` (128 KB held the GIL 21.7 s) and markdown of ``<a<a<a...`` (64 KB took
2.9 s, 4 MB would take hours). Each case runs in a child interpreter given
two minutes, so a quadratic cleaner fails the test instead of hanging it; the
output must also come out clean.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLEAN = """
import json, sys
from sandbox_kernel.outputs.sanitize import sanitize_bundle
mime, value = json.loads(sys.stdin.read())
result = sanitize_bundle({mime: value}, {})
print(json.dumps({"data": result.data, "removed": result.removed}))
"""


def _clean_in_a_child(mime: str, value: str) -> dict[str, object]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLEAN],
            input=json.dumps([mime, value]),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"cleaning {len(value):,} characters of {mime} did not end within two minutes")
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_an_svg_attribute_of_unclosed_urls_is_refused_in_linear_time() -> None:
    value = '<svg xmlns="http://www.w3.org/2000/svg"><rect fill="' + "url(" * 250_000 + '"/></svg>'
    result = _clean_in_a_child("image/svg+xml", value)
    svg = str(result["data"]).lower()
    assert "url(" not in svg, svg[:300]  # the attribute went


def test_local_svg_references_are_kept() -> None:
    value = (
        '<svg xmlns="http://www.w3.org/2000/svg"><rect fill="url(#a)" stroke="url( \'#b\' )" '
        'mask="url(http://x.example/m)"/></svg>'
    )
    svg = str(_clean_in_a_child("image/svg+xml", value)["data"])
    assert "url(#a)" in svg and "#b" in svg and "x.example" not in svg, svg


@pytest.mark.parametrize(
    "value",
    [
        "<a" * 2_000_000 + ' x=">',  # a tag name run on to the end from every "<"
        "<a x" * 1_000_000 + ' x=">',  # attribute names
        "<a x=y" * 650_000 + ' x=">',  # unquoted values
    ],
    ids=["names", "attribute names", "unquoted values"],
)
def test_markdown_of_tags_that_never_end_is_cleaned_in_linear_time(value: str) -> None:
    result = _clean_in_a_child("text/markdown", value)
    markdown = str(result["data"])
    assert "<a" not in markdown, markdown[:300]  # every "<" of them escaped
