"""The host's list of configured private dataset sources.

Why: a private dataset (``SandboxKernel.private_datasets``,
``ToolsConfig.private_datasets``) is mounted at ``/private/<name>`` only into
sandboxes without network. Its source, though, is a host file or folder that
may lie in a workspace (``'data/hr.csv'`` next to the notebook is the natural
configuration): a PUBLIC sandbox with network mounting that folder read the
dataset at ``/workspace/data/hr.csv``, and so did every other kernel or agent
tool whose workspace held it, configured with the dataset or not.

So every host process whose configuration names a dataset records its source
here (:func:`register`, from the engine's ``Ratchet``), and every sandbox start
hides each recorded source inside its workspace, and refuses a workspace that
lies inside one (``engine/workspace_policy.py``). The list is kept like the
stores' (``privacy/store_registry.py``, whose machinery it shares): one file
per source under ``<default data dir>/datasets``, which every sandbox hides,
holding the source's resolved absolute path. An entry whose source has been
gone for ``STALE_AFTER`` since it was last registered is removed; reading
never raises.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import store_registry

#: the registry's folder inside the default data dir
REGISTRY = "datasets"


def registry_dir() -> Path:
    """``<default data dir>/datasets`` (read from the environment now)."""
    from .store import default_data_dir

    return default_data_dir() / REGISTRY


def register(source: Path) -> None:
    """Record the dataset source ``source`` (made absolute and resolved).
    Never raises: a registry that cannot be written is logged once; the
    session configuring the dataset still hides it from its own sandboxes."""
    path = os.path.realpath(os.path.abspath(os.fspath(source)))
    folder = registry_dir()
    store_registry.record(
        folder,
        path,
        f"could not record the private dataset source {path} in {folder} ({{reason}}): the sandboxes of other "
        "kernels and agent tools whose workspace contains it will not hide it",
    )


def registered_sources() -> list[Path]:
    """The recorded sources that exist (a link counts too). Bad entries are
    logged once per problem and process and skipped; never raises."""
    folder = registry_dir()
    entries, problems = store_registry._entries(folder)
    for problem in problems:
        store_registry._say_once(logging.WARNING, problem)
    live = []
    for name, source in entries:
        if os.path.lexists(source):
            live.append(source)
        else:
            store_registry._remove_if_stale(folder / name)
    return live


__all__ = ["REGISTRY", "register", "registered_sources", "registry_dir"]
