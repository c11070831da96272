"""A workspace file a sandbox wrote starts nothing on the host when Lab loads it.

Why: a JupyterLab workspace (``*.jupyterlab-workspace``, plain JSON) is the
saved layout of the page, and restoring it runs commands: for every open tab
it names, Lab runs that tab's command with the arguments the workspace holds,
whatever they are (``RestorablePool.restore`` passes ``data`` through). A cell
can write such a file into its workspace; the user double-clicks it (or imports
it), Lab saves it on the server and reloads into it, and then:

- ``terminal:create-new`` with ``{"name": …, "cwd": "proj"}`` starts a shell
  on the host, unsandboxed, in a folder of the sandbox's choosing (any folder:
  the server resolves a relative ``cwd`` with ``..`` from its own). A git-aware
  prompt (oh-my-zsh, starship, ``__git_ps1``) runs ``git status`` there before
  the user types anything, and a ``.git`` the sandbox made says what
  ``core.fsmonitor`` runs: host code, from opening a file;
- ``help:open`` with ``newBrowserTab`` (or an ``http:`` address in a Lab
  served over https) opens any address in a new browser tab: navigation,
  which the Lab's Content-Security-Policy does not govern, to a URL holding
  what a private sandbox read;
- ``docmanager:open`` takes a ``kernel`` to start for the document, and may
  open another workspace file, which loads it in turn.

What this extension does: jupyterlab_server's workspace API handler (every
route that stores a workspace ends in its ``PUT``: the file loader, "Import
Workspace…", Lab's own saves of the layout) is replaced by a subclass
(:mod:`sandbox_kernel.lab_routes`) that keeps, of each tab's restore
arguments, the ones Lab itself writes:

- a terminal tab only as ``{"name": …}`` and only while a terminal of that
  name is running (Lab then connects to it); a name that is not running would
  start a new shell, so the tab is dropped. The user's own layout names
  running terminals when Lab saves it;
- a help tab only with an ``https:`` address (shown in the Lab's frame, where
  the policy decides) and its label;
- a document tab only as ``{"path", "factory"}``, and none that opens a
  workspace file;
- a console tab only as ``{"path", "name", "kernelPreference"}`` with the
  preference's own fields (which kernels may start is the kernelspec
  manager's job, :mod:`sandbox_kernel.lab_kernelspecs`);
- the plugin manager's tab keeps its search and loses ``isDisclaimed`` (the
  user's acknowledgement before switching plugins off, ours included).

Everything else in a workspace (the layout, the file browser's folder,
sizes) is stored as sent. The same check runs again when a workspace is
served (``GET``, which the page restores from): one stored before this ran,
or put in the folder by ``jupyter lab workspaces import`` (a host command
the user runs on a file), was never checked; and a terminal that was running
when the layout was saved may not be any more (after a server restart its
tab would start a new shell, so it is left out: open a new terminal).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping
from typing import Any

from tornado.web import HTTPError, authenticated

from . import lab_routes

WORKSPACE_SUFFIX = ".jupyterlab-workspace"
#: the document factory that loads a workspace file (Lab's, apputils-extension)
WORKSPACE_LOADER = "Workspace loader"

#: the fields of a console's kernel preference (``ISessionContext.IKernelPreference``)
_PREFERENCE_FIELDS: dict[str, type] = {
    "name": str,
    "language": str,
    "id": str,
    "shouldStart": bool,
    "canStart": bool,
    "shutdownOnDispose": bool,
    "autoStartDefault": bool,
    "skipKernelRestartDialog": bool,
}


def _terminal(args: Mapping[str, Any], running: Collection[str]) -> tuple[dict[str, Any] | None, str]:
    name = args.get("name")
    if isinstance(name, str) and name in running:
        return {"name": name}, ""
    return None, "a terminal that is not running (it would start a shell on the host)"


def _help(args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    url = args.get("url")
    if isinstance(url, str) and url.lower().startswith("https://"):
        text = args.get("text")
        return ({"url": url, "text": text} if isinstance(text, str) else {"url": url}), ""
    return None, "a help tab whose address is not https: (it would open in a new browser tab)"


def _document(args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    path, factory = args.get("path"), args.get("factory")
    if not isinstance(path, str) or not isinstance(factory, str):
        return None, "a document tab without a path and factory"
    if factory == WORKSPACE_LOADER or path.lower().endswith(WORKSPACE_SUFFIX):
        return None, "a tab that loads another workspace"
    return {"path": path, "factory": factory}, ""


def _console(args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    kept: dict[str, Any] = {name: args[name] for name in ("path", "name") if isinstance(args.get(name), str)}
    preference = args.get("kernelPreference")
    if isinstance(preference, Mapping):
        kept["kernelPreference"] = {
            field: value
            for field, kind in _PREFERENCE_FIELDS.items()
            if isinstance(value := preference.get(field), kind)
        }
    return kept, ""


def _plugins(args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    query = args.get("query")
    return ({"query": query} if isinstance(query, str) else {}), ""


def _cloned_output(args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    path, index = args.get("path"), args.get("index")
    if isinstance(path, str) and isinstance(index, int) and not isinstance(index, bool):
        return {"path": path, "index": index}, ""
    return None, "a cloned output without a path and index"


_BY_NAMESPACE = {"help-doc": _help, "console": _console, "plugins": _plugins, "cloned-outputs": _cloned_output}


def _restore_args(
    namespace: str, args: Mapping[str, Any], running: Collection[str]
) -> tuple[dict[str, Any] | None, str]:
    """The arguments a tab of ``namespace`` is restored with, or None and why it is dropped."""
    if namespace == "terminal":
        return _terminal(args, running)
    if namespace in _BY_NAMESPACE:
        return _BY_NAMESPACE[namespace](args)
    if "path" in args or "factory" in args or "kernel" in args:
        # docmanager:open, whatever the tracker (notebook, editor, viewers, mime documents)
        return _document(args)
    return dict(args), ""


def shape_problem(workspace: Any) -> str:
    """What keeps ``workspace`` from being one Lab can load ("" when nothing)."""
    if not isinstance(workspace, Mapping):
        return "a workspace is a JSON object"
    if not isinstance(workspace.get("data"), Mapping):
        return "its 'data' is not an object"
    metadata = workspace.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("id"), str):
        return "its 'metadata' has no string 'id'"
    return ""


def guarded(workspace: Any, running_terminals: Collection[str]) -> tuple[Any, list[str]]:
    """``workspace`` with every tab's restore arguments reduced to what Lab
    writes itself, and a line for each tab dropped. Anything that is not a
    workspace's shape is returned as is (the API then refuses it or stores it)."""
    if not isinstance(workspace, Mapping) or not isinstance(workspace.get("data"), Mapping):
        return workspace, []
    dropped: list[str] = []
    data: dict[str, Any] = {}
    for key, value in workspace["data"].items():
        namespace, sep, _ = key.partition(":")
        if not sep or not isinstance(value, Mapping) or "data" not in value:
            data[key] = value  # not a tab's restore entry (Lab's restore skips it)
            continue
        if not isinstance(value["data"], Mapping):
            dropped.append(f"{key}: restore arguments that are not an object")
            continue
        args, why = _restore_args(namespace, value["data"], running_terminals)
        if args is None:
            dropped.append(f"{key}: {why}")
            continue
        data[key] = {**value, "data": args}
    clean = dict(copy.deepcopy(workspace))
    clean["data"] = data
    return clean, dropped


