"""The workspace policy: a sandbox never writes what a host program later runs,
loads as config or trusts.

The workspace (the notebook's folder) is mounted read-write at ``/workspace``.
When that folder is, or contains, a place where host programs look for code or
configuration (the home with its dotfiles, a Jupyter config dir, a venv, a git
repository...), a cell could plant code that the host runs later: at the next
kernel start, the next shell, the next ``git commit``. This module decides, on
the host and before each sandbox starts:

- **refused** workspaces (``/``, a folder containing a home, a folder inside a
  protected place such as ``~/.jupyter`` or site-packages);
- **masks** mounted over the workspace: *hidden* (secrets: an empty read-only
  tmpfs or ``/dev/null``) and *read-only* (config and code);
- **the home rule**: a workspace that IS a home keeps its top level read-only
  and binds each existing, non-protected top-level entry read-write over it, so
  the sandbox cannot create, delete or rename dotfiles but the user's own files
  and folders stay readable and writable.

:func:`collect_protected_places` reads the host (environment, ``sys.path``,
Jupyter paths); :func:`plan_workspace` is a pure decision over those places and
a bounded scan of the workspace; :func:`workspace_mounts` turns a plan into
:class:`~sandbox_kernel.sandbox.base.BindMount` entries (``kind="hide"`` for
hidden ones) that every backend applies after the workspace mount.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import site
import stat
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..sandbox.base import BindMount
from . import owned_dirs

log = logging.getLogger("sandbox_kernel.workspace")
_said_lock = threading.Lock()
#: places already logged as holding a home (said once per process, not at every start)
_said: set[Path] = set()

#: the setting that points a kernel at another folder (named in every refusal)
WORKSPACE_SETTING = "--SandboxKernel.workspace=/path/to/a/project/folder"

#: secrets in a home: hidden (not even readable) when the home is in a workspace
HOME_SECRETS: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".config/gcloud",
    # token stores as common (reading is enough to steal them)
    ".pypirc",
    ".npmrc",
    ".config/gh",
    ".config/hub",
    ".password-store",
    ".vault-token",
    ".kaggle",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
)
#: config and code places in a home: read-only when the home is in a workspace
HOME_CONFIG: tuple[str, ...] = (
    ".jupyter",
    ".ipython",
    ".local",
    ".config",
    ".bashrc",
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".inputrc",
    ".pythonrc.py",
    ".gitconfig",
    ".condarc",
    ".xinitrc",
    ".xsession",
    ".pam_environment",
    ".curlrc",
    ".wgetrc",
)
#: non-dot entries at the top of a home that hold programs the user runs (on PATH,
#: or Python/conda installations): never bound writable under the home rule
HOME_TOOL_DIRS: frozenset[str] = frozenset(
    {
        "bin",
        "go",
        "snap",
        "miniconda3",
        "anaconda3",
        "miniforge3",
        "mambaforge",
        "micromamba",
    }
)
#: directories whose content a host tool trusts and executes (hooks, config)
REPO_DIRS: tuple[str, ...] = (".git", ".hg")
#: files and folders at the top of a repository's work tree that ``git commit``
#: runs through a hook manager (pre-commit, husky, lefthook): the hook in
#: ``.git/hooks`` (read-only) only calls the manager, which runs what these
#: say. Read-only like ``.git`` when they exist; a missing one is not created.
HOOK_CONFIGS: tuple[str, ...] = (
    ".pre-commit-config.yaml",
    ".pre-commit-config.yml",
    ".husky",
    "lefthook.yml",
    "lefthook.yaml",
    ".lefthook.yml",
    ".lefthook.yaml",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    ".lefthook-local.yml",
    ".lefthook-local.yaml",
    ".lefthook",
    ".lefthook-local",
    ".overcommit.yml",
)
#: a directory holding this file is a Python virtual environment
VENV_MARKER = "pyvenv.cfg"
#: the bounded scan for repositories and venvs inside a workspace: depth below
#: the workspace top, and directory entries looked at in total. A huge folder
#: is not walked to the end (start-up must stay quick); what lies beyond the
#: bounds is not protected (docs/security.md, "Workspace policy").
SCAN_DEPTH = 4
SCAN_ENTRIES = 20_000
#: directory names the scan does not descend into (big, and never repositories)
SCAN_SKIP = frozenset({"node_modules", "__pycache__", ".cache", ".tox", ".mypy_cache", ".pytest_cache"})

#: the most masks one workspace gets. Each is a mount: bwrap refuses more
#: than 9000 arguments (three a mount), and a cell can plant thousands of
#: ``.git`` folders. Past it, folders holding them are made read-only as a
#: whole (:func:`_collapse`), and at worst the whole workspace.
MAX_MASKS = 500
#: hard links looked for (:func:`_aliased`): entries of one ``.git/hooks``, files in all
ALIAS_HOOKS = 64
ALIAS_FILES = 2_000
#: bytes of a repository's ``.git/config`` read for ``core.hooksPath``, and of
#: all repositories' configs together (past it, the workspace is read-only)
CONFIG_BYTES = 1 << 20
CONFIG_BUDGET = 16 << 20
#: repositories whose hooks' places are looked for one by one (more: the
#: workspace is read-only, see :func:`_collapse`)
MAX_REPOS = 2_000

#: shared temporary and runtime folders: every user and program makes its own
#: folders there, and so does this host (each session's egress proxy socket
#: in ``/tmp/sk-egress-*``, a second kernel's state in ``$TMPDIR/sandbox-kernel-*``):
#: a workspace that is or holds one would hand them to a sandbox
SHARED_TEMP: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run", "/var/lock", "/run/lock")
#: runtime folders (sockets of the user's services): not even a folder inside is a workspace
RUNTIME: tuple[str, ...] = ("/run", "/var/run")

HIDE = "hide"
READONLY = "readonly"
#: a folder on the way from the workspace to a private dataset source, bound
#: read-write onto itself: a mount point cannot be renamed or removed, so a
#: sandbox cannot move the source away from the path every later sandbox hides
PIN = "pin"


class WorkspaceRefused(ValueError):
    """This folder cannot be a sandbox's workspace (the message says why and what to set)."""


