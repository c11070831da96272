"""The output policy for every reply field of sandbox origin, not only outputs.

JupyterLab renders more than ``display_data``: the pager payload of an
``execute_reply`` is shown as TRUSTED rich output (a cell that called
``IPython.core.page.page({'text/html': '<img onerror=...>'})`` ran script in the
user's browser, which then opened a terminal on the host through the Jupyter
server's API), and ``user_expressions`` values, completion metadata and
inspection data are rendered too. Everything the sandbox put into a reply is
therefore cleaned here, by allow-list: a field or payload source that is not
known is dropped (and logged), never passed through.

Decisions:

- ``page``: its bundle passes :func:`sanitize_bundle` like any output (never
  trusted: the pager is not an output the user opted into), ``start`` is a
  non-negative int.
- ``set_next_input``: allowed, as plain text of at most ``MAX_NEXT_INPUT``
  characters with control characters (but newlines and tabs) removed, and
  ``replace`` a bool. It only puts code into the user's next cell, which runs
  in the sandbox again when (and only when) the user runs it; once the session
  is private its URLs are defanged like any text.
- ``edit_magic``: dropped. It names a file path inside the sandbox, which means
  nothing on the host, and a frontend opening an editor on a host path is a risk.
- ``ask_exit``: only ``keepkernel`` (a bool) is kept.
- A bundle of a reply (a page, an expression's value, an inspection) is
  cleaned only up to ``MAX_REPLY_BUNDLE`` bytes: replies are not charged to a
  cell's output budget, a frame holds 64 MB, and cleaning that much held the
  kernel's GIL (and the cut watchdog that needs it) up to 4 s in one call.
  Help text, source and values that large are not something a pager shows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..terminal_text import terminal_safe_output
from .limits import bundle_size
from .sanitize import SanitizedBundle, sanitize_bundle
from .sizing import text_of

log = logging.getLogger("sandbox_kernel.outputs")

MAX_NEXT_INPUT = 100_000
MAX_REPLY_BUNDLE = 4 * 1024 * 1024
MAX_PAYLOADS = 16
MAX_EXPRESSIONS = 100
MAX_TEXT = 100_000
MAX_TRACEBACK_LINES = 1000
MAX_COMPLETION_TYPES = 10_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

Defang = Callable[[str], str]


def _identity(text: str) -> str:
    return text


def plain_text(value: Any, limit: int = MAX_TEXT, defang: Defang = _identity) -> str:
    """A string of at most ``limit`` characters, without lone surrogates or
    control sequences a terminal frontend would obey (colours kept)."""
    text = text_of(value, limit).encode("utf-8", "replace").decode("utf-8")
    return defang(terminal_safe_output(text))


def clean_reply_bundle(data: Any, metadata: Any, *, private: bool) -> SanitizedBundle:
    """A reply's bundle through the output policy (never trusted), its
    ``text/plain`` without the control sequences a terminal frontend would
    obey (as iopub's displays: ``jupyter console`` prints a pager payload, an
    inspection, a user expression; an attack review's docstring set the
    terminal's clipboard through OSC 52 and typed into its input through a
    status query), or a note when it is over ``MAX_REPLY_BUNDLE`` bytes."""
    if isinstance(data, Mapping):
        size = bundle_size(data)
        if size > MAX_REPLY_BUNDLE:
            note = f"a reply's output of {size:,} bytes was dropped (over {MAX_REPLY_BUNDLE:,}, too large to clean)"
            log.warning("%s", note)
            return SanitizedBundle({"text/plain": f"[sandbox_kernel: {note}]"}, {}, [note])
    clean = sanitize_bundle(data, metadata, trusted=False, private=private)
    text = clean.data.get("text/plain")
    if isinstance(text, str):
        safe = terminal_safe_output(text)
        if safe is not text:
            clean.data["text/plain"] = safe
    return clean


def clean_payloads(payloads: Any, *, private: bool, defang: Defang = _identity) -> list[dict[str, Any]]:
    """The execute_reply ``payload`` list, by allow-list of sources."""
    if not isinstance(payloads, list):
        return []
    out: list[dict[str, Any]] = []
    for payload in payloads[:MAX_PAYLOADS]:
        if not isinstance(payload, Mapping):
            log.warning("dropped a payload that is not an object (%s)", type(payload).__name__)
            continue
        source = payload.get("source")
        if source == "page":
            clean = clean_reply_bundle(
                payload.get("data"), {}, private=private
            )  # bad shapes are named in clean.removed
            if not clean.data:
                continue
            start = payload.get("start")
            out.append(
                {"source": "page", "data": clean.data, "start": start if isinstance(start, int) and start >= 0 else 0}
            )
        elif source == "set_next_input":
            text = payload.get("text")
            if not isinstance(text, str):
                continue
            text = _CONTROL.sub("", plain_text(text, MAX_NEXT_INPUT, defang if private else _identity))
            out.append({"source": "set_next_input", "text": text, "replace": payload.get("replace") is True})
        elif source == "ask_exit":
            out.append({"source": "ask_exit", "keepkernel": payload.get("keepkernel") is True})
        else:
            log.warning("dropped an execute_reply payload of source %r from the sandbox", text_of(source, 60))
    return out


def clean_user_expressions(
    values: Any, asked: Mapping[str, Any], *, private: bool, defang: Defang = _identity
) -> dict[str, Any]:
    """``user_expressions`` results: only the names the client asked for, each a
    sanitised bundle or a plain-text error."""
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, Any] = {}
    for name in list(asked)[:MAX_EXPRESSIONS]:
        value = values.get(name)
        if not isinstance(value, Mapping):
            continue
        if value.get("status") == "ok":
            clean = clean_reply_bundle(value.get("data"), value.get("metadata"), private=private)
            out[name] = {"status": "ok", "data": clean.data, "metadata": clean.metadata}
        else:
            tb = value.get("traceback")
            lines = (
                [plain_text(line, MAX_TEXT, defang if private else _identity) for line in tb[:MAX_TRACEBACK_LINES]]
                if isinstance(tb, list)
                else []
            )
            out[name] = {
                "status": "error",
                "ename": plain_text(value.get("ename", "Error"), 200, defang if private else _identity),
                "evalue": plain_text(value.get("evalue", ""), MAX_TEXT, defang if private else _identity),
                "traceback": lines,
            }
    return out


def clean_completion_metadata(metadata: Any, n_matches: int) -> dict[str, Any]:
    """Only ``_jupyter_types_experimental`` (JupyterLab shows its types next to
    the matches), as plain values of bounded size; everything else is dropped."""
    if not isinstance(metadata, Mapping):
        return {}
    types = metadata.get("_jupyter_types_experimental")
    if not isinstance(types, list):
        return {}
    clean = []
    for entry in types[: min(MAX_COMPLETION_TYPES, max(n_matches, 0))]:
        if not isinstance(entry, Mapping):
            continue
        item: dict[str, Any] = {}
        for key in ("start", "end"):
            if isinstance(entry.get(key), int):
                item[key] = entry[key]
        for key, limit in (("text", 1000), ("type", 100), ("signature", 2000)):
            if isinstance(entry.get(key), str):
                item[key] = plain_text(entry[key], limit)
        clean.append(item)
    return {"_jupyter_types_experimental": clean} if clean else {}