def _no_constant(name: str) -> Any:
    # Python reads NaN and Infinity, the browser's JSON.parse does not
    raise ValueError(f"{name} is not JSON")


def _guarded_handler() -> type:
    """The guarded subclass of jupyterlab_server's handler (made when the
    extension loads: jupyterlab_server is only imported by a server)."""
    from jupyterlab_server.workspaces_handler import WorkspacesHandler

    class GuardedWorkspacesHandler(WorkspacesHandler):
        """jupyterlab_server's workspace API, storing and serving workspaces :func:`guarded`."""

        def _running_terminals(self) -> list[str]:
            manager = self.settings.get("terminal_manager")
            return list(getattr(manager, "terminals", {}) or {})

        def _served(self, workspace: Any, running: Collection[str]) -> Any:
            clean, dropped = guarded(workspace, running)
            if dropped:
                metadata = workspace.get("metadata") if isinstance(workspace, Mapping) else None
                self.log.warning(
                    "stored workspace %r: restore entries left out (they would start or open things on the host): %s",
                    metadata.get("id") if isinstance(metadata, Mapping) else None,
                    "; ".join(dropped),
                )
            return clean

        @authenticated
        async def get(self, space_name: str = "") -> Any:
            """jupyterlab_server's ``get``, each workspace :func:`guarded` on
            the way out: one stored by an older version, or put in the folder
            by ``jupyter lab workspaces import``, was never checked, and the
            page restores what this returns."""
            running = self._running_terminals()
            try:
                if not space_name:
                    values = [self._served(w, running) for w in self.manager.list_workspaces()]
                    ids = [w["metadata"]["id"] for w in values]
                    return self.finish(json.dumps({"workspaces": {"ids": ids, "values": values}}))
                return self.finish(json.dumps(self._served(self.manager.load(space_name), running)))
            except HTTPError:
                raise
            except Exception as e:  # as jupyterlab_server answers
                raise HTTPError(500, str(e)) from e

        @authenticated
        def put(self, space_name: str = "") -> Any:
            try:
                workspace = json.loads(self.request.body, parse_constant=_no_constant)
            except ValueError as exc:
                raise HTTPError(400, f"the workspace is not JSON: {exc}") from None
            problem = shape_problem(workspace)
            if problem:
                raise HTTPError(400, f"not a workspace: {problem}")
            clean, dropped = guarded(workspace, self._running_terminals())
            if dropped:
                # (the keys are the file's words: the server's log formatter escapes
                # them, see lab_content_policy.apply)
                self.log.warning(
                    "workspace %r: restore entries dropped (they would start or open things on the host): %s",
                    space_name,
                    "; ".join(dropped),
                )
            # what is stored is what was checked: the parsed JSON written again,
            # never the body (whose parse in the browser could differ)
            self.request.body = json.dumps(clean).encode()
            return super().put(space_name)

    return GuardedWorkspacesHandler


def _load_jupyter_server_extension(serverapp: Any) -> None:
    handler = _guarded_handler()
    (base,) = handler.__bases__
    lab_routes.install(serverapp, {base: handler}, "workspace API")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "sandbox_kernel.lab_workspaces"}]


__all__ = ["WORKSPACE_LOADER", "WORKSPACE_SUFFIX", "guarded", "shape_problem"]
