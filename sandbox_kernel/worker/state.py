"""Checkpoint and restore of the user namespace, inside the sandbox only.

The blob is pickle and is only ever loaded by a sandbox; the host reads
nothing but the JSON manifest written beside it (names, reasons, cell).
"""

from __future__ import annotations

import fcntl
import importlib
import io
import json
import os
import pickle
import re
import types
from typing import Any

from .protocol import CHECKPOINT_FAILED_MARKER

try:  # cloudpickle carries lambdas and interactively defined objects
    import cloudpickle
except ImportError:  # pragma: no cover - the sandbox image may lack it
    cloudpickle = None

#: IPython's own names, never carried
_HIDDEN = re.compile(
    r"^(_+|_\d+|_i+\d*|_ih|_oh|_dh|In|Out|exit|quit|get_ipython|__builtins__|__builtin__|__name__|__doc__|__package__|__loader__|__spec__)$"
)

#: (type name fragment, hint) — the seeds' hint table, for dropped variables
_HINTS = (
    ("TextIOWrapper", "open file handle: reopen the file in a new cell"),
    ("BufferedReader", "open file handle: reopen the file in a new cell"),
    ("BufferedWriter", "open file handle: reopen the file in a new cell"),
    ("FileIO", "open file handle: reopen the file in a new cell"),
    ("generator", "generator: it cannot be resumed elsewhere; recreate it"),
    ("coroutine", "coroutine: recreate it"),
    ("lock", "lock: recreate it"),
    ("Lock", "lock: recreate it"),
    ("Thread", "thread: threads do not survive; start it again"),
    ("socket", "network socket: reconnect"),
    ("Connection", "connection: reconnect"),
    ("Cursor", "database cursor: reconnect and re-run the query"),
    ("Popen", "subprocess handle: start the process again"),
    ("frame", "stack frame: cannot be carried"),
)


def hint_for(value: Any, error: BaseException) -> str:
    type_name = type(value).__name__
    for fragment, hint in _HINTS:
        if fragment in type_name:
            return f"{type_name}: {hint}"
    if isinstance(value, types.LambdaType) and value.__name__ == "<lambda>":
        return "lambda: define it with def, or recreate it"
    return f"{type_name}: not picklable ({type(error).__name__}: {str(error)[:200]})"


def carried_names(user_ns: dict[str, Any], hidden: set[str]) -> list[str]:
    return [n for n in user_ns if n not in hidden and not _HIDDEN.match(n)]


def _dumps(value: Any) -> bytes:
    # Functions and classes defined in cells go by value (cloudpickle); their
    # instances by reference, so they stay instances of the replayed class.
    if (
        cloudpickle is not None
        and isinstance(value, (type, types.FunctionType))
        and getattr(value, "__module__", None) == "__main__"
    ):
        data: bytes = cloudpickle.dumps(value, protocol=5)
        return data
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        if cloudpickle is None:
            raise
        data = cloudpickle.dumps(value, protocol=5)
        return data


def write_checkpoint(
    shell: Any, directory: str, cell: int, def_names: list[str], random_state: object = None
) -> dict[str, Any]:
    """Pickle what can be pickled; name what cannot. Newer checkpoints win.
    ``random_state``: the ``random`` module's, carried too (a seeded notebook
    draws on from where it was)."""
    user_ns = shell.user_ns
    hidden = set(getattr(shell, "user_ns_hidden", {}))
    blobs: dict[str, bytes] = {}
    modules: dict[str, str] = {}
    dropped: dict[str, str] = {}
    skip_defs = set(def_names)
    for name in carried_names(user_ns, hidden):
        value = user_ns[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        if (
            name in skip_defs
            and getattr(value, "__module__", None) == "__main__"
            and isinstance(value, (type, types.FunctionType))
        ):
            continue  # replayed from its definition
        try:
            blobs[name] = _dumps(value)
        except BaseException as exc:
            dropped[name] = hint_for(value, exc)
    manifest = {"version": 1, "cell": cell, "variables": sorted(blobs), "modules": sorted(modules), "dropped": dropped}
    os.makedirs(directory, exist_ok=True)
    lock_fd = os.open(os.path.join(directory, "checkpoint.lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        current = _read_manifest(directory)
        if current is not None and int(current.get("cell", -1)) > cell:
            return current  # a newer checkpoint already landed
        carried: dict[str, Any] = {"vars": blobs, "modules": modules}
        if random_state is not None:
            carried["random"] = random_state
        blob = pickle.dumps(carried, protocol=5)
        _atomic_write(os.path.join(directory, "checkpoint.bin"), blob)
        _atomic_write(os.path.join(directory, "checkpoint.json"), json.dumps(manifest).encode())
        try:
            os.unlink(os.path.join(directory, CHECKPOINT_FAILED_MARKER))
        except FileNotFoundError:
            pass
    finally:
        os.close(lock_fd)
    return manifest


def checkpoint_failed(directory: str, exc: BaseException) -> None:
    """Say why a background checkpoint failed. On a full disk even this may
    fail: an empty marker (no data blocks) still says that it did."""
    text = f"{type(exc).__name__}: {exc}"[:500].encode()
    path = os.path.join(directory, CHECKPOINT_FAILED_MARKER)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_manifest(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, "checkpoint.json"), "rb") as fh:
            manifest: dict[str, Any] | None = json.loads(fh.read(1 << 20))
            return manifest
    except (OSError, ValueError):
        return None


def _atomic_write(path: str, data: bytes) -> None:
    """Write-then-rename; a failed write (a full disk) leaves the old file and no temp file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def restore(shell: Any, path: str | None, imports: list[str], defs: list[str]) -> dict[str, Any]:
    """Replay imports and definitions, then load the pickled namespace.

    Each piece is tried on its own so one failure drops one name, not all.
    Definitions are retried after the variables they may depend on.
    """
    ns = shell.user_ns
    failed: dict[str, str] = {}

    def run(source: str) -> str | None:
        try:
            exec(compile(source, "<restored>", "exec"), ns)
            return None
        except BaseException as exc:
            return f"{type(exc).__name__}: {exc}"

    for source in imports:
        error = run(source)
        if error:
            failed[source.strip().splitlines()[0][:80]] = error
    pending = []
    for source in defs:
        if run(source):
            pending.append(source)
    restored: list[str] = []
    if path and os.path.exists(path):
        with open(path, "rb") as fh:
            state = pickle.load(fh)
        for name, modname in state.get("modules", {}).items():
            try:
                ns[name] = importlib.import_module(modname)
                restored.append(name)
            except BaseException as exc:
                failed[name] = f"module {modname}: {type(exc).__name__}: {exc}"
        for name, blob in state.get("vars", {}).items():
            try:
                ns[name] = pickle.load(io.BytesIO(blob))
                restored.append(name)
            except BaseException as exc:
                failed[name] = f"could not be restored: {type(exc).__name__}: {exc}"
        if "random" in state:
            try:
                importlib.import_module("random").setstate(state["random"])
            except BaseException as exc:
                failed["(the random module's state)"] = f"{type(exc).__name__}: {exc}"
    for source in pending:
        error = run(source)
        if error:
            failed[source.strip().splitlines()[0][:80]] = error
    return {"restored": sorted(restored), "failed": failed}
