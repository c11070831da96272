"""What a value a sandbox sent takes as JSON, and as text, without holding the GIL long.

Why not ``len(json.dumps(value))``: that is one C call, and it holds the GIL
for as long as it runs. ``json.dumps`` of a frame's million floats (a
sandbox's output metadata, or a widget message) held it 1.2 to 1.3 s, and
the cut watchdog (``engine/cut_watchdog.py``), a thread, cannot cut a risen
sandbox's network meanwhile. Here each C call sees at most
:data:`SLICE` values of one container (and the strings among them); the
containers are walked in Python, which lets other threads run every few
milliseconds. The count is exact: the same as ``json.dumps`` with its default
separators and ``ensure_ascii=False``, in UTF-8.
"""

from __future__ import annotations

import json
from typing import Any

#: the most values one ``json.dumps`` call is given
SLICE = 4096

_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_KEY_WORDS = {True: "true", False: "false", None: "null"}


def _dumped(value: Any) -> int:
    """Bytes ``value`` (a container of at most about :data:`SLICE` values) takes as JSON."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _str_keys(item: dict[Any, Any]) -> dict[str, Any]:
    """``item`` with its keys as ``json.dumps`` writes them (always strings)."""
    if set(map(type, item)) <= _STR:
        return item
    out = {_key(k): v for k, v in item.items()}
    if len(out) != len(item):
        raise ValueError("keys that JSON writes alike (1 and '1')")
    return out


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return _KEY_WORDS[key]
    if isinstance(key, int | float):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _shell(item: Any, todo: list[Any]) -> tuple[Any, int]:
    """``item`` (a list, tuple or dict) with each container in it replaced by
    ``0`` and put on ``todo``: a container of scalars alone, and how many bytes
    its size then counts too many (one per ``0``)."""
    values = item.values() if isinstance(item, dict) else item
    if set(map(type, values)) <= _SCALARS:
        return item, 0
    holes = 0
    if isinstance(item, dict):
        shell: dict[str, Any] = {}
        for k, v in item.items():
            if type(v) in _SCALARS:
                shell[k] = v
            else:
                shell[k] = 0
                todo.append(v)
                holes += 1
        return shell, holes
    flat = []
    for v in item:
        if type(v) in _SCALARS:
            flat.append(v)
        else:
            flat.append(0)
            todo.append(v)
            holes += 1
    return flat, holes


def encoded_size(value: Any) -> int:
    """``len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))``,
    never giving one C call more than about :data:`SLICE` values. Raises
    TypeError for what JSON cannot hold and ValueError for a container met
    twice (a cycle, which ``json.dumps`` refuses too, or one shared, which
    ``json.dumps`` writes twice but a parsed frame never has) or for keys
    that JSON writes alike (``1`` and ``"1"``).

    Each container is sized with the containers in it written as ``0`` (they
    are sized in turn). Small ones are sized together, up to :data:`SLICE`
    values in one call: a call per container cost 5x ``json.dumps`` on a data
    set of 50,000 records. A large one is sized a slice at a time; the slices'
    sizes add up to the whole's (``[1, 2]`` is 6 bytes, ``[1]`` and ``[2]`` 3 each)."""
    total = 0
    small: list[Any] = []  # sized together: their sizes add up to that of the list, less 2 per entry
    small_values = 0
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if not isinstance(item, list | tuple | dict):
            if not isinstance(item, str | int | float | type(None)):
                raise TypeError(f"{type(item).__name__} is not JSON")
            small.append(item)
            small_values += 1
        else:
            if item:  # (an empty one holds nothing: the empty tuple is one object, met anywhere)
                if id(item) in seen:
                    raise ValueError("a container met twice (does one hold itself?)")
                seen.add(id(item))
            shell, holes = _shell(_str_keys(item) if isinstance(item, dict) else item, todo)
            total -= holes
            n = len(shell)
            if n > SLICE:
                entries = list(shell.items()) if isinstance(shell, dict) else shell
                for start in range(0, n, SLICE):
                    part = entries[start : start + SLICE]
                    total += _dumped(dict(part) if isinstance(shell, dict) else part)
                continue
            small.append(shell)
            small_values += n + 1
        if small_values >= SLICE:
            total += _dumped(small) - 2 * len(small)
            small, small_values = [], 0
    return total + (_dumped(small) - 2 * len(small) if small else 0)


def utf8_len(text: str) -> int:
    """Bytes ``text`` takes in UTF-8 (lone surrogates as the worker writes them)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def json_size(value: Any) -> int:
    """Bytes ``value`` takes as JSON (0 for None; a string counts its UTF-8
    bytes, without quotes): what goes beside a bundle's data (its metadata,
    its display id) is charged as the data is. What JSON cannot hold counts
    as more than any budget."""
    if value is None:
        return 0
    if isinstance(value, str):
        return utf8_len(value)
    try:
        return encoded_size(value)
    except (TypeError, ValueError):
        return 1 << 62


def text_of(value: Any, limit: int | None = None) -> str:
    """``str(value)`` (its first ``limit`` characters) for a value a sandbox
    sent where text belongs (an error's name and value, a traceback line, a
    prompt): a string as it is, a number as written, and a list or object
    named by its size once it is over ``limit`` bytes as JSON (or 1 MB), since
    ``str()`` of a frame's million floats held the GIL 1.1 to 1.4 s in one call."""
    if isinstance(value, str):
        return value if limit is None else value[:limit]
    bound = limit if limit is not None else 1 << 20
    if isinstance(value, list | tuple | dict) and json_size(value) > bound:
        return f"({type(value).__name__} of {len(value)} entries, not text)"
    text = str(value)
    return text if limit is None else text[:limit]
