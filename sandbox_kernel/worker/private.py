"""``sandbox_kernel.private`` as seen from a cell: raise the private-data ratchet.

The decision and the record live on the host; a cell can only ask for the
level to go up. If the sandbox still has network when that happens, the host
stops the cell right there and replaces the sandbox with a network-less one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

PRIVATE_ROOT = "/private"
_request: Callable[[dict[str, Any]], dict[str, Any]] | None = None


def _ask(payload: dict[str, Any]) -> dict[str, Any]:
    if _request is None:
        raise RuntimeError("sandbox_kernel.private only works inside a running cell")
    reply = _request(payload)
    if not reply.get("ok"):
        raise ValueError(str(reply.get("error") or "the host refused the request"))
    return reply


def add_dataset(name: str, sensitivity: str = "CONFIDENTIAL") -> str:
    """Declare that private data named ``name`` entered this session.

    Returns the session's level afterwards. The network of the sandbox is cut
    for good; it is never given back.
    """
    return str(_ask({"kind": "dataset", "name": name, "sensitivity": str(sensitivity)}).get("level"))


def mark_private(sensitivity: str = "CONFIDENTIAL", reason: str = "") -> str:
    """Mark the whole session private without naming a dataset."""
    return str(_ask({"kind": "mark", "sensitivity": str(sensitivity), "reason": str(reason)}).get("level"))


def dataset_path(name: str) -> str:
    """Path of a configured private dataset, mounted read-only at /private/<name>.

    Mounting it raises the ratchet first (to the dataset's configured level).
    """
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid dataset name {name!r}")
    path = os.path.join(PRIVATE_ROOT, name)
    if not os.path.exists(path):
        _ask({"kind": "mount", "name": name})
        if not os.path.exists(path):
            raise FileNotFoundError(f"private dataset {name!r} is not mounted")
    return path


def open_dataset(name: str, mode: str = "r", **kwargs: Any) -> Any:
    """Open a configured private dataset file (read-only)."""
    if any(flag in mode for flag in "wax+"):
        raise ValueError("private datasets are read-only")
    return open(dataset_path(name), mode, **kwargs)


def private_magic(line: str) -> None:
    """%private NAME [LEVEL]: declare a private dataset (default CONFIDENTIAL)."""
    parts = line.split()
    if not parts or len(parts) > 2:
        raise ValueError("usage: %private NAME [INTERNAL|CONFIDENTIAL|SECRET]")
    level = add_dataset(parts[0], parts[1] if len(parts) > 1 else "CONFIDENTIAL")
    print(f"Session is private ({level}); the sandbox has no network.")


def install(shell: Any) -> None:
    """Make ``import sandbox_kernel.private`` and ``%private`` work in cells."""
    import sys
    import types

    module = sys.modules[__name__]
    package = sys.modules.get("sandbox_kernel")
    if package is None:
        package = types.ModuleType("sandbox_kernel", "sandbox_kernel as seen from inside the sandbox")
        package.__path__ = []
        sys.modules["sandbox_kernel"] = package
    package.private = module  # type: ignore[attr-defined,unused-ignore]  # a ModuleType, set on purpose
    sys.modules["sandbox_kernel.private"] = module
    shell.register_magic_function(private_magic, "line", "private")
