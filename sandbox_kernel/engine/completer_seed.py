"""Caches made on the host for sandboxes: jedi's parser cache, so that a
sandbox's first Tab is quick, and matplotlib's font list, so that its first
plot is.

jedi parses the builtins' stubs before it can answer any completion, and
keeps what parso parsed as pickles under ``~/.cache/jedi``. On the host
that cache fills once and stays; in a sandbox ``$HOME`` is a fresh ``/tmp``,
so every new sandbox parsed the stubs again: its first completion took about
2.5 s against ipykernel's 0.6-0.8 s.

The seed is the cache an empty completion leaves, made once per installation
(Python, jedi and parso versions) by a host process that runs jedi with an
empty namespace in isolated mode: it reads only the installation's own files
and runs nothing of any notebook. Sandboxes get it read-only, and the worker
copies it into its own ``/tmp`` before jedi starts (``warmup.warm_completer``).

matplotlib scans every font of the system to make its font list, once per
cache folder; a session's is in its state folder, so that was once per
session (0.15 s of the first plot with the 38 font files here, seconds and a
"building the font cache" warning with the hundreds of a desktop). The seed
holds the list made with an empty home (the system's fonts only, the ones a
sandbox sees), when matplotlib is installed; the worker copies it into the
session's cache before the first cell (``warmup.copy_font_list``).
matplotlib reads it as JSON whose objects it rebuilds field by field, never
as a pickle.

Where it lives matters more than what it holds: parso loads these files with
``pickle``, so a seed a sandbox could write would run that sandbox's code in
every later sandbox, past the ratchet. It is kept under ``sys.prefix`` (or
the data dir when that is not writable), both places the workspace policy
never lets a sandbox write, never under a cache dir of the home. Sessions
never share a writable cache: each sandbox's copy dies with its ``/tmp``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path

from ..worker.protocol import COMPLETER_SEED_ENV as SEED_ENV
from . import owned_dirs

#: where a sandbox sees the seed
IN_COMPLETER_SEED = "/.sandbox_kernel/completer-seed"

#: what the host runs to fill the seed: the worker's own warm-up (an attribute
#: and a global name, each in an empty namespace)
_FILL = (
    "import jedi\njedi.Interpreter('int.real', [{}]).complete()\njedi.Interpreter('value_of', [{}]).complete()\n"
    "try:\n    import matplotlib\nexcept ImportError:\n    pass\nelse:\n    import matplotlib.font_manager\n"
)
_BUILD_TIMEOUT = 120.0

_log = logging.getLogger(__name__)
_started = threading.Event()


@functools.lru_cache(maxsize=1)
def _key() -> str | None:
    """Names the installation the cache was made for (None without jedi).
    Kept for the process: the metadata lookups cost about 3 ms, and
    :func:`find` runs at every sandbox start and every completion."""
    try:
        versions = f"jedi {metadata.version('jedi')} parso {metadata.version('parso')}"
    except metadata.PackageNotFoundError:
        return None
    try:
        versions += f" matplotlib {metadata.version('matplotlib')}"
    except metadata.PackageNotFoundError:
        pass
    text = f"{os.path.realpath(sys.executable)}|{sys.version}|{versions}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def roots() -> list[Path]:
    """Where a seed may live, in order of preference."""
    from ..privacy.store import default_data_dir

    return [Path(sys.prefix) / "share" / "sandbox_kernel" / "completer-seed", default_data_dir() / "completer-seed"]


def find() -> Path | None:
    """The seed of this installation, if one was made."""
    key = _key()
    if key is None:
        return None
    for root in roots():
        if (root / key / "jedi").is_dir():
            return root / key
    return None


def build() -> Path | None:
    """Make the seed in the first writable root (a no-op when it exists).

    Made in a temporary folder and renamed into place, so a reader never sees
    half a seed and two kernels building at once both end with one."""
    key = _key()
    if key is None:
        return None
    found = find()
    if found is not None:
        return found
    for root in roots():
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o755)
            work = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        except OSError:
            continue
        try:
            return _fill(work, root / key)
        finally:
            owned_dirs.remove_tree(work)
    return None


def _fill(work: Path, target: Path) -> Path | None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work),  # empty: only the system's fonts, as a sandbox sees them
        "XDG_CACHE_HOME": str(work),
        "XDG_DATA_HOME": str(work),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "MPLBACKEND": "agg",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _FILL],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_BUILD_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _log.info("no completion cache for sandboxes: %s", exc)
        return None
    if done.returncode != 0 or not (work / "jedi").is_dir():
        _log.info("no completion cache for sandboxes: %s", done.stderr.decode(errors="replace")[-300:])
        return None
    for path in [work, *work.rglob("*")]:  # only the caches, readable by a sandbox's uid, writable by none
        if path.is_file() and not _kept(path.relative_to(work)):
            path.unlink()  # parso's lock, matplotlib's config: each sandbox's copy keeps its own
        else:
            path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        work.rename(target)
    except OSError:  # another kernel made it meanwhile
        return find()
    return target


def _kept(relative: Path) -> bool:
    """jedi's pickles and matplotlib's font list."""
    if relative.parts[0] == "jedi":
        return relative.suffix == ".pkl"
    return (
        relative.parts[0] == "matplotlib"
        and len(relative.parts) == 2
        and relative.name.startswith("fontlist-")
        and relative.suffix == ".json"
    )


def build_in_background() -> None:
    """Start :func:`build` in a thread, once per process, unless the seed
    exists; the sandboxes started after it ends get it. Once: a build that
    failed (no writable root, a broken jedi) is not retried at every Tab."""
    if _started.is_set() or find() is not None:
        return
    _started.set()
    threading.Thread(target=build, name="completer-seed", daemon=True).start()


__all__ = ["IN_COMPLETER_SEED", "SEED_ENV", "build", "build_in_background", "find", "roots"]
