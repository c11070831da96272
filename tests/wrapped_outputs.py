"""The element the kernel wraps an HTML or markdown output in
(``sandbox_kernel/outputs/_scoped_css.py``), taken apart for the tests."""

from __future__ import annotations

from sandbox_kernel.outputs._scoped_css import WRAPPED as WRAPPER


def token_of(out: str) -> str:
    """The token of a wrapped output (its class ``sk-output-<token>``, its sheets' scope)."""
    found = WRAPPER.match(out)
    assert found, f"not wrapped: {out[:300]!r}"
    return found["token"]


def inner(out: str, markdown: bool = False) -> str:
    """What is inside the wrapper (``out`` itself when it is not wrapped)."""
    found = WRAPPER.match(out)
    if not found:
        return out
    text = found["inner"]
    if markdown:
        assert text.startswith("\n\n") and text.endswith("\n\n"), out
        return text[2:-2]
    return text


def scope(out: str) -> str:
    """The ``@scope`` prelude of a wrapped output's style sheets."""
    return f"@scope (.sk-output-{token_of(out)}) {{"
