"""JSON values of an agent's outputs, kept as their text.

The channel parses a frame into a Python object per JSON value, and a cell's
``[[], [], ...]`` displays within the output budget held some hundreds of MB
of the agent's process until the notebook's size limit dropped them (an attack
review). The notebook keeps each value that is not a plain string or number
as its compact JSON text instead (about 1 to 3 bytes per value, not 56 or
more) and parses it again only when a caller asks for it: an export, a cell's
``result``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: values kept as they are: they cost what their text would
_PLAIN = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class FrozenJson:
    """A JSON value as its compact text (ASCII: a lone surrogate a cell sent
    stays an escape, so the notebook can always be written as UTF-8)."""

    text: str

    def thaw(self) -> Any:
        return json.loads(self.text)


def freeze(value: Any) -> Any:
    if isinstance(value, (_PLAIN, FrozenJson)):
        return value
    return FrozenJson(json.dumps(value, separators=(",", ":")))


def freeze_dict(values: Any) -> dict[str, Any]:
    """A MIME bundle or metadata with its structured values frozen (a value
    that is not an object gives an empty one, as before)."""
    if not isinstance(values, dict):
        return {}
    return {key: freeze(value) for key, value in values.items()}


def thaw_dict(values: dict[str, Any] | None) -> dict[str, Any]:
    return {key: value.thaw() if isinstance(value, FrozenJson) else value for key, value in (values or {}).items()}


def split_frozen(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(plain values, frozen texts by key): the notebook file keeps the texts
    under a key of their own, so a save never parses them again."""
    plain = {k: v for k, v in values.items() if not isinstance(v, FrozenJson)}
    frozen = {k: v.text for k, v in values.items() if isinstance(v, FrozenJson)}
    return plain, frozen


def join_frozen(plain: Any, frozen: Any, what: str) -> dict[str, Any]:
    """The inverse of :func:`split_frozen`, from a notebook file: ``plain`` may
    hold structured values (a file written before values were frozen)."""
    if frozen is None:
        frozen = {}
    if not isinstance(frozen, dict) or not all(isinstance(t, str) for t in frozen.values()):
        raise ValueError(f"an output's {what} is not an object of JSON texts")
    values = freeze_dict(plain)
    for key, text in frozen.items():
        try:
            json.loads(text)
        except ValueError as exc:
            raise ValueError(f"an output's {what}[{key!r}] is not JSON: {exc}") from exc
        values[key] = FrozenJson(text)
    return values
