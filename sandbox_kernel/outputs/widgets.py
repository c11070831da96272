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
  loaded (and so nothing from a CDN); a model cannot change its class, a
  standard model is shown only by the view its package pairs it with (a Label
  cannot be shown by ``HTMLView``), and class names and versions are plain
  (they reach the error widget's HTML);
- what the frontend renders as HTML (the ``value`` of HTML/HTMLMath, a
  ``description`` with a truthy ``description_allow_html``) must be text and is
  cleaned like ``text/html``; an Output widget's outputs like any output
  bundle; style and layout values like CSS; ``update_states`` must name each
  model as it was opened;
- a binary buffer goes only where ipywidgets took one out of the state (a
  missing key of an object, a ``None`` in a list): the frontend walks a
  buffer's path with no guard, and ``__proto__`` led to ``Object.prototype``;
- styles fetch nothing in any session (outputs/_policy.py ``clean_css``);
- once the session is private, every string is defanged, links are removed
  and nothing is fetched: no Image/Video/Audio with
  ``format="url"`` but a ``data:`` image, no math command that fetches in a
  string MathJax typesets (a Label's value, a description);
- no key ``__proto__``, ``constructor`` or ``prototype`` at any depth of
  widget data (the page's ``JSON.parse`` keeps it and ipywidgets assigns it);
- a link (``jslink``) joins only plain values of models that render no HTML,
  media, CSS or outputs: the page copies linked values without the host;
- a model whose state, sent while public, private cleaning would have
  changed is *armed*: once private it is not shown, named by another model
  (a Box's children, transitively) or changed, since a view of it would fetch
  what it holds; links spread arming; a state names only live models of this
  sandbox;
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._html import clean_html
from ._policy import Notes, clean_css, clean_tex, describe_url_removal, image_ok
from ._widget_names import (
    CONTROLS,
    HTML_VALUE_MODELS,
    HTML_VIEWS,
    IDENTITY_KEYS,
    LINK_MODELS,
    MEDIA_MODELS,
    MEDIA_VIEWS,
    RENDERING_KEYS,
    STANDARD_MODULES,
    STYLE_VIEWS,
    js_truthy,
    name_problem,
    version_problem,
    view_problem,
)
from .links import defang_json, defang_text, map_json_strings
from .sanitize import sanitize_bundle
from .sizing import json_size, text_of

#: the MIME type of a widget view in a display bundle
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: targets a sandbox may open comms for
SANDBOX_TARGETS: frozenset[str] = frozenset({"jupyter.widget"})
#: targets of frontend-opened comms that are the sandbox's to answer
FRONTEND_TARGETS: frozenset[str] = frozenset({"jupyter.widget", "jupyter.widget.control"})
#: the widget message methods a sandbox may send
SANDBOX_METHODS: frozenset[str] = frozenset({"update", "echo_update", "custom", "update_states"})
MAX_COMMS = 10_000
_COMM_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")
#: keys a frontend's ``put_buffers`` must never walk: ``o = o[key]`` through
#: them reaches ``Object.prototype`` (a Label's ``[["__proto__", "trusted"]]``
#: made every markdown render in the Lab page trusted; an attack review)
_PROTOTYPE_KEYS = frozenset({"__proto__", "constructor", "prototype"})
#: how a state names another model (ipywidgets' ``unpack_models``)
MODEL_REF = "IPY_MODEL_"
#: keys of a style or layout model that are no CSS property (checked elsewhere, or not strings)
_STYLE_NON_CSS_KEYS = IDENTITY_KEYS | {"_view_count", "_dom_classes"}


class WidgetRefused(ValueError):
    """A widget message that is not forwarded (the text says why)."""


#: widget packages whose models run code their state carries (anywidget's and
#: ipyreact's ``_esm``, ipyvue's templates): a sandbox's state would be script in
#: the page. Installed or not, their models pass only when the user lists them in
#: ``SandboxKernel.widget_modules`` (the opt-in of guarantee 8).
CODE_WIDGET_MODULES: frozenset[str] = frozenset({"anywidget", "ipyreact", "jupyter-vue"})


def installed_widget_modules(paths: Iterable[str | Path] | None = None) -> frozenset[str]:
    """Names of the JupyterLab extensions installed where this server looks
    (``jupyter_path('labextensions')``): a widget library's frontend module is
    served from there, so its models may be used; not those of
    :data:`CODE_WIDGET_MODULES`. Read on the host only."""
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
    return frozenset(names - CODE_WIDGET_MODULES)


@dataclass
class _Comm:
    """What the frontend holds for one comm, as far as rendering goes: the
    state arrives in pieces (comm_open, then updates), and what a piece means
    depends on the pieces before it (a view switched to HTML, a format switched
    to ``url``)."""

    target: str
    model_module: str | None = None
    model_name: str = ""
    view_module: str | None = None
    view_name: str | None = None
    allow_html: bool = False
    description: str = ""
    url_format: bool = False
    #: the frontend holds state of this model, sent while the session was
    #: public, that private cleaning would have changed (a URL, an image
    #: address, math that fetches): a view of it made later would fetch, so
    #: once private it is neither shown, nor named, nor rendered again
    armed: bool = False
    #: the models each key of the merged state names (``IPY_MODEL_``), by key
    refs: dict[str, frozenset[str]] = field(default_factory=dict)
    #: a link model's ``source`` and ``target`` as last sent
    ends: dict[str, Any] = field(default_factory=dict)

    @property
    def view(self) -> tuple[str | None, str | None]:
        return (self.view_module, self.view_name)

    def renders_html_value(self) -> bool:
        return self.model_name in HTML_VALUE_MODELS or self.view in HTML_VIEWS

    def loads_media(self) -> bool:
        return self.model_name in MEDIA_MODELS or self.view in MEDIA_VIEWS

    def is_link(self) -> bool:
        return self.model_module == CONTROLS and self.model_name in LINK_MODELS

    def kind(self) -> tuple[bool, ...]:
        """What decides whether a link may name this model (see ``_link_problem``)."""
        return (
            self.renders_html_value(),
            self.loads_media(),
            self.sets_css(),
            self.model_name == "OutputModel",
            self.is_link(),
        )

    def sets_css(self) -> bool:
        """A style or layout model: the frontend sets each value as a CSS property."""
        standard_style = self.model_module in STANDARD_MODULES and (
            self.model_name.endswith("StyleModel") or self.model_name == "LayoutModel"
        )
        return standard_style or self.view in STYLE_VIEWS

    @classmethod
    def opened_by_frontend(cls, target: str, data: Any) -> _Comm:
        """A comm the frontend opened: its model is the one the frontend named
        (kept only if it is a well-formed name; the sandbox cannot change it)."""
        comm = cls(target)
        state = data.get("state") if isinstance(data, Mapping) else None
        if isinstance(state, Mapping):
            module, name = state.get("_model_module"), state.get("_model_name")
            if isinstance(module, str) and name_problem("_model_name", name, optional=False) is None:
                comm.model_module, comm.model_name = module, str(name)
        return comm


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
        raise WidgetRefused(f"comm_id must be 1-64 letters, digits, '-' or '_', not {text_of(comm_id, 80)!r}")
    return comm_id


def message_size(content: Any, buffers: Iterable[bytes]) -> int:
    """Bytes a widget message takes on the wire (more than any budget for
    what JSON cannot hold), counted without holding the GIL long (``json_size``)."""
    return json_size(content) + sum(len(b) for b in buffers)


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
        #: open link models: comm id -> the models its ends name
        self._links: dict[str, frozenset[str]] = {}
        #: ids of the host's own comms (the kernel sets it): a sandbox reusing
        #: one would take it over in the frontend
        self.host_comm: Callable[[str], bool] = lambda comm_id: False

    # ---- what the frontend may ask about ---------------------------------------------
    def clear(self) -> None:
        self._comms.clear()
        self._links.clear()

    def owns(self, comm_id: Any) -> bool:
        return isinstance(comm_id, str) and comm_id in self._comms

    def comms(self, target: str | None = None) -> dict[str, dict[str, str]]:
        """``comm_info_reply`` entries for the sandbox's comms."""
        return {
            cid: {"target_name": c.target} for cid, c in self._comms.items() if target is None or c.target == target
        }

    def view(self, value: Any, *, private: bool = False) -> dict[str, Any] | None:
        """A widget-view bundle entry, if it names a model of this session
        (raises :class:`WidgetRefused` for a model made public and shown once
        private, see ``_Comm.armed``)."""
        if not isinstance(value, Mapping) or not self.owns(value.get("model_id")):
            return None
        major, minor = value.get("version_major", 2), value.get("version_minor", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in (major, minor)):
            return None
        if private:
            self._check_reachable([value["model_id"]])
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
            if _comm_id(content) in self._comms or self.host_comm(content["comm_id"]):
                raise WidgetRefused(f"comm {content['comm_id']} is already open")
        elif msg_type not in ("comm_msg", "comm_close") or not self.owns(content.get("comm_id")):
            return False
        self._check_size(content, buffers)
        return True

    def from_frontend(self, msg_type: str, content: Mapping[str, Any]) -> None:
        """Record a frontend comm message being handed to the sandbox (checked by :meth:`for_sandbox`)."""
        if msg_type == "comm_open":
            self._admit_new()
            comm = _Comm.opened_by_frontend(str(content["target_name"]), content.get("data"))
            self._comms[str(content["comm_id"])] = comm
        elif msg_type == "comm_close":
            self._comms.pop(str(content.get("comm_id")), None)
            self._links.pop(str(content.get("comm_id")), None)

    # ---- sandbox -> frontend --------------------------------------------------------------
    def from_sandbox(self, msg: Mapping[str, Any], buffers: list[bytes], *, private: bool) -> CleanMessage:
        """The message to publish for a comm message a cell sent, or
        :class:`WidgetRefused` saying why it is dropped. Refusals and notes
        quote what the sandbox sent, and the user reads them as stream text:
        once private they are defanged like any text (no link to click)."""
        if not private:
            return self._from_sandbox(msg, buffers, private=False)
        try:
            clean = self._from_sandbox(msg, buffers, private=True)
        except WidgetRefused as exc:
            raise WidgetRefused(defang_text(str(exc))) from None
        clean.notes = [defang_text(note) for note in clean.notes]
        return clean

    def _from_sandbox(self, msg: Mapping[str, Any], buffers: list[bytes], *, private: bool) -> CleanMessage:
        msg_type = msg.get("msg_type")
        content = msg.get("content")
        metadata = msg.get("metadata")
        if msg_type not in ("comm_open", "comm_msg", "comm_close"):
            raise WidgetRefused(f"unknown comm message kind {text_of(msg_type, 40)!r}")
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
        _check_no_prototype_keys(data)
        notes = Notes()
        clean: dict[str, Any] = {"comm_id": comm_id}
        if msg_type == "comm_open":
            target = content.get("target_name")
            if target not in SANDBOX_TARGETS:
                raise WidgetRefused(f"a cell may open comms only for widgets, not for {text_of(target, 80)!r}")
            if comm_id in self._comms or self.host_comm(comm_id):
                raise WidgetRefused(f"comm {comm_id} is already open")
            self._admit_new()
            comm = _Comm(str(target))
            clean_data = self._clean_widget_data(comm, data, buffers, private, notes)
            if not comm.model_name or comm.model_module is None:
                raise WidgetRefused("a widget's comm_open must name its model (_model_module and _model_name)")
            self._store(comm_id, comm)
            clean.update(target_name=target, data=clean_data)
            module = content.get("target_module")
            if module is not None:
                clean["target_module"] = None  # a frontend never loads code named by the sandbox
        elif msg_type == "comm_msg":
            known = self._comms.get(comm_id)
            if known is None:
                raise WidgetRefused(f"comm {comm_id} is not a widget of this session")
            if private and known.armed:
                # any change re-renders its views from the state the frontend
                # holds, and which widgets a cell touches would be the message
                raise WidgetRefused(_armed_refusal(comm_id))
            probe = replace(known)  # kept only if the whole message passes
            clean["data"] = self._clean_widget_data(probe, data, buffers, private, notes)
            self._store(comm_id, probe)
        else:
            if self._comms.pop(comm_id, None) is None:
                raise WidgetRefused(f"comm {comm_id} is not a widget of this session")
            self._links.pop(comm_id, None)
            clean["data"] = defang_json(dict(data), urls=True) if private else dict(data)
        version = dict(metadata or {}).get("version")
        meta = {"version": version} if isinstance(version, str) and version_problem("version", version) is None else {}
        return CleanMessage(str(msg_type), clean, meta, buffers, notes.items)

    # ---- internals ----------------------------------------------------------------------
    def _store(self, comm_id: str, comm: _Comm) -> None:
        """Keep a comm whose message passed. A model a link names cannot turn
        into one a link may not name (a custom model switched to a media or
        style view); a link made while public that joins an armed model arms
        every model it joins: the page copied the armed value into them."""
        old = self._comms.get(comm_id)
        changed = old is not None and old.kind() != comm.kind()
        if changed and any(comm_id in ends for link_id, ends in self._links.items() if link_id != comm_id):
            raise WidgetRefused(f"widget {comm_id} is linked (jslink): it cannot change how it is shown")
        self._comms[comm_id] = comm
        if comm.is_link():
            self._links[comm_id] = frozenset().union(*comm.refs.values())
        else:
            self._links.pop(comm_id, None)
        if comm.armed or comm.is_link():
            self._spread_armed(comm_id)

    def _spread_armed(self, start: str) -> None:
        """Arm every model joined to an armed one by links (transitively)."""
        adjacent: dict[str, set[str]] = {}
        for link_id, ends in self._links.items():
            for end in (*ends, link_id):
                adjacent.setdefault(end, set()).update(ends, {link_id})
        seen = {start}
        todo = [start]
        while todo:
            for nxt in adjacent.get(todo.pop(), ()):
                if nxt not in seen and nxt in self._comms:
                    seen.add(nxt)
                    todo.append(nxt)
        if any(self._comms[cid].armed for cid in seen):
            for cid in seen:
                self._comms[cid].armed = True

    def _check_reachable(self, model_ids: Iterable[str]) -> None:
        """Once private, a view of a model, or a state naming it, makes views of
        every model it names in turn (a Box's children, their layouts and
        styles...): none may be armed, nor a model that is not of this sandbox.
        The walk visits each model once (cycles), so at most all comms."""
        seen: set[str] = set()
        todo = list(model_ids)
        while todo:
            model_id = todo.pop()
            if model_id in seen:
                continue
            seen.add(model_id)
            comm = self._comms.get(model_id)
            if comm is None:
                raise WidgetRefused(f"the state names widget {model_id[:64]!r}, which is not one of this sandbox")
            if comm.armed:
                raise WidgetRefused(_armed_refusal(model_id))
            for refs in comm.refs.values():
                todo.extend(refs - seen)

    def _link_problem(self, comm: _Comm) -> str | None:
        """Why a link (``jslink``/``jsdlink``) may not join what it names. The
        page copies one model's attribute into the other's, and a copy never
        passes the host: a Text's value linked into an HTML's value ran its
        script (an attack review). So a link joins only plain values: both
        ends are live models of this sandbox that render no HTML value, load
        no media, set no CSS, are no Output or link, and the attribute is
        none the policy reads to decide rendering or cleans (``description``,
        ``description_allow_html``, ``format``, ``children``, ``layout``,
        ``style``, a ``_`` key). A slider's and a text's ``value``, ``min``,
        ``max`` or ``index`` pass. Both ends are checked, since ``jslink``
        copies both ways."""
        for key in ("source", "target"):
            end = comm.ends.get(key)
            if end is None:
                continue
            if not (isinstance(end, list) and len(end) == 2 and all(isinstance(part, str) for part in end)):
                return f"a widget link's {key} must be a [widget, attribute] pair"
            ref, attr = end
            model_id = ref[len(MODEL_REF) :] if ref.startswith(MODEL_REF) else None
            other = self._comms.get(model_id) if model_id is not None else None
            if other is None:
                return f"a widget link's {key} names {ref[:80]!r}, which is not a widget of this sandbox"
            if attr.startswith("_") or attr in RENDERING_KEYS or any(other.kind()):
                return (
                    f"a widget link cannot join {attr[:40]!r} of a {other.model_name}: only plain values "
                    "(a slider's or a text's value, min, max...) of widgets that render no HTML, media, "
                    "style or outputs are linked in the page"
                )
        return None

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
            raise WidgetRefused(f"unknown widget method {text_of(method, 40)!r}")
        if method == "update_states":
            if comm.target != "jupyter.widget.control":
                raise WidgetRefused("update_states is answered only on the widget control comm")
            out["states"], out["buffer_paths"] = self._clean_states(data, buffers, private, notes)
            return out
        self._check_buffer_paths(out.get("buffer_paths"), len(buffers))
        if "state" in data:
            state = data["state"]
            if not isinstance(state, Mapping):
                raise WidgetRefused("a widget's state must be an object")
            placed = _buffers_by_key(out.get("buffer_paths") or [], buffers, prefix=())
            out["state"] = self._clean_state(comm, state, placed, private, notes)
            for path in out.get("buffer_paths") or []:
                _check_buffer_target(out["state"], path)
        elif out.get("buffer_paths") and method != "custom":
            raise WidgetRefused("buffer_paths name places in a state, and this message has none")
        if method == "custom" and private:
            out["content"] = defang_json(data.get("content"), urls=True)
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
                placed = _buffers_by_key(paths or [], buffers, prefix=(model_id, "state"))
                kept[model_id] = self._clean_state_entry(model_id, entry, placed, private, notes)
            except WidgetRefused as exc:
                notes.add(f"widget {text_of(model_id, 40)} left out: {exc}")
        kept_paths = []
        kept_buffers = []
        for path, buffer in zip(paths or [], buffers, strict=True):
            if isinstance(path, list) and path and path[0] in kept:
                if len(path) < 3 or path[1] != "state":
                    raise WidgetRefused(f"a buffer path of update_states must lead into a model's state: {path!r:.120}")
                _check_buffer_target(kept[path[0]]["state"], path[2:])
                kept_paths.append(path)
                kept_buffers.append(buffer)
        buffers[:] = kept_buffers
        return kept, kept_paths

    def _clean_state_entry(
        self, model_id: Any, entry: Any, placed: Mapping[str, bytes | None], private: bool, notes: Notes
    ) -> dict[str, Any]:
        """One model of ``update_states``. The frontend builds the model from
        the entry's ``model_module``/``model_name`` and then applies the state,
        so both must be the model this comm was opened as (a state naming
        another model would be cleaned as that one)."""
        if not self.owns(model_id) or not isinstance(entry, Mapping):
            raise WidgetRefused(f"{text_of(model_id, 80)} is not a widget of this session")
        if private and self._comms[model_id].armed:
            raise WidgetRefused(_armed_refusal(model_id))
        state = entry.get("state")
        if not isinstance(state, Mapping):
            raise WidgetRefused("a widget's state must be an object")
        comm = self._comms[model_id]
        module, name = entry.get("model_module"), entry.get("model_name")
        if not self._module_ok(module):
            raise WidgetRefused(self._module_refusal(module))
        if not comm.model_name or (module, name) != (comm.model_module, comm.model_name):
            raise WidgetRefused(
                f"the entry names {text_of(name, 40)!r} of {text_of(module, 40)!r}, but the widget is "
                f"{comm.model_name or 'unknown'!r} of {comm.model_module!r}"
            )
        version = entry.get("model_module_version", "")
        problem = version_problem("model_module_version", version)
        if problem:
            raise WidgetRefused(problem)
        probe = replace(comm)
        clean = {
            "model_name": comm.model_name,
            "model_module": comm.model_module,
            "model_module_version": version,
            "state": self._clean_state(probe, state, placed, private, notes),
        }
        self._store(model_id, probe)
        return clean

    @staticmethod
    def _check_buffer_paths(paths: Any, n: int) -> None:
        if paths is None:
            return
        ok = isinstance(paths, list) and len(paths) == n
        ok = ok and all(isinstance(p, list) and all(isinstance(k, (str, int)) for k in p) for p in paths)
        if not ok:
            raise WidgetRefused("buffer_paths must be one list of keys per buffer")

    def _module_ok(self, module: Any) -> bool:
        """A module the page may load (a list or object is no name, and would
        not even hash)."""
        return isinstance(module, str) and module in self.modules

    def _module_refusal(self, module: Any) -> str:
        return f"widget module {text_of(module, 80)!r} is not installed in this Jupyter server"

    def _clean_state(
        self, comm: _Comm, state: Mapping[str, Any], placed: Mapping[str, bytes | None], private: bool, notes: Notes
    ) -> dict[str, Any]:
        """One piece of a widget's state, checked against what the comm already
        holds (``comm`` is updated: the caller keeps it only if all passes).
        ``placed`` are the buffers the frontend puts into top-level keys."""
        before = replace(comm)
        out = self._clean_state_as(comm, state, placed, private, notes)
        refs = dict(comm.refs)  # a new dict: ``before`` and the comm kept shares it
        for key, value in out.items():
            named = _model_refs(value)
            if named:
                refs[key] = named
            else:
                refs.pop(key, None)
        comm.refs = refs
        if comm.is_link():
            comm.ends = {**comm.ends, **{k: out[k] for k in ("source", "target") if k in out}}
            problem = self._link_problem(comm)
            if problem:
                raise WidgetRefused(problem)
        if private:
            self._check_references(out)
        elif not comm.armed and (comm.loads_media() or _holds_text(out)):
            # what private cleaning would have sent instead: if it differs, a
            # view of this model made once private would show (and fetch)
            # what a private output may not (an attack review: widgets made
            # while public, each with an image address, shown after the rise
            # one per bit of a secret)
            try:
                again = self._clean_state_as(before, state, placed, True, Notes())
            except WidgetRefused:
                comm.armed = True
            else:
                comm.armed = again != out
        return out

    def _check_references(self, state: Mapping[str, Any]) -> None:
        """Once private, a state names only live models of this sandbox that
        are not armed, nor name one in turn: a Box's children, a layout, a
        link's source (a model of a replaced sandbox, or one made public,
        would be shown through it; a Box made public around an armed model
        too)."""

        self._check_reachable(_model_refs(state))

    def _clean_state_as(
        self, comm: _Comm, state: Mapping[str, Any], placed: Mapping[str, bytes | None], private: bool, notes: Notes
    ) -> dict[str, Any]:
        self._take_identity(comm, state)
        out = dict(state)
        where = f"widget {comm.model_name or 'state'}"
        _clean_description(comm, out, placed, private, notes, where)
        if comm.renders_html_value():
            if "value" in placed:
                raise WidgetRefused(f"the HTML value of a {comm.model_name} must be text, not a binary buffer")
            if "value" in out:
                out["value"] = _html_field(out["value"], "value", private, notes, where)
        for key in placed:
            if key.startswith("_") or key in RENDERING_KEYS or comm.sets_css() or comm.is_link():
                raise WidgetRefused(
                    f"a binary buffer cannot go at {key[:40]!r} of {where}: the page reads that key to decide "
                    "what it renders, and the host cleans only text"
                )
        if comm.loads_media():
            _check_media_url(comm, out, placed, private)
        if comm.sets_css():
            out = _clean_style_values(out, private, notes, where)
        if comm.model_name == "OutputModel" and "outputs" in out:
            out["outputs"] = _clean_outputs(out["outputs"], private, notes)
        # ipywidgets typesets a Label's value and descriptions with MathJax:
        # once private every string is defanged and math commands that fetch
        # are disarmed (``$\mmlToken{mglyph}[src=...]{}$`` is an image); in a
        # public session, those that could wait (a ``\style`` cursor image, in
        # a view a private output's CSS shows later: ``clean_tex``)
        if private:
            out = defang_json(out, urls=True)
        cleaned: dict[str, Any] = map_json_strings(
            out, lambda text: clean_tex(text, private=private, notes=notes, where=where)
        )
        return cleaned

    def _take_identity(self, comm: _Comm, state: Mapping[str, Any]) -> None:
        """Record the model and view a piece of state names, and refuse what the
        frontend must not be told: a module not installed, a name or version
        that is not plain (they reach an error widget's HTML), another model
        than the comm's, or a view its model is not shown by. Checked on the
        comm's merged state, so the order of the pieces does not matter."""
        for key in ("_model_module", "_view_module"):
            module = state.get(key)
            if key in state and (module is not None or key == "_model_module") and not self._module_ok(module):
                raise WidgetRefused(self._module_refusal(module))
        problem = (
            name_problem("_model_name", state.get("_model_name"), optional=False) if "_model_name" in state else None
        )
        problem = problem or (
            name_problem("_view_name", state.get("_view_name"), optional=True) if "_view_name" in state else None
        )
        for key in ("_model_module_version", "_view_module_version"):
            problem = problem or (version_problem(key, state.get(key)) if key in state else None)
        if problem:
            raise WidgetRefused(problem)
        if "_model_name" in state and comm.model_name and state["_model_name"] != comm.model_name:
            raise WidgetRefused("a widget cannot change its model")
        if "_model_module" in state and comm.model_module is not None and state["_model_module"] != comm.model_module:
            raise WidgetRefused("a widget cannot change its model")
        comm.model_name = str(state.get("_model_name", comm.model_name))
        comm.model_module = state.get("_model_module", comm.model_module)
        comm.view_module = state.get("_view_module", comm.view_module)
        comm.view_name = state.get("_view_name", comm.view_name)
        problem = view_problem((comm.model_module, comm.model_name), comm.view)
        if problem:
            raise WidgetRefused(problem)


def _check_no_prototype_keys(data: Mapping[str, Any]) -> None:
    """No object of widget data has a key ``__proto__``, ``constructor`` or
    ``prototype``, at any depth. ``JSON.parse`` keeps ``"__proto__"`` as an own
    key, ipywidgets then assigns it (``s["__proto__"] = value``), which sets
    the state's prototype, and Backbone's ``set`` copies the inherited keys in
    as attributes: a Layout model carried ``_view_name: "HTMLView"`` and a
    ``value`` with a script past every check (an attack review)."""
    todo: list[Any] = [data]
    while todo:
        node = todo.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in _PROTOTYPE_KEYS:
                    raise WidgetRefused(
                        f"widget data may not hold a key {key!r}: the page would take it as the "
                        "prototype of the state, not as a value"
                    )
                if isinstance(value, (Mapping, list)):
                    todo.append(value)
        elif isinstance(node, list):
            todo.extend(item for item in node if isinstance(item, (Mapping, list)))


def _model_refs(value: Any) -> frozenset[str]:
    """The models a value names (``IPY_MODEL_<id>`` strings, at any depth)."""
    found: set[str] = set()
    todo: list[Any] = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, str):
            if node.startswith(MODEL_REF):
                found.add(node[len(MODEL_REF) :])
        elif isinstance(node, Mapping):
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return frozenset(found)


def _holds_text(state: Mapping[str, Any]) -> bool:
    """Whether a state holds a string anywhere: private cleaning changes
    only strings (and a media model's URL), so a slider's ``{"value": 5}``
    needs no second cleaning to know it arms nothing."""
    todo: list[Any] = [state]
    while todo:
        node = todo.pop()
        if isinstance(node, str):
            return True
        if isinstance(node, Mapping):
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return False


def _armed_refusal(model_id: Any) -> str:
    return (
        f"widget {text_of(model_id, 64)} was made while the session was public and holds what a private "
        "session may not show (an address, an image to fetch): it is not shown or changed any more. "
        "Create the widget again"
    )


def _check_buffer_target(state: Any, path: list[Any]) -> None:
    """A buffer goes where ipywidgets took one out of the state: a key missing
    from an object, or a ``None`` in a list, reached through objects and lists
    the state holds. The frontend's ``put_buffers`` walks ``o = o[key]`` with
    no guard, so any other path writes wherever it leads, ``Object.prototype``
    included."""
    node = state
    for depth, key in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, Mapping) and isinstance(key, str) and key not in _PROTOTYPE_KEYS:
            if last:
                if key in node:
                    break  # a buffer never replaces a value the state holds
                return
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(node):
            if last:
                if node[key] is not None:
                    break
                return
            node = node[key]
        else:
            break
        if not isinstance(node, (Mapping, list)):
            break
    raise WidgetRefused(
        f"buffer path {path!r:.120} does not lead to a place the state left for a buffer "
        "(a missing key of an object or a None in a list)"
    )


def _buffers_by_key(paths: list[Any], buffers: list[bytes], prefix: tuple[Any, ...]) -> dict[str, bytes | None]:
    """The top-level state keys the frontend puts a buffer into, each with the
    buffer when the path is exactly that key (``None`` when deeper)."""
    placed: dict[str, bytes | None] = {}
    n = len(prefix)
    for path, buffer in zip(paths, buffers, strict=False):
        if len(path) > n and tuple(path[:n]) == prefix and isinstance(path[n], str):
            placed[path[n]] = buffer if len(path) == n + 1 else None
    return placed


def _html_field(value: Any, key: str, private: bool, notes: Notes, where: str) -> str | None:
    """A field the frontend renders as HTML, cleaned. Only text is: the
    frontend would turn a list or object into markup (``String(value)``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise WidgetRefused(f"the {key} of {where} is rendered as HTML and must be text, not {type(value).__name__}")
    return clean_html(value, private=private, notes=notes, where=where)


def _clean_description(
    comm: _Comm, out: dict[str, Any], placed: Mapping[str, bytes | None], private: bool, notes: Notes, where: str
) -> None:
    """``description`` is HTML when ``description_allow_html`` is true as
    JavaScript sees it (``1``, ``"yes"``); it is sent on as a real bool, and a
    later switch to HTML re-sends the description already sent, cleaned."""
    allow_was = comm.allow_html
    if "description_allow_html" in out:
        comm.allow_html = js_truthy(out["description_allow_html"])
        out["description_allow_html"] = comm.allow_html
    if "description" in placed:
        raise WidgetRefused("a widget's description must be text, not a binary buffer")
    if "description" in out:
        description = out["description"]
        if description is not None and not isinstance(description, str):
            raise WidgetRefused(f"a widget's description must be text, not {type(description).__name__}")
        comm.description = description or ""
    if comm.allow_html and ("description" in out or not allow_was):
        out["description"] = _html_field(comm.description, "description", private, notes, where)


def _check_media_url(comm: _Comm, out: Mapping[str, Any], placed: Mapping[str, bytes | None], private: bool) -> None:
    """Image, Video and Audio with ``format="url"`` load the URL their ``value``
    buffer holds. It passes the rule for ``<img src>``: in a private session
    only ``data:`` images, so nothing is fetched; the format and the value may
    come in different messages, so a switch to ``url`` without its value is
    refused there too."""
    if "format" in out:
        comm.url_format = out["format"] == "url"
    if not comm.url_format or not ("format" in out or "value" in out or "value" in placed):
        return
    buffer = placed.get("value")
    if buffer is None:
        if private:
            raise WidgetRefused(f"{comm.model_name} loads no URL in a private session (its format is 'url')")
        return
    url = buffer.decode("utf-8", "replace")
    if not image_ok(url, private=private):
        raise WidgetRefused(
            f"{comm.model_name} with format 'url' cannot load {describe_url_removal(url, private=private)}"
        )


def _clean_style_values(out: dict[str, Any], private: bool, notes: Notes, where: str) -> dict[str, Any]:
    """A style or layout model's values become CSS properties
    (``style.setProperty``): each passes the CSS cleaner, so nothing runs and
    nothing is fetched (``background: url(...)``), in any session. A value that
    cannot be cleaned in place is sent as ``None``, which removes the property."""
    for key, value in out.items():
        if key in _STYLE_NON_CSS_KEYS or value is None or isinstance(value, (bool, int, float)):
            continue
        if not isinstance(value, str):
            raise WidgetRefused(f"the style value {key[:40]!r} of {where} must be text, not {type(value).__name__}")
        out[key] = clean_css(value, private=private, notes=notes, where=f"{where} {key[:40]}")
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
            lines = [text_of(line) for line in tb[:1000]] if isinstance(tb, list) else []
            fix = defang_text if private else (lambda t: t)
            clean.append(
                {
                    "output_type": "error",
                    "ename": fix(text_of(item.get("ename", "Error"), 200)),
                    "evalue": fix(text_of(item.get("evalue", ""), 100_000)),
                    "traceback": [fix(line) for line in lines],
                }
            )
        else:
            notes.add(f"an Output widget's {text_of(kind, 40)!r} output dropped")
    return clean
