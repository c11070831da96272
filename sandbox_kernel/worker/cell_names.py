"""Cells are named as ipykernel names them: ``/tmp/ipykernel_<pid>/<hash>.py``.

Warnings, logging records, ``inspect``'s "File:", pdb and ``co_filename``
show that name under ipykernel. IPython's own ``<ipython-input-N-…>`` reads
differently, and the inspector joins it to the working directory into a
path that cannot exist (``/workspace/<ipython-input-1-…>``). The hash is
ipykernel's (murmur2 of the cell's source), so the same code gets the same
name as there, which caches keyed on it rely on (joblib maps
``ipykernel_<pid>/<hash>.py`` to one name across kernels). Tracebacks still
say ``Cell In[N]``: IPython maps the name back to the cell's number.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from collections.abc import Callable
from typing import Any

from IPython.core.compilerop import CachingCompiler


@functools.cache
def _ipykernels_hash() -> Callable[[str], int] | None:
    """ipykernel's own hash of a cell, read from its ``compiler`` module alone:
    importing ``ipykernel.compiler`` would load the ``ipykernel`` package
    (jupyter_client, zmq: about 160 ms and megabytes in every sandbox), and
    this module needs none of it. None without ipykernel (a Docker image may
    lack it): cells keep IPython's names there."""
    try:
        spec = importlib.util.find_spec("ipykernel")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(next(iter(spec.submodule_search_locations)), "compiler.py")
        module_spec = importlib.util.spec_from_file_location("sandbox_kernel_worker._ipykernel_compiler", path)
        if module_spec is None or module_spec.loader is None:
            return None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        murmur, seed = module.murmur2_x86, module.get_tmp_hash_seed()
    except Exception:  # an ipykernel whose compiler module changed: IPython's names
        return None
    return lambda code: int(murmur(code, seed))


@functools.cache
def _folder() -> str:
    return os.path.join(tempfile.gettempdir(), f"ipykernel_{os.getpid()}")


class CellNames(CachingCompiler):
    """IPython's caching compiler with ipykernel's cell names.

    ipykernel puts its process id in the folder's name; here every cell runs
    in a process of its own, so the id is the first worker process's, and a
    cell's name stays the same for the session's sandbox, as under ipykernel
    for the kernel's life. IPython makes a new compiler for each cell of a
    ``%run`` notebook or ``.ipy`` file: it finds the same hash and folder
    (both made once, when the worker's shell is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hash = _ipykernels_hash()
        self._folder = _folder()

    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        if self._hash is None:
            return str(super().get_code_name(raw_code, transformed_code, number))
        named = os.environ.get("IPYKERNEL_CELL_NAME")  # ipykernel's override, for tests of the debugger
        return named or os.path.join(self._folder, f"{self._hash(raw_code)}.py")
