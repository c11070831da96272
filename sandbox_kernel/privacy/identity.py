"""User and session ids: validation, the default user, ids derived from notebooks.

Ids become path components of the privacy store and of workspaces on the host,
so they are a closed alphabet: 1-64 characters of ``[A-Za-z0-9._-]``, not
starting with ``.`` or ``-`` (which also rules out ``.`` and ``..``).
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re

MAX_ID_LENGTH = 64
_ID_CHARS = re.compile(r"[A-Za-z0-9._-]")
_VALID_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_STEM_MAX = 40


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def validate_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a valid id, else raise ``ValueError`` naming ``what``.

    >>> validate_id("a/b", "session_id")
    Traceback (most recent call last):
    ...
    ValueError: session_id 'a/b' is invalid: it may only contain letters, digits, '.', '_' and '-' (found '/')
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if value == "":
        raise ValueError(f"{what} is empty: it must be 1-{MAX_ID_LENGTH} characters")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(
            f"{what} {_shown(value)} is invalid: it is {len(value)} characters long, "
            f"at most {MAX_ID_LENGTH} are allowed"
        )
    bad = sorted({c for c in value if not _ID_CHARS.fullmatch(c)})
    if bad:
        found = ", ".join(repr(c) for c in bad[:5])
        raise ValueError(
            f"{what} {_shown(value)} is invalid: it may only contain letters, digits, '.', '_' and '-' (found {found})"
        )
    if value[0] in ".-":
        raise ValueError(f"{what} {_shown(value)} is invalid: it must not start with {value[0]!r}")
    assert _VALID_ID.fullmatch(value)
    return value


def sanitize_id(text: str, fallback: str, max_length: int = MAX_ID_LENGTH) -> str:
    """Turn arbitrary text into a valid id (invalid runs become ``_``)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).lstrip(".-")[:max_length]
    cleaned = cleaned.rstrip(".-") or fallback
    return validate_id(cleaned, "sanitised id")


def default_user_id() -> str:
    """The hub's user name under JupyterHub ($JUPYTERHUB_USER, set by the spawner
    for the single-user server and inherited by its kernels), else the OS user
    name, as a valid id (``uid<N>`` when the user has no name).

    Every single-user container of a hub runs as the same OS user (``jovyan``):
    with a shared store, the OS name would give all the hub's users one ratchet.
    A hub name that is not a valid id as it is (``zoé``, ``alice+x@ex.org``)
    gets its stem and 16 hex of its sha256, as a notebook's session does:
    folded alone, ``zoé`` and ``zoë`` were one user ``zo_``, and each saw the
    other's private datasets and lost network with the other's rise (an attack
    review). (Such a user's sessions get a new id: their levels carry over
    through their folders' levels, which do not depend on the user.)"""
    hub_user = os.environ.get("JUPYTERHUB_USER", "")
    if hub_user:
        return hub_user_id(hub_user)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    try:
        name = getpass.getuser()
    except Exception:  # no passwd entry, no LOGNAME/USER: containers do this
        name = ""
    return sanitize_id(name, fallback=f"uid{uid}")


#: how a hashed id ends: a name that ends so is hashed too, or a user could
#: take the name another user's name was hashed to
_HASHED = re.compile(r"-[0-9a-f]{16}\Z")


def hub_user_id(name: str) -> str:
    """The id of a hub user name: the name itself when it is a valid id (and
    does not end as a hashed one), else ``<stem>-<16 hex of sha256(name)>``:
    no two names share one."""
    if _VALID_ID.fullmatch(name) and not _HASHED.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    stem = sanitize_id(name, fallback="hub-user", max_length=_STEM_MAX)
    return validate_id(f"{stem}-{digest}", "user_id")


def normalise_notebook_path(path: str) -> str:
    """The absolute, symlink-free form of a notebook path (relative to the cwd)."""
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def session_id_for_notebook(path: str | os.PathLike[str] | None) -> str:
    """A stable session id for a notebook: ``<stem>-<16 hex of sha256(path)>``.

    The same notebook (by its normalised absolute path, see
    :func:`normalise_notebook_path`) always gets the same id, so a kernel
    restart or a second kernel on it shares the session and its privacy level.
    Different paths get different ids. Renaming or moving a notebook gives it a
    new session.
    """
    if path is None:
        raise ValueError("notebook path is missing: a session id needs the notebook's path")
    raw = os.fspath(path)
    if not isinstance(raw, str):
        raise ValueError(f"notebook path must be text, got {type(raw).__name__}")
    if not raw.strip():
        raise ValueError("notebook path is empty: a session id needs the notebook's path")
    if "\x00" in raw:
        raise ValueError(f"notebook path {_shown(raw)} is invalid: it contains a NUL byte")
    normalised = normalise_notebook_path(raw)
    digest = hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    base = os.path.basename(normalised)
    stem = base[: -len(".ipynb")] if base.lower().endswith(".ipynb") else os.path.splitext(base)[0]
    stem = sanitize_id(stem, fallback="notebook", max_length=_STEM_MAX)
    return validate_id(f"{stem}-{digest}", "session_id")
