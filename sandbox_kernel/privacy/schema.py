"""The privacy file's JSON format (version 1): encode, and strict decode.

One file per session, ``<root>/<user_id>/<session_id>.json`` (one line on
disk, shown indented here)::

    {
      "schema": "sandbox_kernel.privacy",
      "version": 1,
      "user_id": "alice",
      "session_id": "analysis-0123456789abcdef",
      "private": true,
      "level": "CONFIDENTIAL",
      "datasets": [
        {"name": "patients", "level": "CONFIDENTIAL", "source": "connector",
         "added_at": "2024-05-01T12:00:00.000Z"}
      ],
      "mark": null,
      "omitted_datasets": 0,
      "updated_at": "2024-05-01T12:00:00.000Z"
    }

``level`` is a floor kept in its own right (it also carries the level of
datasets beyond the listing limit); the session's level is the max of it, the
datasets' and the mark's. ``mark`` is null or ``{"level", "source", "reason",
"added_at"}``. Unknown extra keys are ignored; anything else unexpected is a
:class:`SchemaError`, which the store turns into "private at SECRET".
"""

from __future__ import annotations

import json
from typing import Any

from . import state as _state
from .records import Dataset, SessionMark, utc_now_iso
from .sensitivity import Sensitivity
from .state import PrivacyState, merge, union_datasets

SCHEMA = "sandbox_kernel.privacy"
VERSION = 1


class SchemaError(ValueError):
    """The file is not a privacy file this version can read."""


class FutureVersionError(SchemaError):
    """The file was written by a newer version of the format: never overwrite it."""


def encode(state: PrivacyState, user_id: str, session_id: str) -> bytes:
    doc = {
        "schema": SCHEMA,
        "version": VERSION,
        "user_id": user_id,
        "session_id": session_id,
        "private": state.has_private_data,
        "level": state.sensitivity.name,
        "datasets": [d.to_json() for d in state.datasets],
        "mark": state.mark.to_json() if state.mark else None,
        "omitted_datasets": state.omitted_datasets,
        "updated_at": utc_now_iso(),
    }
    return (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")


def _no_constants(name: str) -> Any:
    raise SchemaError(f"the JSON contains the non-standard constant {name}")


def decode(raw: bytes, user_id: str, session_id: str) -> PrivacyState:
    """Parse a privacy file; raise :class:`SchemaError` saying what is wrong."""
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError as exc:
        raise SchemaError(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise SchemaError("is not valid JSON (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"holds a JSON {type(doc).__name__}, not an object")
    if doc.get("schema") != SCHEMA:
        raise SchemaError(f"has schema {doc.get('schema')!r:.60}, expected {SCHEMA!r}")
    version = doc.get("version")
    if type(version) is not int:
        raise SchemaError(f"has version {version!r:.40}, expected the integer {VERSION}")
    if version > VERSION:
        raise FutureVersionError(
            f"was written by a newer sandbox_kernel (format version {version}, this one reads {VERSION})"
        )
    if version != VERSION:
        raise SchemaError(f"has unknown format version {version}")
    if doc.get("user_id") != user_id or doc.get("session_id") != session_id:
        raise SchemaError(
            f"belongs to user_id {doc.get('user_id')!r:.70} / session_id "
            f"{doc.get('session_id')!r:.70}, not to the session at its path"
        )
    try:
        level = Sensitivity.parse(doc.get("level"), "level")
        datasets = doc.get("datasets")
        if not isinstance(datasets, list):
            raise ValueError(f"datasets must be a list, got {type(datasets).__name__}")
        records = [Dataset.from_json(item) for item in datasets]
        mark = None if doc.get("mark") is None else SessionMark.from_json(doc["mark"])
        omitted = doc.get("omitted_datasets", 0)
        if type(omitted) is not int or omitted < 0:
            raise ValueError(f"omitted_datasets must be a non-negative integer, got {omitted!r:.40}")
        private = doc.get("private")
        if type(private) is not bool:
            raise ValueError(f"private must be true or false, got {private!r:.40}")
    except ValueError as exc:
        raise SchemaError(f"has a bad field: {exc}") from None
    # Duplicate names are merged (max level) rather than refused: never lowers.
    state = PrivacyState.build(datasets=union_datasets(records), mark=mark, floor=level, omitted_datasets=omitted)
    if len(state.datasets) > _state.MAX_DATASETS:  # hand-edited: count the excess, keep its level
        state = merge(state)
    if private and not state.has_private_data:
        raise SchemaError("says private is true but records no private level")
    return state