@dataclass(frozen=True)
class ProtectedPlaces:
    """Host paths (absolute, resolved) that no sandbox may write.

    ``hidden`` ones hold secrets and are not even readable from a sandbox;
    ``readonly`` ones hold code and config. ``homes`` are the user's home
    directories (a workspace may be a home: the home rule applies). A workspace
    strictly inside one of ``allowed_roots`` (the agent tools' own workspaces,
    which live in the data dir) is accepted although it lies in a protected place.
    """

    homes: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    readonly: tuple[Path, ...] = ()
    allowed_roots: tuple[Path, ...] = ()
    #: ``sys.path`` entries and editable project folders: read-only when inside a
    #: workspace; a workspace equal to one is refused, a workspace inside one only
    #: when it lies in a package the host may import (``root/<pkg>`` with an
    #: ``__init__.py``, or any folder of site-packages; packages already imported
    #: are ``readonly`` places). A ``notebooks/`` folder of a project installed in
    #: editable mode is fine: the sandbox can only add modules under a name the
    #: host does not import.
    import_roots: tuple[Path, ...] = ()
    #: private dataset sources (files or folders; ``privacy/dataset_registry.py``):
    #: hidden from every sandbox where a workspace holds them, reachable only at
    #: ``/private/<name>`` of a sandbox without network; a workspace inside one is refused
    private_sources: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Mask:
    """One protected host path inside the workspace and how it is masked."""

    path: Path
    kind: str  # HIDE | READONLY | PIN
    #: a missing directory the host creates (empty, 0700) so a mount can cover it
    create: bool = False


@dataclass(frozen=True)
class WorkspacePlan:
    """What :func:`plan_workspace` decided for one workspace."""

    workspace: Path
    masks: tuple[Mask, ...] = ()
    #: the workspace is a home: its top level is read-only
    home_rule: bool = False
    #: under the home rule, the top-level entries bound read-write
    writable_entries: tuple[Path, ...] = ()
    #: one-line notes for the user (shown once, in the first cell's output)
    notes: tuple[str, ...] = ()
    #: whether the bounded scan stopped before the end of the folder
    scan_truncated: bool = False
    #: the whole workspace is read-only (more protected places than
    #: MAX_MASKS even folder by folder); ``home_rule`` is then set too, with
    #: no writable entry, so every consumer of the plan mounts it read-only
    read_only: bool = False


# ---------------------------------------------------------------- the host's places


def _abs(path: str | os.PathLike[str] | None) -> Path | None:
    """``path`` made absolute and resolved, or None for empty values."""
    if path is None or str(path) == "":
        return None
    try:
        return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
    except (OSError, ValueError):
        return None


def _homes() -> list[Path]:
    homes: list[Path] = []
    try:
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    if os.environ.get("HOME"):
        homes.append(Path(os.environ["HOME"]))
    return [p for p in (_abs(h) for h in homes) if p is not None]


def _editable_sources() -> list[Path]:
    """Project folders of editable installs (PEP 660 finders are not on sys.path)."""
    from importlib import metadata

    found: list[Path] = []
    for dist in metadata.distributions():
        try:
            raw = dist.read_text("direct_url.json")
            info = json.loads(raw) if raw else None
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or not (info.get("dir_info") or {}).get("editable"):
            continue
        url = urlparse(str(info.get("url", "")))
        if url.scheme == "file" and url.path:
            found.append(Path(unquote(url.path)))
    return found


def _loaded_package_dirs() -> list[Path]:
    """Directories of the top-level modules this process has imported."""
    found: list[Path] = []
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        for entry in list(getattr(module, "__path__", None) or ()):
            if isinstance(entry, str):
                found.append(Path(entry))
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str) and not hasattr(module, "__path__"):
            found.append(Path(origin))
    return found


