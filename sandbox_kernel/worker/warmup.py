"""Warm-ups a standby runs while it waits for its request.

A standby shares every page with the holder until it writes to one, and each
first write is a copy-on-write fault (about 4 us here). A trivial cell's
``run_cell`` took 420 of them in a fresh fork: 2.1 ms on a 2-core VM. Running
the same machinery once before the request arrives takes them off the
request's path: 240 faults after the compiler warm-up, 50 after a whole
``run_cell`` of ``pass`` (1.2 -> 0.7 ms; 1.5 -> 0.8 ms with pandas imported).

A warm-up must be invisible. It runs none of the user's code: the transforms,
AST transformers and event callbacks a user registered are left out, and the
``run_cell`` warm-up is skipped outright when any part of the shell it goes
through is not the one the worker started with (a user who wraps
``run_code`` to time cells must see each cell once). It leaves no trace in
the shell's state: nothing is stored in history, the execution count does
not move, the last execution result is put back, and an error it might meet
is not shown. It is also skipped while a cell's tracer or profiler is set
(``sys.settrace``, ``sys.setprofile``). Audit hooks (``sys.addaudithook``)
cannot be listed, so one a cell added sees the warm-ups' ``compile`` and
``exec`` events.

One warm-up runs in the holder instead (``warm_completer``), once, for
completions: it imports jedi there, as ipykernel's first completion does in
its kernel, and runs none of the user's code either.
"""

from __future__ import annotations

import ast
import linecache
import os
import shutil
import sys
import time
from typing import Any

from .protocol import COMPLETER_SEED_ENV
from .streams import Sink

#: the transform lists of IPython's TransformerManager (plain lists, not traits)
TRANSFORM_LISTS = ("cleanup_transforms", "line_transforms", "token_transformers")

#: the shell's methods a ``run_cell`` goes through
_SHELL_METHODS = (
    "run_cell",
    "_run_cell",
    "run_cell_async",
    "transform_cell",
    "should_run_async",
    "transform_ast",
    "run_ast_nodes",
    "run_code",
    "showtraceback",
    "showsyntaxerror",
    "showindentationerror",
    "_showtraceback",
)

_started_with: tuple[Any, ...] | None = None

#: how many ``run_cell`` warm-ups this process and those it was forked from ran
#: (tests read it from a cell to know the warm-up ran)
runs = 0


def _parts(shell: Any) -> tuple[Any, ...]:
    """What a ``run_cell`` goes through, each as the function it resolves to
    (an instance or class attribute replaced by user code changes it)."""
    found: list[Any] = []
    for name in _SHELL_METHODS:
        found.append(getattr(getattr(shell, name, None), "__func__", None))
    compiler, manager, events = (
        getattr(shell, name, None) for name in ("compile", "input_transformer_manager", "events")
    )
    found += [compiler, manager, events, getattr(shell, "builtin_trap", None), getattr(shell, "display_trap", None)]
    for owner, name in ((compiler, "cache"), (compiler, "ast_parse"), (manager, "transform_cell"), (events, "trigger")):
        found.append(getattr(getattr(owner, name, None), "__func__", None))
    found.append(type(compiler).__call__)
    return tuple(found)


def remember(shell: Any) -> None:
    """Note the shell's machinery as the worker made it, before any cell ran."""
    global _started_with
    _started_with = _parts(shell)


def warm_compiler(shell: Any) -> None:
    """Run IPython's input transforms, the parser and the compiler on a
    one-line cell. Transforms a user registered are user code and are left
    out (the lists are put back before any request runs)."""
    if _user_is_watching():
        return
    manager = shell.input_transformer_manager
    saved = _keep_ipythons_transforms(manager)
    source = "x = 1\n"
    try:
        source = manager.transform_cell(source)
    except Exception:  # a warm-up never fails the standby
        pass
    finally:
        _put_back(manager, saved)
    try:
        compile(ast.parse(source), "<standby>", "exec", getattr(shell.compile, "flags", 0), dont_inherit=True)
    except Exception:
        pass


def warm_run_cell(shell: Any) -> None:
    """Run a silent ``pass`` through the shell's whole ``run_cell``: its
    runner, traps, compiler cache, AST walk and ``exec`` fault in the pages a
    real cell writes."""
    global runs
    if _started_with is None or _parts(shell) != _started_with:
        return  # user code replaced part of it: running it would run user code
    if _user_is_watching():
        return
    if getattr(shell, "ast_transformers", None) or getattr(shell, "input_transformers_post", None):
        return  # traits: emptied and refilled they would not be the same lists
    if not isinstance(getattr(shell.events, "callbacks", None), dict):
        return  # an IPython this was not written for
    manager = shell.input_transformer_manager
    events = shell.events
    saved_transforms = _keep_ipythons_transforms(manager)
    saved_callbacks = events.callbacks
    last = (shell.last_execution_result, shell.last_execution_succeeded)
    count = shell.execution_count
    streams = sys.stdout, sys.stderr
    cached = set(linecache.cache), set(getattr(shell.compile, "_filename_map", ()))
    events.callbacks = {event: [] for event in saved_callbacks}
    shell._quiet_errors = True
    sys.stdout = sys.stderr = Sink()  # this process has no other threads that print
    try:
        shell.run_cell("pass", store_history=False, silent=True)
    except Exception:
        pass
    finally:
        sys.stdout, sys.stderr = streams
        shell._quiet_errors = False
        events.callbacks = saved_callbacks
        _put_back(manager, saved_transforms)
        shell.last_execution_result, shell.last_execution_succeeded = last
        shell.execution_count = count
        _forget_source(shell, *cached)
    runs += 1


