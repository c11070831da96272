"""A notebook cut from the bytes of a signed one (tests/test_lab_signatures.py,
tests/browser/test_saved_widget_state.py).

nbformat's signature is an HMAC over every key and value of the notebook one
after the other, with nothing between them: ``{"a": "bc"}`` and
``{"ab": "c"}`` sign alike. A sandbox writes an innocent notebook whose stream
output spells the bytes of the metadata it wants (saved widget state), has
the user save it (signed: no widget state, no rich output), then writes the
same bytes cut so that the metadata *is* that state.
"""

from __future__ import annotations

import copy
from typing import Any

import nbformat
from nbformat.sign import yield_everything


def _stream(value: Any) -> bytes:
    return b"".join(yield_everything(value))


def innocent_notebook(wanted_metadata: dict[str, Any], metadata: dict[str, Any] | None = None) -> Any:
    """A notebook (with ``metadata``) of one code cell whose stream output spells ``wanted_metadata``."""
    text = (b"sourcemetadata" + _stream(wanted_metadata) + b"zz").decode()
    cell = nbformat.v4.new_code_cell("print(banner)")  # type: ignore[no-untyped-call]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]  # type: ignore[no-untyped-call]
    return nbformat.v4.new_notebook(cells=[cell], metadata=metadata or {})  # type: ignore[no-untyped-call]


def recut(saved: Any, wanted_metadata: dict[str, Any]) -> Any:
    """``saved`` (the innocent notebook as read back after the user's save),
    cut again: the same bytes for nbformat's digest, ``wanted_metadata`` as
    its metadata."""
    text = (b"sourcemetadata" + _stream(wanted_metadata) + b"zz").decode()
    full = _stream(saved)
    tail = f"nbformat{saved.nbformat}nbformat_minor{saved.nbformat_minor}".encode()
    rest = full[full.index(text.encode()) + len(text) :]
    assert rest.endswith(tail), "the innocent notebook was changed by its save"
    cut = copy.deepcopy(saved)
    cut.cells[-1].outputs[-1].text = ""
    cut.cells[-1].source = ""
    cut.metadata = copy.deepcopy(wanted_metadata)
    cut.metadata["zz"] = rest[: -len(tail)].decode()
    assert _stream(cut) == full
    return cut


def cross_scheme_pair(wanted: Any) -> tuple[dict[str, Any], Any]:
    """(N1, N2): ``wanted`` (the notebook a sandbox wants trusted) read as
    the guarded server reads it (N2), and a notebook N1 whose nbformat
    digest bytes are N2's canonical bytes: two extra top-level keys, hidden
    in Lab, spell what comes before and after one of N2's strings, which
    must hold :data:`CROSS_MIDDLE` once (the bytes nbformat puts between
    them). ``jupyter trust N1`` then stored a signature of N2 (an attack
    review of the canonical signatures)."""
    from sandbox_kernel.lab_signatures import canonical_bytes

    n2 = nbformat.reads(nbformat.writes(wanted), as_version=4)  # type: ignore[no-untyped-call]
    before, after = canonical_bytes(n2).split(CROSS_MIDDLE.encode())
    n1 = {"": before.decode(), "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "~": after.decode()}
    assert _stream(n1) == canonical_bytes(n2)
    return n1, n2


#: what nbformat's digest of :func:`cross_scheme_pair`'s N1 holds between its two extra keys
CROSS_MIDDLE = "cellsmetadatanbformat4nbformat_minor5~"