def collect_protected_places(
    store_dirs: Iterable[Path] = (),
    allowed_roots: Iterable[Path] = (),
    within: Path | None = None,
    private_sources: Iterable[Path] = (),
) -> ProtectedPlaces:
    """The protected places of this host process, read now (``within``: the
    resolved workspace they are for; registered stores of other processes that
    neither lie in it nor hold it are left out, as they cannot matter to it,
    and each costs path resolutions at every sandbox start).

    ``store_dirs`` are privacy store directories in use; with them, every store
    another host process recorded in the registry (``privacy/store_registry.py``)
    and that exists: a kernel configured with another store knows nothing of
    this one, yet its workspace may contain it. Each store is hidden with what
    the host writes beside it (high-water marks, holders, folder levels); a
    data dir's store (``<data dir>/privacy``) hides its whole data dir (other
    sessions' checkpoints, egress logs and workspaces live there; its
    ``workspaces/`` is an allowed root). A store configured on its own
    (``privacy_dir``) does not hide its parent folder, which may be any folder
    of the user (notebooks beside it still run; the store is hidden).

    A home, or a folder containing one, is never hidden as a whole: the home
    rule keeps a home's top level read-only and masks what is inside it, and a
    hidden home would swallow those masks. Such a store place is logged and
    only what lies strictly inside stays hidden.

    ``private_sources`` are the sources of the caller's own private datasets;
    with them, every source another host process recorded
    (``privacy/dataset_registry.py``) and that exists: each is hidden in any
    workspace holding it, whoever configured it (docs/security.md, "Private
    dataset sources").
    """
    from jupyter_core.paths import (
        jupyter_config_dir,
        jupyter_config_path,
        jupyter_data_dir,
        jupyter_path,
        jupyter_runtime_dir,
    )

    from ..privacy.dataset_registry import registered_sources
    from ..privacy.store import default_data_dir
    from ..privacy.store_registry import data_dir_of, registered_stores, store_places

    homes = _homes()
    hidden: list[Path | None] = []
    readonly: list[Path | None] = []
    allowed: list[Path | None] = [_abs(p) for p in allowed_roots]

    for home in homes:
        # a dotfile may be a link into a dotfiles folder: protect both paths
        hidden += [q for name in HOME_SECRETS for q in (home / name, _abs(home / name))]
        readonly += [q for name in HOME_CONFIG for q in (home / name, _abs(home / name))]
        readonly.append(home / ".ipython")
    # Jupyter: config is read-only; data (kernelspecs, extensions, notebook_secret,
    # the trust database) and runtime (connection files with HMAC keys) are hidden.
    readonly += [_abs(p) for p in [jupyter_config_dir(), *jupyter_config_path()]]
    hidden += [_abs(jupyter_data_dir()), _abs(jupyter_runtime_dir())]
    readonly += [_abs(p) for p in jupyter_path()]
    readonly.append(_abs(os.environ.get("IPYTHONDIR")))
    readonly += [_abs(site.getuserbase()), _abs(site.getusersitepackages())]

    data_dirs = [default_data_dir()]
    own = [Path(d) for d in store_dirs]
    for store in dict.fromkeys([*own, *registered_stores()]):
        if within is not None and store not in own and not _meets(store.parent, within):
            continue  # another process's store nowhere near this workspace
        hidden += [_abs(p) for p in store_places(store)]
        data = data_dir_of(store)
        if data is not None:
            data_dirs.append(data)
    for data in data_dirs:
        hidden.append(_abs(data))
        allowed.append(_abs(Path(data) / "workspaces"))
    if os.environ.get("SANDBOX_WORKSPACE_ROOT"):
        allowed.append(_abs(os.environ["SANDBOX_WORKSPACE_ROOT"]))

    # Python: everything the host imports from.
    # '' is the working directory: the host imports from it too
    import_roots = [_abs(p or os.getcwd()) for p in sys.path]
    # The kernel runs isolated (-I) and ignores PYTHONPATH, but the user's other
    # host Python processes with this environment import from it.
    import_roots += [_abs(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    import_roots += [_abs(p) for p in _editable_sources()]
    readonly += [_abs(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    readonly.append(_abs(Path(__file__).resolve().parent.parent))  # the sandbox_kernel package
    readonly += [_abs(p) for p in _loaded_package_dirs()]

    def unique(paths: Iterable[Path | None]) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(p for p in paths if p is not None))

    sources: list[Path | None] = []
    for source in dict.fromkeys([*(Path(s) for s in private_sources), *registered_sources()]):
        real = _abs(source)
        if real is None or not os.path.lexists(real):
            continue  # gone: nothing to hide (and no mount point is made in its place)
        if within is None or _inside(real, within) or _inside(within, real):
            sources.append(real)

    # A home on sys.path (a REPL started there) must not swallow the places inside
    # it: the home rule already keeps its top level (new modules) read-only.
    readonly = [p for p in readonly if p not in homes]
    hidden_t = _outermost(p for p in unique(hidden) if not _holds_a_home(p, homes))
    return ProtectedPlaces(
        homes=unique(homes),
        hidden=hidden_t,
        # a place inside another (a module inside site-packages) adds nothing
        readonly=tuple(p for p in _outermost(unique(readonly)) if not any(_inside(p, h) for h in hidden_t)),
        allowed_roots=unique(allowed),
        import_roots=tuple(p for p in unique(import_roots) if p not in homes),
        private_sources=unique(sources),
    )


def _meets(folder: Path, workspace: Path) -> bool:
    """``folder`` (where a store and what the host writes beside it live),
    resolved, is inside ``workspace`` or holds it. A store's places all share
    that folder, so one resolution decides for all of them."""
    real = _abs(folder)
    return real is not None and (_inside(real, workspace) or _inside(workspace, real))


def _holds_a_home(place: Path, homes: Iterable[Path]) -> bool:
    """``place`` is a home or a folder above one (a store or data dir put at
    ``~`` or ``/``): never hidden as a whole (see collect_protected_places)."""
    if not any(_inside(home, place) for home in homes):
        return False
    with _said_lock:
        first = place not in _said
        _said.add(place)
    if first:
        log.error(
            "%s is a home folder or contains one: it is not hidden from sandboxes as a whole (the places "
            "inside it are); move the privacy store or data dir configured there to a folder of its own",
            place,
        )
    return True


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    """``paths`` without those lying inside another one of them (order kept)."""
    ordered = list(paths)
    by_depth = sorted(ordered, key=lambda p: len(p.parts))
    kept: set[Path] = set()
    for path in by_depth:
        if not any(parent in kept for parent in path.parents):
            kept.add(path)
    return tuple(p for p in ordered if p in kept)


# ---------------------------------------------------------------- the decision


def _inside(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it (both absolute and resolved, so the
    string test is exact; walking ``path.parents`` compared Path objects and,
    over every protected place against every hidden one, cost most of a
    sandbox start's 30 ms policy scan)."""
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def _shared_places() -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The shared temporary and runtime folders of this host (resolved), and
    the runtime ones among them (a workspace may not even lie inside those)."""
    runtime = [*RUNTIME, os.environ.get("XDG_RUNTIME_DIR")]
    shared = [*SHARED_TEMP, tempfile.gettempdir(), *owned_dirs.bases(), *runtime]
    resolved = tuple(dict.fromkeys(p for p in map(_abs, shared) if p is not None))
    return resolved, tuple(p for p in map(_abs, runtime) if p is not None)


def _check_shared(workspace: Path) -> None:
    """Refuse a workspace that is or holds a shared temporary or runtime
    folder, or is world-writable with the sticky bit (a ``/tmp``-like folder
    of its own). Why: other sessions' host-owned folders live there (each
    egress proxy's socket, a second kernel's state), and a private kernel
    whose workspace was ``/tmp`` sent data out through a public session's
    proxy. A folder strictly inside ``/tmp`` is fine (its own content only)."""
    shared, runtime = _shared_places()
    for place in shared:
        inside_runtime = place in runtime and _inside(workspace, place)
        if _inside(place, workspace) or inside_runtime:
            what = "is" if place == workspace else "lies inside" if inside_runtime else "contains"
            raise WorkspaceRefused(
                f"the workspace {workspace} {what} the shared temporary or runtime folder {place}, where "
                f"other programs and other sandbox sessions keep their own folders and sockets (the egress "
                f"proxies of other sessions among them): a sandbox would reach them. Open the notebook from "
                f"a project folder (a folder inside {tempfile.gettempdir()} is fine) or set {WORKSPACE_SETTING}"
            )
    try:
        mode = os.stat(workspace).st_mode
    except OSError:
        return
    if mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        raise WorkspaceRefused(
            f"the workspace {workspace} is writable by every user with the sticky bit set (mode "
            f"{stat.S_IMODE(mode):o}), like /tmp: a shared temporary folder where other users and programs "
            f"keep their own folders and sockets, which a sandbox would reach. Open the notebook from a "
            f"project folder, make this one private (chmod 755 {workspace}) or set {WORKSPACE_SETTING}"
        )


def check_workspace(workspace: Path, places: ProtectedPlaces) -> None:
    """Raise :class:`WorkspaceRefused` when ``workspace`` may not be mounted at all."""
    if workspace == Path("/"):
        raise WorkspaceRefused(
            f"the workspace is '/', the whole file system: a sandbox would reach every file and "
            f"configuration of the host. Open the notebook from a project folder or set {WORKSPACE_SETTING}"
        )
    _check_shared(workspace)
    for source in places.private_sources:
        if _inside(workspace, source):
            what = "is" if source == workspace else "lies inside"
            raise WorkspaceRefused(
                f"the workspace {workspace} {what} the private dataset source {source}: a sandbox with "
                f"network would read the private data. Configured datasets reach sandboxes only at "
                f"/private/<name>, once they have no network; open the notebook from a folder that does "
                f"not lie in the dataset or set {WORKSPACE_SETTING}"
            )
    for home in places.homes:
        if home != workspace and workspace in home.parents:
            raise WorkspaceRefused(
                f"the workspace {workspace} contains the home directory {home}: a sandbox could write "
                f"the configuration that programs run for that user. Use a project folder instead: {WORKSPACE_SETTING}"
            )
    if any(root != workspace and root in workspace.parents for root in places.allowed_roots):
        return
    for root in places.import_roots:
        if root in places.homes or not _inside(workspace, root):
            continue
        first = workspace.relative_to(root).parts[:1]
        if not first or root.name in ("site-packages", "dist-packages") or (root / first[0] / "__init__.py").exists():
            what = "is" if root == workspace else f"lies in an importable package of {root}, which is"
            raise WorkspaceRefused(
                f"the workspace {workspace} {what} on the kernel's Python import path (sys.path or an "
                f"editable install): a sandbox writing there could change code the host imports. Open "
                f"the notebook from a folder that is not a Python package or set {WORKSPACE_SETTING}"
                + (
                    " (an old kernelspec puts the notebook's folder on sys.path: reinstall it with "
                    "'python -m sandbox_kernel install')"
                    if root == workspace
                    else ""
                )
            )
    for place in (*places.hidden, *places.readonly):
        if place in places.homes:
            continue
        if _inside(workspace, place):
            what = "is" if place == workspace else f"lies inside {place}, which is"
            raise WorkspaceRefused(
                f"the workspace {workspace} {what} a place where the host keeps code, configuration or "
                f"secrets (Jupyter/IPython config or data, Python packages, the privacy store): a sandbox "
                f"writing there could make the host run its code. Move the notebook to a project folder "
                f"or set {WORKSPACE_SETTING}"
            )


def _lexists(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


#: runtime folders of other kernels hidden in one workspace (a kernel's TMPDIR
#: holds one per live kernel; see plan_workspace)
MAX_RUNTIME_HIDES = 32
#: the names of the host's own runtime folders (``owned_dirs.make``: a prefix,
#: the kernel's pid, mkdtemp's suffix): another kernel's state and sockets
_RUNTIME_NAME = re.compile(r"(?:sandbox-kernel-|sk-egress-)[0-9]+-[A-Za-z0-9_]{8}\Z")


def _runtime_folder(entry: os.DirEntry[str]) -> bool:
    """A runtime folder of a kernel of this host's user: by name, owner and a
    private mode. Another kernel's TMPDIR may lie anywhere (in a workspace
    too): its folders hold that session's state (checkpoints of private
    data, granted to the sandboxes' uid) and egress socket."""
    if not _RUNTIME_NAME.match(entry.name):
        return False
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _scan(
    workspace: Path, skip: set[Path], depth: int, limit: int, runtime: list[Path] | None = None
) -> tuple[list[Path], bool]:
    """Repositories (``.git``, ``.hg``, a ``.git`` file) and venvs in the workspace, breadth first,
    at most ``depth`` levels down and ``limit`` entries looked at. Symlinks are
    never followed. Returns the found directories and whether the scan was cut;
    ``runtime`` gets the host's runtime folders met (:func:`_runtime_folder`)."""
    found: list[Path] = []
    queue: deque[tuple[Path, int]] = deque([(workspace, 0)])
    seen = 0
    while queue:
        folder, level = queue.popleft()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    return found, True
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        if entry.name == VENV_MARKER and folder != workspace and entry.is_file(follow_symlinks=False):
                            found.append(folder)
                        elif entry.name == ".git" and entry.is_file(follow_symlinks=False):
                            # a submodule's or worktree's pointer to its git dir: rewritten,
                            # it would send git (run in the superproject) to a planted one
                            found.append(Path(entry.path))
                        continue
                except OSError:
                    continue
                path = Path(entry.path)
                if entry.name in REPO_DIRS:
                    found.append(path)
                    continue
                if runtime is not None and _runtime_folder(entry):
                    runtime.append(path)
                    continue
                if path in skip or entry.name in SCAN_SKIP or level + 1 > depth:
                    continue
                queue.append((path, level + 1))
    return found, False


class _OverBudget(Exception):
    """The repositories' configs together are larger than CONFIG_BUDGET."""


def _hooks_path(git_dir: Path, budget: list[int] | None = None) -> str | None:
    """``core.hooksPath`` of a repository's own config (``git config`` syntax:
    sections, case-insensitive keys, an optionally quoted value), or None.
    ``budget``: the bytes all configs may still take (raises :class:`_OverBudget`)."""
    try:
        with open(git_dir / "config", encoding="utf-8", errors="replace") as config:
            text = config.read(CONFIG_BYTES)
    except OSError:
        return None
    if budget is not None:
        budget[0] -= len(text)
        if budget[0] < 0:
            raise _OverBudget
    section, found = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line[1 : line.find("]")].strip().lower() if "]" in line else ""
            continue
        key, sep, value = line.partition("=")
        if section == "core" and sep and key.strip().lower() == "hookspath":
            value = value.strip()
            if value.startswith('"'):
                value = value[1:].partition('"')[0]
            else:  # a comment may follow an unquoted value
                value = value.split("#", 1)[0].split(";", 1)[0].strip()
            found = value  # the last one wins, as in git
    return found or None


def _hook_places(repo: Path, workspace: Path, budget: list[int] | None = None) -> list[Path]:
    """The existing places in the workspace that a repository's hooks run
    besides ``.git/hooks``: its hook managers' configs (HOOK_CONFIGS, at the
    work tree's top) and the folder ``core.hooksPath`` names. Symlinks are
    left alone: masking a link's target would not stop a sandbox from
    replacing the link itself (docs/security.md, known limits)."""
    top = repo.parent
    candidates = [top / name for name in HOOK_CONFIGS]
    if repo.name == ".git":
        hooks = _hooks_path(repo, budget)
        if hooks:
            candidates.append(Path(os.path.expanduser(hooks)) if hooks.startswith(("/", "~")) else top / hooks)
    places = []
    for candidate in candidates:
        st = _lexists(candidate)
        if st is None or stat.S_ISLNK(st.st_mode):
            continue
        # resolved: a folder on the way may be a link a sandbox made (to a host
        # folder, which a mask would then mount into the sandbox)
        place = Path(os.path.realpath(candidate))
        if _inside(place, workspace):
            places.append(place)
    return places


def _found_places(scanned: list[Path], workspace: Path) -> list[Path]:
    """The scan's repositories and venvs with the places their hooks run
    (raises :class:`_OverBudget` when their configs are too large to read)."""
    found: list[Path] = []
    budget = [CONFIG_BUDGET]
    for repo in scanned:
        found.append(repo)
        if repo.name in REPO_DIRS:
            found += _hook_places(repo, workspace, budget)
    return found


def _aliased(masks: dict[Path, Mask]) -> list[Path]:
    """Protected files with more than one name. A mask covers a path, not the
    file: a hard link a sandbox made while the file was not yet protected (it
    appeared while a sandbox ran, or an older version did not protect it)
    still writes to it. Looked at: the masked files, and a repository's
    ``config`` and hooks."""
    files: list[Path] = []
    for path in masks:
        if len(files) >= ALIAS_FILES:
            break  # bounded: a cell can plant thousands of repositories with thousands of hooks
        if path.name == ".git":
            files.append(path / "config")
            try:
                with os.scandir(path / "hooks") as hooks:
                    for count, entry in enumerate(hooks):
                        if count >= ALIAS_HOOKS:
                            break
                        files.append(Path(entry.path))
            except OSError:
                pass
        else:
            files.append(path)
    aliased = []
    for path in files[:ALIAS_FILES]:
        st = _lexists(path)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            aliased.append(path)
    return sorted(aliased)


def plan_workspace(
    workspace: Path,
    places: ProtectedPlaces,
    *,
    scan_depth: int = SCAN_DEPTH,
    scan_entries: int = SCAN_ENTRIES,
) -> WorkspacePlan:
    """Decide the masks for ``workspace`` (absolute, resolved); raise
    :class:`WorkspaceRefused` when it cannot be used.

    Only reads the file system (``lstat``, the bounded scan); nothing is created.
    """
    workspace = Path(workspace)
    if not workspace.is_absolute():
        raise WorkspaceRefused(f"the workspace {str(workspace)!r} must be an absolute path")
    check_workspace(workspace, places)
    if (workspace / VENV_MARKER).is_file():
        raise WorkspaceRefused(
            f"the workspace {workspace} is a Python virtual environment (it has {VENV_MARKER}): a sandbox "
            f"could rewrite the programs it runs. Keep notebooks out of venvs or set {WORKSPACE_SETTING}"
        )
    home_rule = workspace in places.homes

    masks: dict[Path, Mask] = {}
    kinds_at: dict[str, str] = {}

    def add(path: Path, kind: str) -> None:
        if path == workspace or not _inside(path, workspace):
            return
        current = masks.get(path)
        if current is not None and (current.kind == HIDE or kind == PIN):
            return  # a pin never replaces a mask (a read-only or hidden mount point holds too)
        if _covered(path, workspace, kinds_at, (HIDE,)):
            return  # already hidden by a parent
        masks[path] = Mask(path, kind)
        kinds_at[str(path)] = kind

    for place in (*places.hidden, *places.private_sources):
        add(place, HIDE)
    for place in (*places.readonly, *places.import_roots):
        add(place, READONLY)
    for source in places.private_sources:
        # Each folder between the workspace and the source becomes a mount
        # point: renaming one would carry the source to a path the next
        # sandbox does not hide. Pins are added last: any other mask wins.
        for folder in source.parents:
            if folder == workspace or not _inside(folder, workspace):
                break
            add(folder, PIN)
    fixed = dict(masks)  # the host's places: few, and not of a sandbox's making
    runtime: list[Path] = []
    scanned, truncated = _scan(
        workspace, {p for p, m in masks.items() if m.kind != PIN}, scan_depth, scan_entries, runtime
    )
    # (bounded: a kernel not run as root writes as the host's user, so a cell
    # can make thousands of folders that look like runtime folders, and each
    # hide is a mount kept through the collapse below; an attack review made
    # 1,500 of them exceed bwrap's arguments)
    for path in runtime[:MAX_RUNTIME_HIDES]:
        add(path, HIDE)
        if path in masks:
            fixed[path] = masks[path]
    if len(runtime) > MAX_RUNTIME_HIDES:
        log.warning(
            "the workspace %s holds %d folders named like kernels' runtime folders: only %d are hidden",
            workspace,
            len(runtime),
            MAX_RUNTIME_HIDES,
        )
    # what the scan found and what their hooks run; None: too many to look at
    found: list[Path] | None = None
    if len(scanned) <= MAX_REPOS:
        try:
            found = _found_places(scanned, workspace)
        except _OverBudget:
            pass
    for path in found or ():
        add(path, READONLY)

    writable: list[Path] = []
    notes: list[str] = []
    if home_rule:
        protected_names = {n.split("/")[0] for n in (*HOME_SECRETS, *HOME_CONFIG)}
        try:
            with os.scandir(workspace) as listing:
                top = sorted(listing, key=lambda e: e.name)
        except OSError:
            top = []
        for entry in top:
            path = Path(entry.path)
            st = _lexists(path)
            # Dot entries at the top of a home are configuration and tool state by
            # convention (~/.cargo/bin, ~/.vim, ~/.cache/pre-commit, ~/.vscode-server
            # hold code the host runs): all read-only, not only the listed ones.
            if st is None or path in masks or entry.name in protected_names:
                continue
            if entry.name.startswith(".") or entry.name in HOME_TOOL_DIRS:
                continue
            # symlinks stay as they are (links in the read-only top level): binding
            # one would mount whatever host path it points to
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                writable.append(path)
        notes.append(
            f"the workspace {workspace} is your home folder: your files and folders in it are readable "
            f"and writable, but nothing can be created, deleted or renamed at its top level and "
            f"configuration and secret files are protected; for a fully writable folder open the "
            f"notebook from a project folder or set {WORKSPACE_SETTING}"
        )
    aliased = _aliased({p: m for p, m in masks.items() if m.kind != PIN and p not in places.private_sources})
    read_only = False
    final = _final_masks(workspace, masks, home_rule, writable)
    if found is None or len(final) + len(writable) > MAX_MASKS:
        # Too many to mount one by one (a cell planted them, or a folder of
        # many clones): their folders, or the whole workspace, read-only.
        level = _collapse(workspace, fixed, found, home_rule, writable)
        if level is None:
            read_only, home_rule, writable = True, True, []
            masks = dict(fixed)
        else:
            masks, writable = level
        final = _final_masks(workspace, masks, home_rule, writable)
        notes.append(_crowded_note(workspace, scanned, truncated, read_only, final, set(fixed)))
    if aliased:
        shown = ", ".join(str(path) for path in aliased[:5]) + (" ..." if len(aliased) > 5 else "")
        notes.append(
            f"protected files in the workspace have other names (hard links), through which a sandbox may "
            f"have been able to change them before they were protected: {shown}; find the other names with "
            f"`find {workspace} -samefile <file>`"
        )
    _check_renamable(workspace, final, set(places.hidden) | set(places.readonly), writable if home_rule else None)
    return WorkspacePlan(
        workspace=workspace,
        masks=tuple(final),
        home_rule=home_rule,
        writable_entries=tuple(writable),
        notes=tuple(notes),
        scan_truncated=truncated,
        read_only=read_only,
    )


def _covered(path: Path, workspace: Path, kinds_at: dict[str, str], kinds: tuple[str, ...]) -> bool:
    """A folder above ``path``, below ``workspace``, is masked with one of
    ``kinds`` (``kinds_at``: each mask's kind by its path as a string). One
    look-up per level of ``path``: comparing every mask with every other
    one cost 17.9 s for 4,000 planted repositories."""
    text, top = str(path), len(str(workspace))
    cut = text.rfind("/")
    while cut > top:
        text = text[:cut]
        if kinds_at.get(text) in kinds:
            return True
        cut = text.rfind("/")
    return False


def _kinds(masks: dict[Path, Mask]) -> dict[str, str]:
    return {str(path): mask.kind for path, mask in masks.items()}


def _final_masks(workspace: Path, masks: dict[Path, Mask], home_rule: bool, writable: list[Path]) -> list[Mask]:
    """The masks to mount: those no parent covers, missing folders to create,
    and under the home rule only what a writable entry needs (and secrets)."""
    final: list[Mask] = []
    writable_set = {str(p) for p in writable}
    kinds_at = _kinds(masks)
    for path, mask in sorted(masks.items(), key=lambda item: (len(item[0].parts), str(item[0]))):
        if _covered(path, workspace, kinds_at, (HIDE,)):
            continue  # a hidden parent covers it
        if mask.kind in (READONLY, PIN) and _covered(path, workspace, kinds_at, (HIDE, READONLY)):
            continue  # a read-only parent covers it
        if mask.kind == PIN and (str(path) in writable_set or _lexists(path) is None):
            continue  # a home's entry bound read-write is a mount point already; a missing one holds nothing
        if home_rule and str(workspace / path.relative_to(workspace).parts[0]) not in writable_set:
            # Under the read-only top level: read-only already, and nothing missing
            # there can be created by a sandbox. Only secrets need a mask.
            if mask.kind == HIDE and _lexists(path) is not None:
                final.append(mask)
            continue
        if _lexists(path) is None:
            if not _is_file_place(path):
                final.append(Mask(path, mask.kind, create=True))
            # a missing FILE cannot be masked without creating it (an empty rc file
            # changes what a shell reads): known limit, see docs/security.md
            continue
        final.append(mask)
    return final


def _collapse(
    workspace: Path,
    fixed: dict[Path, Mask],
    found: list[Path] | None,
    home_rule: bool,
    writable: list[Path],
) -> tuple[dict[Path, Mask], list[Path]] | None:
    """Masks for a workspace with too many protected places to mask one by
    one: the places ``found`` by the scan (repositories, venvs, their hooks'
    places) that share a folder ``level`` names below the workspace are
    replaced by that folder, read-only as a whole (one alone keeps its own
    mask), at the deepest level that stays within MAX_MASKS.
    None when no level does (or ``found`` is None: more than MAX_REPOS
    repositories, or configs past CONFIG_BUDGET, so their hooks' places are
    unknown): the whole workspace must be read-only.

    Why not refuse: the user's work stays readable, and writable outside the
    crowded folders; why not mask the first MAX_MASKS: every one left out
    would be a repository whose hooks a sandbox could rewrite."""
    if found is None:
        return None
    depth = max((len(p.relative_to(workspace).parts) for p in found), default=0)
    for level in range(depth - 1, 0, -1):
        masks = dict(fixed)
        kinds_at = _kinds(masks)
        kept = list(writable)
        groups: dict[Path, list[Path]] = {}
        for path in found:
            groups.setdefault(workspace.joinpath(*path.relative_to(workspace).parts[:level]), []).append(path)
        for folder, members in groups.items():
            if len(members) == 1 and not (home_rule and level == 1):
                folder = members[0]  # alone in its folder: masked itself, the folder stays writable
            current = masks.get(folder)
            if (current is not None and current.kind != PIN) or _covered(folder, workspace, kinds_at, (HIDE,)):
                continue  # a pin is replaced: a read-only folder cannot be renamed either
            if home_rule and level == 1:
                # a writable top-level entry of a home: no longer bound, so the
                # read-only top level covers it (one mount per target, for Docker)
                if folder in kept:
                    kept.remove(folder)
                continue
            masks[folder] = Mask(folder, READONLY)
            kinds_at[str(folder)] = READONLY
        if len(_final_masks(workspace, masks, home_rule, kept)) + len(kept) <= MAX_MASKS:
            return masks, kept
    return None


def _crowded_note(
    workspace: Path, scanned: list[Path], truncated: bool, read_only: bool, final: list[Mask], fixed: set[Path]
) -> str:
    """What the user reads when the workspace had too many places to mask."""
    shown = ", ".join(str(p.relative_to(workspace)) for p in sorted(scanned)[:5])
    count = f"{len(scanned):,}{' or more' if truncated else ''}"
    if read_only:
        what = "the whole workspace is read-only for sandboxes"
    else:
        folders = sorted(str(m.path.relative_to(workspace)) for m in final if m.path not in fixed)
        what = f"these folders are read-only for sandboxes as a whole: {', '.join(folders[:5])}" + (
            f" and {len(folders) - 5:,} more" if len(folders) > 5 else ""
        )
    return (
        f"the workspace {workspace} holds {count} git repositories or Python virtual environments "
        f"({shown}{' ...' if len(scanned) > 5 else ''}), more than the {MAX_MASKS} that can each be "
        f"protected on their own, so {what}. If a cell made them, remove them on the host (list them with "
        f"`find {workspace} -maxdepth {SCAN_DEPTH + 1} \\( -name .git -o -name {VENV_MARKER} \\)`) and "
        f"restart the kernel; or open the notebook from a folder that does not hold them ({WORKSPACE_SETTING})"
    )


def _check_renamable(workspace: Path, masks: list[Mask], by_path: set[Path], writable: list[Path] | None) -> None:
    """Refuse when a place the host uses BY PATH (config, data, runtime, the
    privacy store, the Python installation) lies below a folder a sandbox could
    rename: a mount point cannot be renamed, but its parent folder can, and the
    sandbox would then create a new folder at the old path (a planted config, a
    planted python the kernelspec runs, an empty privacy store). Safe levels: the
    workspace top (itself a mount point) and, under the home rule, the top-level
    entries (read-only, or mount points)."""
    for mask in masks:
        if mask.path not in by_path:
            continue
        parts = mask.path.relative_to(workspace).parts
        if writable is None:
            safe = len(parts) <= 1
        else:
            top = workspace / parts[0]
            safe = top not in writable or len(parts) <= 2
        if not safe:
            raise WorkspaceRefused(
                f"the workspace {workspace} holds {mask.path} (host configuration, data or Python "
                f"installation) below a folder a sandbox could rename and replace. Open the notebook "
                f"from a folder that does not contain it or set {WORKSPACE_SETTING}"
            )


_FILE_NAMES = frozenset(
    {
        ".netrc",
        ".pgpass",
        ".git-credentials",
        "notebook_secret",
        ".pypirc",
        ".npmrc",
        ".vault-token",
        "credentials",
        "credentials.toml",
        *(n for n in HOME_CONFIG if n not in (".jupyter", ".ipython", ".local", ".config")),
    }
)
_FILE_SUFFIXES = (".zip", ".egg", ".whl", ".py", ".pth")


def _is_file_place(path: Path) -> bool:
    """A protected place that is a file when it exists (never created as a directory)."""
    return path.name in _FILE_NAMES or path.suffix in _FILE_SUFFIXES


# ---------------------------------------------------------------- host side effects and mounts


def prepare(plan: WorkspacePlan) -> None:
    """Create the missing protected directories the plan masks (empty, 0700, as
    this process's user): a mount needs a mount point, and an empty config dir
    changes nothing for the programs that read it."""
    for mask in plan.masks:
        if mask.create and _lexists(mask.path) is None:
            mask.path.mkdir(parents=True, exist_ok=True, mode=0o700)


def workspace_mounts(plan: WorkspacePlan, target: str) -> list[BindMount]:
    """The workspace mount and its masks, in mount order, for ``target``."""

    def inside(path: Path) -> str:
        rel = path.relative_to(plan.workspace).as_posix()
        return f"{target.rstrip('/')}/{rel}"

    mounts = [BindMount(plan.workspace, target, readonly=plan.home_rule)]
    mounts += [BindMount(path, inside(path)) for path in plan.writable_entries]
    for mask in sorted(plan.masks, key=lambda m: (len(m.path.parts), str(m.path))):
        if mask.kind == HIDE:
            mounts.append(BindMount(mask.path, inside(mask.path), readonly=True, kind="hide"))
        elif mask.kind == PIN:
            mounts.append(BindMount(mask.path, inside(mask.path)))
        else:
            mounts.append(BindMount(mask.path, inside(mask.path), readonly=True))
    return mounts


def hide_private_sources(folder: Path, target: str, private_sources: Iterable[Path] = ()) -> list[BindMount]:
    """Masks for a host folder mounted READ-ONLY into a sandbox other than as
    its workspace (the agent tools' ``docker_read_only_mounts``): each private
    dataset source inside it, recorded or in ``private_sources``, hidden at
    ``target``'s matching path (read-only: nothing can be renamed, so no pins).
    Raises :class:`WorkspaceRefused` when ``folder`` is or lies inside one."""
    from ..privacy.dataset_registry import registered_sources

    real = Path(os.path.realpath(folder))
    masks = []
    for source in dict.fromkeys([*(Path(s) for s in private_sources), *registered_sources()]):
        place = _abs(source)
        if place is None or not os.path.lexists(place):
            continue
        if _inside(real, place):
            raise WorkspaceRefused(
                f"the folder {folder} mounted at {target} is or lies inside the private dataset source {place}: "
                f"a sandbox with network would read the private data"
            )
        if _inside(place, real):
            rel = place.relative_to(real).as_posix()
            masks.append(BindMount(place, f"{target.rstrip('/')}/{rel}", readonly=True, kind="hide"))
    return masks


def apply_policy(
    workspace: Path,
    target: str,
    store_dirs: Iterable[Path] = (),
    allowed_roots: Iterable[Path] = (),
    private_sources: Iterable[Path] = (),
) -> tuple[list[BindMount], WorkspacePlan]:
    """Everything a caller needs: collect, plan, create mount points, mounts.
    Raises :class:`WorkspaceRefused`."""
    resolved = Path(os.path.realpath(workspace))
    places = collect_protected_places(store_dirs, allowed_roots, within=resolved, private_sources=private_sources)
    plan = plan_workspace(resolved, places)
    prepare(plan)
    return workspace_mounts(plan, target), plan


__all__ = [
    "HIDE",
    "PIN",
    "READONLY",
    "Mask",
    "ProtectedPlaces",
    "WorkspacePlan",
    "WorkspaceRefused",
    "apply_policy",
    "check_workspace",
    "collect_protected_places",
    "hide_private_sources",
    "plan_workspace",
    "prepare",
    "workspace_mounts",
]
