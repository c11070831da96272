"""Widget comms between the frontend and the sandbox, under the output policy.

ipywidgets talk over comms: the sandbox opens a ``jupyter.widget`` comm per
model and sends its state; the frontend renders views from it and sends
changes back. Widget state is rendered by the browser like any output, so it
passes the same policy (guarantee 8):

- a sandbox may open comms only for ``jupyter.widget`` and talk only on comms
  it opened or that the frontend opened for a widget target; the kernel's own
  comms (``sandbox_kernel.status``) are never reachable from a cell;
- a model's ``_model_module`` / ``_view_module`` must be a standard widget
  package or one installed in this Jupyter server: no other JavaScript is
  loaded (and so nothing from a CDN);
- what the frontend renders as HTML (the ``value`` of HTML/HTMLMath, a
  ``description`` with ``description_allow_html``) is cleaned like
  ``text/html``; an Output widget's outputs like any output bundle; once the
  session is private, every string is defanged and links are removed;
- a message over ``max_message_bytes`` or beyond ``rate`` messages a second is
  dropped, with a notice.

One :class:`WidgetComms` per engine session; it is cleared when the sandbox is
replaced (the comms died with it).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._html import clean_html
from ._policy import Notes
from .links import defang_json, defang_text
from .sanitize import sanitize_bundle

#: the MIME type of a widget view in a display bundle
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: the widget packages every JupyterLab / Notebook 7 with ipywidgets has
STANDARD_MODULES: frozenset[str] = frozenset(
    {"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"}
)
#: targets a sandbox may open comms for
SANDBOX_TARGETS: frozenset[str] = frozenset({"jupyter.widget"})
#: targets of frontend-opened comms that are the sandbox's to answer
FRONTEND_TARGETS: frozenset[str] = frozenset({"jupyter.widget", "jupyter.widget.control"})
#: models whose ``value`` the frontend renders as HTML
HTML_VALUE_MODELS: frozenset[str] = frozenset({"HTMLModel", "HTMLMathModel"})
#: the widget message methods a sandbox may send
SANDBOX_METHODS: frozenset[str] = frozenset({"update", "echo_update", "custom", "update_states"})
MAX_COMMS = 10_000
_COMM_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")


class WidgetRefused(ValueError):
    """A widget message that is not forwarded (the text says why)."""


def installed_widget_modules(paths: Iterable[str | Path] | None = None) -> frozenset[str]:
    """Names of the JupyterLab extensions installed where this server looks
    (``jupyter_path('labextensions')``): a widget library's frontend module is
    served from there, so its models may be used. Read on the host only."""
    if paths is None:
        from jupyter_core.paths import jupyter_path

        paths = jupyter_path("labextensions")
    names: set[str] = set()
    for root in map(Path, paths):
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for entry in entries:
            candidates = list(entry.iterdir()) if entry.name.startswith("@") and entry.is_dir() else [entry]
            for package in candidates:
                try:
                    name = json.loads((package / "package.json").read_text()).get("name")
                except (OSError, ValueError, AttributeError):
                    continue
                if isinstance(name, str) and len(name) < 200:
                    names.add(name)
    return frozenset(names)


@dataclass
class _Comm:
    target: str
    model_name: str = ""
    allow_html: bool = False
    description: str = ""


@dataclass
class CleanMessage:
    """A widget message ready to publish."""

    msg_type: str
    content: dict[str, Any]
    metadata: dict[str, Any]
    buffers: list[bytes] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _comm_id(content: Mapping[str, Any]) -> str:
    comm_id = content.get("comm_id")
    if not isinstance(comm_id, str) or not _COMM_ID.match(comm_id):
        raise WidgetRefused(f"comm_id must be 1-64 letters, digits, '-' or '_', not {str(comm_id)[:80]!r}")
    return comm_id


def message_size(content: Any, buffers: Iterable[bytes]) -> int:
    try:
        size = len(json.dumps(content, default=repr, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        size = 1 << 62
    return size + sum(len(b) for b in buffers)


class WidgetComms:
    """The widget comms of one session, and the policy their messages pass."""

    def __init__(
        self,
        *,
        modules: Iterable[str] = (),
        max_message_bytes: int = 8 * 1024 * 1024,
        rate: float = 500.0,
    ) -> None:
        self.modules = STANDARD_MODULES | frozenset(modules)
        self.max_message_bytes = max_message_bytes
        self.rate = rate
        self._tokens = rate
        self._refilled = time.monotonic()
        self._comms: dict[str, _Comm] = {}
        #: ids of the host's own comms (the kernel sets it): a sandbox reusing
        #: one would take it over in the frontend
        self.host_comm: Callable[[str], bool] = lambda comm_id: False

    # ---- what the frontend may ask about ---------------------------------------------
    def clear(self) -> None:
        self._comms.clear()

    def owns(self, comm_id: Any) -> bool:
        return isinstance(comm_id, str) and comm_id in self._comms

    def comms(self, target: str | None = None) -> dict[str, dict[str, str]]:
        """``comm_info_reply`` entries for the sandbox's comms."""
        return {
            cid: {"target_name": c.target} for cid, c in self._comms.items() if target is None or c.target == target
        }

    def view(self, value: Any) -> dict[str, Any] | None:
        """A widget-view bundle entry, if it names a model of this session."""
        if not isinstance(value, Mapping) or not self.owns(value.get("model_id")):
            return None
        major, minor = value.get("version_major", 2), value.get("version_minor", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in (major, minor)):
            return None
        return {"model_id": value["model_id"], "version_major": major, "version_minor": minor}

    # ---- frontend -> sandbox --------------------------------------------------------------
    def for_sandbox(self, msg_type: str, content: Any, buffers: Iterable[bytes] = ()) -> bool:
        """Whether a frontend comm message is the sandbox's to handle (raises
        :class:`WidgetRefused` for a malformed one of the sandbox's). The
        session records it (:meth:`from_frontend`) once a sandbox is there."""
        if not isinstance(content, Mapping):
            return False
        if msg_type == "comm_open":
            if content.get("target_name") not in FRONTEND_TARGETS:
                return False  # the host's own targets (the status comm) or none
            if _comm_id(content) in self._comms:
                raise WidgetRefused(f"comm {content['comm_id']} is already open")
        elif msg_type not in ("comm_msg", "comm_close") or not self.owns(content.get("comm_id")):
            return False
        self._check_size(content, buffers)
        return True

    def from_frontend(self, msg_type: str, content: Mapping[str, Any]) -> None:
        """Record a frontend comm message being handed to the sandbox (checked by :meth:`for_sandbox`)."""
        if msg_type == "comm_open":
            self._admit_new()
            self._comms[str(content["comm_id"])] = _Comm(str(content["target_name"]))
        elif msg_type == "comm_close":
            self._comms.pop(str(content.get("comm_id")), None)

    # ---- sandbox -> frontend --------------------------------------------------------------
    def from_sandbox(self, msg: Mapping[str, Any], buffers: list[bytes], *, private: bool) -> CleanMessage:
        """The message to publish for a comm message a cell sent, or
        :class:`WidgetRefused` saying why it is dropped."""
        msg_type = msg.get("msg_type")
        content = msg.get("content")
        metadata = msg.get("metadata")
        if msg_type not in ("comm_open", "comm_msg", "comm_close"):
            raise WidgetRefused(f"unknown comm message kind {str(msg_type)[:40]!r}")
        if not isinstance(content, Mapping) or not isinstance(metadata, (Mapping, type(None))):
            raise WidgetRefused("a comm message's content and metadata must be objects")
        self._check_rate()
        self._check_size(content, buffers)
        comm_id = _comm_id(content)
        data = content.get("data", {})
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise WidgetRefused("a comm message's data must be an object")
        notes = Notes()
        clean: dict[str, Any] = {"comm_id": comm_id}
        if msg_type == "comm_open":
            target = content.get("target_name")
            if target not in SANDBOX_TARGETS:
                raise WidgetRefused(f"a cell may open comms only for widgets, not for {str(target)[:80]!r}")
            if comm_id in self._comms or self.host_comm(comm_id):
                raise WidgetRefused(f"comm {comm_id} is already open")
            self._admit_new()
            comm = _Comm(str(target))
            clean_data = self._clean_widget_data(comm, data, buffers, private, notes)
            self._comms[comm_id] = comm
            clean.update(target_name=target, data=clean_data)
            module = content.get("target_module")
            if module is not None:
                clean["target_module"] = None  # a frontend never loads code named by the sandbox
        elif msg_type == "comm_msg":
            known = self._comms.get(comm_id)
            if known is None:
                raise WidgetRefused(f"comm {comm_id} is not a widget of this session")
            clean["data"] = self._clean_widget_data(known, data, buffers, private, notes)
        else:
            if self._comms.pop(comm_id, None) is None:
                raise WidgetRefused(f"comm {comm_id} is not a widget of this session")
            clean["data"] = defang_json(dict(data)) if private else dict(data)
        meta = dict(metadata or {})
        version = meta.get("version")
        meta = {"version": version} if isinstance(version, str) and len(version) < 40 else {}
        return CleanMessage(str(msg_type), clean, meta, buffers, notes.items)

    # ---- internals ----------------------------------------------------------------------
    def _check_size(self, content: Any, buffers: Iterable[bytes]) -> None:
        size = message_size(content, buffers)
        if size > self.max_message_bytes:
            raise WidgetRefused(f"a widget message of {size} bytes is over the limit of {self.max_message_bytes}")

    def _check_rate(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        if self._tokens < 1:
            raise WidgetRefused(f"more than {self.rate:g} widget messages a second")
        self._tokens -= 1

    def _admit_new(self) -> None:
        if len(self._comms) >= MAX_COMMS:
            raise WidgetRefused(f"more than {MAX_COMMS} widget comms are open")

    def _clean_widget_data(
        self, comm: _Comm, data: Mapping[str, Any], buffers: list[bytes], private: bool, notes: Notes
    ) -> dict[str, Any]:
        method = data.get("method")
        out: dict[str, Any] = dict(data)
        if method is not None and method not in SANDBOX_METHODS:
            raise WidgetRefused(f"unknown widget method {str(method)[:40]!r}")
        if method == "update_states":
            if comm.target != "jupyter.widget.control":
                raise WidgetRefused("update_states is answered only on the widget control comm")
            out["states"], out["buffer_paths"] = self._clean_states(data, buffers, private, notes)
            return out
        if "state" in data:
            state = data["state"]
            if not isinstance(state, Mapping):
                raise WidgetRefused("a widget's state must be an object")
            out["state"] = self._clean_state(comm, state, private, notes)
        if method == "custom" and private:
            out["content"] = defang_json(data.get("content"))
        self._check_buffer_paths(out.get("buffer_paths"), len(buffers))
        return out

    def _clean_states(
        self, data: Mapping[str, Any], buffers: list[bytes], private: bool, notes: Notes
    ) -> tuple[dict[str, Any], list[Any]]:
        """The control comm's ``update_states``: every model's state cleaned;
        a refused model is left out together with its buffers."""
        states = data.get("states")
        paths = data.get("buffer_paths", [])
        if not isinstance(states, Mapping):
            raise WidgetRefused("update_states needs a states object")
        self._check_buffer_paths(paths, len(buffers))
        kept: dict[str, Any] = {}
        for model_id, entry in states.items():
            try:
                if not self.owns(model_id) or not isinstance(entry, Mapping):
                    raise WidgetRefused(f"{str(model_id)[:80]} is not a widget of this session")
                module = entry.get("model_module")
                if module not in self.modules:
                    raise WidgetRefused(self._module_refusal(module))
                state = entry.get("state")
                if not isinstance(state, Mapping):
                    raise WidgetRefused("a widget's state must be an object")
                comm = self._comms[model_id]
                model_name = entry.get("model_name")
                kept[model_id] = {
                    "model_name": str(model_name),
                    "model_module": module,
                    "model_module_version": str(entry.get("model_module_version", ""))[:40],
                    "state": self._clean_state(comm, {"_model_name": model_name, **state}, private, notes),
                }
            except WidgetRefused as exc:
                notes.add(f"widget {str(model_id)[:40]} left out: {exc}")
        kept_paths = []
        kept_buffers = []
        for path, buffer in zip(paths or [], buffers, strict=True):
            if isinstance(path, list) and path and path[0] in kept:
                kept_paths.append(path)
                kept_buffers.append(buffer)
        buffers[:] = kept_buffers
        return kept, kept_paths

    @staticmethod
    def _check_buffer_paths(paths: Any, n: int) -> None:
        if paths is None:
            return
        ok = isinstance(paths, list) and len(paths) == n
        ok = ok and all(isinstance(p, list) and all(isinstance(k, (str, int)) for k in p) for p in paths)
        if not ok:
            raise WidgetRefused("buffer_paths must be one list of keys per buffer")

    def _module_refusal(self, module: Any) -> str:
        return f"widget module {str(module)[:80]!r} is not installed in this Jupyter server"

    def _clean_state(self, comm: _Comm, state: Mapping[str, Any], private: bool, notes: Notes) -> dict[str, Any]:
        for key in ("_model_module", "_view_module"):
            module = state.get(key)
            if key in state and module is not None and module not in self.modules:
                raise WidgetRefused(self._module_refusal(module))
        name = state.get("_model_name")
        if "_model_name" in state:
            if not isinstance(name, str) or (comm.model_name and name != comm.model_name):
                raise WidgetRefused("a widget cannot change its model")
            comm.model_name = name
        out = dict(state)
        where = f"widget {comm.model_name or 'state'}"
        allow_was = comm.allow_html
        if "description_allow_html" in out:
            comm.allow_html = out["description_allow_html"] is True
        if isinstance(out.get("description"), str):
            comm.description = out["description"]
        if comm.allow_html and ("description" in out or not allow_was):
            # a later switch to HTML would render the description already sent: send it cleaned
            out["description"] = clean_html(comm.description, private=private, notes=notes, where=where)
        if comm.model_name in HTML_VALUE_MODELS and isinstance(out.get("value"), str):
            out["value"] = clean_html(out["value"], private=private, notes=notes, where=where)
        if comm.model_name == "OutputModel" and "outputs" in out:
            out["outputs"] = _clean_outputs(out["outputs"], private, notes)
        if private:
            out = defang_json(out)
        return out


def _clean_outputs(outputs: Any, private: bool, notes: Notes) -> list[dict[str, Any]]:
    """An Output widget's outputs, each through the output policy."""
    if not isinstance(outputs, list):
        notes.add("an Output widget's outputs were not a list")
        return []
    clean: list[dict[str, Any]] = []
    for item in outputs[:10_000]:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("output_type")
        if kind == "stream" and item.get("name") in ("stdout", "stderr") and isinstance(item.get("text"), str):
            text = item["text"]
            clean.append(
                {"output_type": "stream", "name": item["name"], "text": defang_text(text) if private else text}
            )
        elif kind in ("display_data", "execute_result") and isinstance(item.get("data"), Mapping):
            bundle = sanitize_bundle(item["data"], item.get("metadata"), private=private)
            for note in bundle.removed:
                notes.add(note)
            entry: dict[str, Any] = {"output_type": kind, "data": bundle.data, "metadata": bundle.metadata}
            if kind == "execute_result":
                count = item.get("execution_count")
                entry["execution_count"] = count if isinstance(count, int) else None
            clean.append(entry)
        elif kind == "error":
            tb = item.get("traceback")
            lines = [str(line) for line in tb][:1000] if isinstance(tb, list) else []
            fix = defang_text if private else (lambda t: t)
            clean.append(
                {
                    "output_type": "error",
                    "ename": fix(str(item.get("ename", "Error"))[:200]),
                    "evalue": fix(str(item.get("evalue", ""))[:100_000]),
                    "traceback": [fix(line) for line in lines],
                }
            )
        else:
            notes.add(f"an Output widget's {str(kind)[:40]!r} output dropped")
    return clean