def _user_is_watching() -> bool:
    """A tracer or profiler a cell set (it stays for later cells: their
    thread is the holder's) would see the warm-ups' frames."""
    return sys.gettrace() is not None or sys.getprofile() is not None


def _forget_source(shell: Any, lines_before: set[str], names_before: set[str]) -> None:
    """The compiler caches each cell's source by name (for tracebacks and
    ``inspect``); the warm-up's ``pass`` is nobody's."""
    for name in set(linecache.cache) - lines_before:
        linecache.cache.pop(name, None)
    names = getattr(shell.compile, "_filename_map", None)
    if isinstance(names, dict):
        for name in set(names) - names_before:
            names.pop(name, None)


def _keep_ipythons_transforms(manager: Any) -> dict[str, Any]:
    saved = {name: getattr(manager, name, None) for name in TRANSFORM_LISTS}
    for name, items in saved.items():
        if isinstance(items, list):
            setattr(manager, name, [t for t in items if str(getattr(t, "__module__", "")).startswith("IPython.")])
    return saved


def _put_back(manager: Any, saved: dict[str, Any]) -> None:
    for name, items in saved.items():
        if items is not None:
            setattr(manager, name, items)


#: whether this process, or the holder it was forked from, warmed the completer
_completer_warmed = False


def warm_completer() -> bool:
    """Before the holder forks the child that answers a completion: once per
    sandbox (every later holder descends from this one), let jedi load what
    any completion needs (its grammar, the builtins' stubs), as ipykernel's
    first completion does in its one process. Done in the throw-away child
    only, it was lost with it, and every completion paid for it again
    (0.3-0.7 s with pandas loaded, against ipykernel's 20-130 ms once warm).
    The namespace it sees is empty: none of the user's objects are touched.
    True if it warmed now (a standby forked before lacks it)."""
    global _completer_warmed
    if _completer_warmed:
        return False
    _completer_warmed = True
    try:
        import jedi  # type: ignore[import-untyped]
    except Exception:  # no jedi: IPython then completes without it
        return False
    try:
        _copy_completer_seed(jedi)
    except Exception:  # a seed that cannot be copied (a full /tmp) only costs time
        pass
    try:
        # an attribute, then a global name: each loads stubs the other does not
        jedi.Interpreter("int.real", [{}]).complete()
        jedi.Interpreter("value_of", [{}]).complete()
    except Exception:  # a jedi this was not written for
        pass
    return True


def copy_font_list() -> None:
    """Start matplotlib's cache from the host's font list
    (engine/completer_seed.py), so the session's first plot does not scan
    every font of the system again. Copied where matplotlib looks
    (``$MPLCONFIGDIR``: the session's state folder, which its later
    sandboxes keep; else ``$XDG_CACHE_HOME/matplotlib`` or
    ``~/.cache/matplotlib``); a file already there is kept, and a copy that
    fails only costs that scan."""
    seed = os.environ.get(COMPLETER_SEED_ENV)
    source = os.path.join(seed or "", "matplotlib")
    if not seed or not os.path.isdir(source):
        return
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    target = os.environ.get("MPLCONFIGDIR") or os.path.join(cache, "matplotlib")
    try:
        for name in os.listdir(source):
            copy = os.path.join(target, name)
            if name.startswith("fontlist-") and name.endswith(".json") and not os.path.exists(copy):
                os.makedirs(target, exist_ok=True)
                shutil.copyfile(os.path.join(source, name), copy)
    except OSError:
        pass


def _copy_completer_seed(jedi: Any) -> None:
    """Start jedi's parser cache from the host's seed (engine/completer_seed.py):
    the builtins' stubs parsed once per installation, not once per sandbox
    (1.7 s here). Copied into this sandbox's own cache rather than read where
    it is mounted, since parso writes beside what it reads; a file already
    there is kept."""
    seed = os.environ.get(COMPLETER_SEED_ENV)
    source = os.path.join(seed or "", "jedi")
    if not seed or not os.path.isdir(source):
        return
    target = str(jedi.settings.cache_directory)  # ~/.cache/jedi unless XDG_CACHE_HOME
    for folder, _dirs, files in os.walk(source):
        into = os.path.join(target, os.path.relpath(folder, source))
        os.makedirs(into, exist_ok=True)
        for name in files:
            copy = os.path.join(into, name)
            if not os.path.exists(copy):
                shutil.copyfile(os.path.join(folder, name), copy)
                # parso compares the file's time with the source's, and drops
                # files not read for 30 days: the seed's time, read now
                os.utime(copy, (time.time(), os.stat(os.path.join(folder, name)).st_mtime))
