"""Validation of the Jupyter requests the kernel serves, before any work is done.

A request with 30 MB of code, a non-string ``code``, malformed
``user_expressions`` or lone surrogates left the kernel alive but never idle
again, and the namespace was lost: the bad value reached the engine, the
worker's channel or ipykernel's reply serialisation and blew up there. Every
field is checked here first; a bad one gets an error reply naming it, and
nothing is sent to the sandbox. Each function returns the problem in words,
or None when the field is fine.
"""

from __future__ import annotations

from typing import Any

#: what a single execute/complete/inspect request may carry (the worker's frame
#: limit is 64 MiB; this leaves room and keeps a runaway client from stalling)
MAX_CODE_BYTES = 16 * 1024 * 1024
MAX_EXPRESSIONS = 100
MAX_EXPRESSION_CHARS = 64 * 1024
HISTORY_TYPES = ("tail", "range", "search")


def text_problem(value: Any, field: str, max_bytes: int = MAX_CODE_BYTES) -> str | None:
    if not isinstance(value, str):
        return f"{field} must be a string, not {type(value).__name__}"
    if len(value) > max_bytes:  # characters are at least a byte each: cheap first cut
        return f"{field} is {len(value):,} characters long, more than the {max_bytes:,} bytes allowed"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"{field} is not valid Unicode (a lone surrogate at position {exc.start})"
    if size > max_bytes:
        return f"{field} is {size:,} bytes long, more than the {max_bytes:,} allowed"
    return None


def flag_problem(value: Any, field: str) -> str | None:
    if not isinstance(value, bool):
        return f"{field} must be true or false, not {type(value).__name__} {str(value)[:40]!r}"
    return None


def expressions_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"user_expressions must be an object mapping names to expressions, not {type(value).__name__}"
    if len(value) > MAX_EXPRESSIONS:
        return f"user_expressions has {len(value)} entries, more than the {MAX_EXPRESSIONS} allowed"
    for name, expr in value.items():
        problem = text_problem(name, "a user_expressions name", 200) or text_problem(
            expr, f"user_expressions[{str(name)[:40]!r}]", MAX_EXPRESSION_CHARS
        )
        if problem:
            return problem
    return None


def cursor_problem(cursor_pos: Any, code: str) -> str | None:
    if cursor_pos is None:
        return None
    if isinstance(cursor_pos, bool) or not isinstance(cursor_pos, int):
        return f"cursor_pos must be an integer, not {type(cursor_pos).__name__}"
    if not 0 <= cursor_pos <= len(code):
        return f"cursor_pos {cursor_pos} is outside the code (0 to {len(code)})"
    return None


def execute_problem(
    code: Any, silent: Any, store_history: Any, user_expressions: Any, allow_stdin: Any, max_code: int
) -> str | None:
    return (
        text_problem(code, "code", max_code)
        or flag_problem(silent, "silent")
        or flag_problem(store_history, "store_history")
        or flag_problem(allow_stdin, "allow_stdin")
        or expressions_problem(user_expressions)
    )


def history_problem(hist_access_type: Any, n: Any, start: Any, stop: Any, session: Any, pattern: Any) -> str | None:
    if hist_access_type not in HISTORY_TYPES:
        return f"hist_access_type must be one of {', '.join(HISTORY_TYPES)}, not {str(hist_access_type)[:40]!r}"
    for field, value in (("n", n), ("start", start), ("stop", stop), ("session", session)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{field} must be an integer, not {type(value).__name__}"
    if n is not None and n < 0:
        return f"n must not be negative ({n})"
    if pattern is not None:
        return text_problem(pattern, "pattern", 10_000)
    return None


def error_reply(problem: str, **extra: Any) -> dict[str, Any]:
    """The error reply naming what was wrong (nothing of the bad value is echoed
    but its description)."""
    return {
        "status": "error",
        "ename": "InvalidRequest",
        "evalue": problem,
        "traceback": [f"InvalidRequest: {problem}"],
        **extra,
    }
