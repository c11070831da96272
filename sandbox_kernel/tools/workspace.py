"""Where an agent session lives on the host, and confinement of the paths an agent gives.

Layout under the data dir (``$SANDBOX_KERNEL_DATA_DIR`` or
``<jupyter data dir>/sandbox_kernel``)::

    workspaces/<user_id>/<session_id>/     mounted read-write at /workspace
    sessions/<user_id>/<session_id>/       host-only: notebook.json, state/ (checkpoints)

The notebook file lives outside the workspace on purpose: cell code can write
anything in /workspace, and must not be able to forge the notebook record.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path, PurePosixPath

from ..privacy import default_data_dir, validate_id
from .notebook import unicode_problem

IN_WORKSPACE = "/workspace"


class WorkspacePathError(ValueError):
    """A path given by the agent is invalid or points outside its workspace."""


def data_dir() -> Path:
    return default_data_dir()


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def workspace_dir(user_id: str, session_id: str, root: Path | None = None) -> Path:
    validate_id(user_id, "user_id")
    validate_id(session_id, "session_id")
    return _private_dir((root or data_dir()) / "workspaces" / user_id / session_id)


def session_dir(user_id: str, session_id: str, root: Path | None = None) -> Path:
    validate_id(user_id, "user_id")
    validate_id(session_id, "session_id")
    return _private_dir((root or data_dir()) / "sessions" / user_id / session_id)


def resolve_agent_path(workspace: Path, path: str, *, must_exist: bool = False) -> Path:
    """Translate a path as the agent sees it (``/workspace/x``, ``x``, ``./x``)
    into the host path inside ``workspace``; refuse anything that leaves it.

    Refused: empty paths, NUL bytes, invalid Unicode, control and format
    characters (:func:`unreadable_character`), absolute paths outside
    ``/workspace``, ``..`` components that climb out, and symlinks (anywhere
    on the path) that resolve outside the workspace.
    """
    if not isinstance(path, str):
        raise WorkspacePathError(f"path must be a string, got {type(path).__name__}")
    if not path.strip():
        raise WorkspacePathError("path is empty: give a path inside /workspace, e.g. 'results/out.ipynb'")
    if "\x00" in path:
        raise WorkspacePathError("path contains a NUL byte")
    if len(path) > 4096:
        raise WorkspacePathError(f"path is too long ({len(path)} characters, at most 4096)")
    problem = unicode_problem(path) or unreadable_character(path)
    if problem:
        raise WorkspacePathError(f"path {path!r} {problem}")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(IN_WORKSPACE)
        except ValueError:
            raise WorkspacePathError(
                f"path {path!r} is outside the workspace: absolute paths must start with {IN_WORKSPACE}/"
            ) from None
    depth = 0
    for part in pure.parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                raise WorkspacePathError(f"path {path!r} climbs out of the workspace with '..'")
        elif part not in (".", ""):
            depth += 1
    root = workspace.resolve()
    candidate = root.joinpath(*pure.parts) if pure.parts else root
    # resolve() follows every symlink that exists on the path, including the last one
    resolved = Path(os.path.realpath(candidate))
    if resolved != root and root not in resolved.parents:
        raise WorkspacePathError(f"path {path!r} leads outside the workspace (through a symlink)")
    if must_exist and not resolved.exists():
        raise WorkspacePathError(f"path {path!r} does not exist in the workspace")
    return resolved


#: character categories refused in an agent's path: controls (ESC starts the
#: sequences a terminal obeys: OSC 52 sets its clipboard), format characters
#: (the bidirectional overrides show a name in another order than it is;
#: zero-width ones make two names look alike) and line or paragraph separators
_UNREADABLE = {"Cc": "control", "Cf": "format", "Zl": "line separator", "Zp": "paragraph separator"}
#: names of the controls Unicode leaves unnamed that a path most likely holds
_CONTROL_NAMES = {"\x1b": "ESCAPE", "\x07": "BELL", "\t": "TAB", "\n": "LINE FEED", "\r": "CARRIAGE RETURN"}


def unreadable_character(path: str) -> str:
    """Why ``path`` cannot be shown as it is, or "": the first control, format
    or separator character in it. Such a name reached the terminal showing the
    agent's transcript in the export's answer, and a host file was created
    with it (an attack review)."""
    for index, char in enumerate(path):
        kind = _UNREADABLE.get(unicodedata.category(char))
        if kind is not None:
            name = unicodedata.name(char, "") or _CONTROL_NAMES.get(char, "")
            named = f" ({name})" if name else ""
            return (
                f"holds the {kind} character U+{ord(char):04X}{named} at character {index}: "
                "use printable characters only in a path"
            )
    return ""


def agent_view(workspace: Path, host_path: Path) -> str:
    """The path the agent knows for a host path inside the workspace."""
    rel = host_path.resolve().relative_to(workspace.resolve())
    return str(PurePosixPath(IN_WORKSPACE) / rel.as_posix()) if rel.parts else IN_WORKSPACE
