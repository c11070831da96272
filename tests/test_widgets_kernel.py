"""ipywidgets through the sandbox, driven as a frontend drives them (jupyter_client).

The frontend side is played by hand here, message by message, as JupyterLab's
widget manager sends them; tests/browser/test_widgets_browser.py moves a real
slider in JupyterLab. Attacks: a widget's HTML, a switch to HTML descriptions,
a module from elsewhere, comms for other targets, the kernel's own comm,
floods and oversized messages, links once private.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import Run, SandboxKernelHandle, require_bwrap

pytest.importorskip("ipywidgets")

VIEW = "application/vnd.jupyter.widget-view+json"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxKernelHandle]:
    require_bwrap()
    root = tmp_path_factory.mktemp("widgets")
    (root / "ws").mkdir()
    (root / "tmp").mkdir()
    handle = SandboxKernelHandle(root / "ws", root / "tmp", extra_args=["--SandboxKernel.backend=bwrap"])
    yield handle
    handle.shutdown()


def opened(run: Run, model: str) -> list[dict[str, Any]]:
    return [c for c in run.of("comm_open") if c["data"].get("state", {}).get("_model_name") == model]


def comm_id_of(run: Run, model: str) -> str:
    found = opened(run, model)
    assert found, (
        f"no {model} opened; comm_opens: {[c['data']['state'].get('_model_name') for c in run.of('comm_open')]}"
    )
    return str(found[-1]["comm_id"])


def send(
    handle: SandboxKernelHandle,
    msg_type: str,
    content: dict[str, Any],
    buffers: list[bytes] | None = None,
    metadata: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Send a frontend comm message and collect the iopub messages it caused
    (until the kernel is idle again)."""
    msg = handle.kc.session.msg(msg_type, content, metadata=metadata)
    handle.kc.session.send(handle.kc.shell_channel.socket, msg, buffers=buffers or [])
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            reply = handle.kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if reply["msg_type"] == "status":
            if reply["content"]["execution_state"] == "idle":
                return got
            continue
        got.append(reply)
    raise AssertionError(f"no idle after {msg_type}")


def update(handle: SandboxKernelHandle, comm_id: str, state: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    return send(
        handle, "comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}}, **kw
    )


def test_slider_round_trip(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import ipywidgets as w\n"
        "s = w.IntSlider(value=3, description='n')\n"
        "s.observe(lambda ch: print('changed to', ch['new']), 'value')\n"
        "s"
    )
    assert run.status == "ok", run.reply
    cid = comm_id_of(run, "IntSliderModel")
    state = opened(run, "IntSliderModel")[0]["data"]["state"]
    assert state["value"] == 3 and state["_view_module"] == "@jupyter-widgets/controls"
    assert run.result is not None and run.result[VIEW]["model_id"] == cid
    echoed = update(kernel, cid, {"value": 7})
    streams = [m["content"]["text"] for m in echoed if m["msg_type"] == "stream"]
    assert "changed to 7\n" in streams  # the observer ran in the sandbox, its print has the comm_msg as parent
    assert kernel.run("s.value").result == {"text/plain": "7"}  # and the namespace kept it
    assert "No such comm" not in run.stderr


def test_interact_output_follows_the_slider(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("from ipywidgets import interact\n_ = interact(lambda x: print('twice', 2 * x), x=5)")
    assert run.status == "ok", run.reply
    slider = comm_id_of(run, "IntSliderModel")
    got = update(kernel, slider, {"value": 12})
    out_updates = [
        m["content"]["data"]["state"]
        for m in got
        if m["msg_type"] == "comm_msg" and "msg_id" in m["content"]["data"].get("state", {})
    ]
    parent_id = got[0]["parent_header"]["msg_id"]
    # the Output widget captures the outputs of this very message, as in ipykernel
    assert {"msg_id": parent_id} in out_updates and {"msg_id": ""} in out_updates
    assert any(m["msg_type"] == "stream" and m["content"]["text"] == "twice 24\n" for m in got)


def test_binary_buffers_both_ways(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(f"import ipywidgets as w\nimg = w.Image(value={PNG!r}, format='png')")
    open_msg = [
        m
        for m in run.messages
        if m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("_model_name") == "ImageModel"
    ]
    assert open_msg and [bytes(b) for b in open_msg[0]["buffers"]] == [PNG]
    assert open_msg[0]["content"]["data"]["buffer_paths"] == [["value"]]
    cid = open_msg[0]["content"]["comm_id"]
    new = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
    send(
        kernel,
        "comm_msg",
        {"comm_id": cid, "data": {"method": "update", "state": {}, "buffer_paths": [["value"]]}},
        buffers=[new],
    )
    assert kernel.run("bytes(img.value)[-3:], len(img.value)").result == {"text/plain": "(b'\\xc5\\xc6\\xc7', 208)"}


def test_control_comm_and_comm_info_find_the_widgets(kernel: SandboxKernelHandle) -> None:
    """What a reloaded JupyterLab page does to get its widgets back."""
    run = kernel.run("import ipywidgets as w\nkeep = w.Checkbox(value=True, description='keep')")
    cid = comm_id_of(run, "CheckboxModel")
    msg_id = kernel.kc.comm_info(target_name="jupyter.widget")
    info = kernel.kc.get_shell_msg(timeout=30)
    assert info["parent_header"]["msg_id"] == msg_id
    assert info["content"]["comms"][cid] == {"target_name": "jupyter.widget"}
    control = f"control-{time.monotonic_ns()}"
    opening = {"comm_id": control, "target_name": "jupyter.widget.control", "data": {}}
    assert send(kernel, "comm_open", opening, metadata={"version": "1.0.0"}) == []
    got = send(kernel, "comm_msg", {"comm_id": control, "data": {"method": "request_states"}})
    states = [m["content"]["data"] for m in got if m["msg_type"] == "comm_msg"]
    assert states and states[0]["method"] == "update_states"
    assert states[0]["states"][cid]["state"]["value"] is True


def test_tqdm_auto_is_a_widget_progress_bar(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("from tqdm.auto import tqdm\nfor _ in tqdm(range(3)): pass")
    assert run.status == "ok", run.reply
    models = {c["data"]["state"].get("_model_name") for c in run.of("comm_open")}
    assert {"FloatProgressModel", "HTMLModel", "HBoxModel"} <= models, models
    assert any(VIEW in c["data"] for c in run.of("display_data"))


# ---- attacks ----------------------------------------------------------------------------
def test_html_widget_value_is_cleaned(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import ipywidgets as w\n"
        "h = w.HTML(value='<b>bold</b><img src=x onerror=\"alert(1)\"><script>alert(2)</script>')\n"
        "h.value = '<a href=\"javascript:alert(3)\">x</a><svg onload=alert(4)>'"
    )
    value = opened(run, "HTMLModel")[0]["data"]["state"]["value"]
    assert "<b>bold</b>" in value and "onerror" not in value and "<script" not in value
    updates = [c["data"]["state"]["value"] for c in run.of("comm_msg") if "value" in c["data"].get("state", {})]
    assert updates and all("javascript:" not in v and "onload" not in v for v in updates)


def test_description_switched_to_html_is_cleaned(kernel: SandboxKernelHandle) -> None:
    """The description is sent as text first, then HTML is switched on: the
    frontend would render the text already sent as HTML."""
    run = kernel.run(
        "import ipywidgets as w\n"
        "c = w.Checkbox(description='<img src=x onerror=\"alert(1)\">ok')\n"
        "c.description_allow_html = True"
    )
    switch = [c["data"]["state"] for c in run.of("comm_msg") if "description_allow_html" in c["data"].get("state", {})]
    assert switch and switch[0]["description_allow_html"] is True
    assert "onerror" not in switch[0]["description"] and "ok" in switch[0]["description"]


def test_modules_from_elsewhere_are_refused(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import ipywidgets as w, traitlets as t\n"
        "class Evil(w.DOMWidget):\n"
        "    _view_module = t.Unicode('https://cdn.evil.example/widget.js').tag(sync=True)\n"
        "    _view_name = t.Unicode('EvilView').tag(sync=True)\n"
        "evil = Evil()\n"
        "evil"
    )
    assert run.status == "ok", run.reply
    assert not [c for c in run.of("comm_open") if "evil" in str(c).lower()]
    assert "is not installed in this Jupyter server" in run.stderr
    assert run.result is not None and VIEW not in run.result  # its view names no widget of this session


def test_comms_for_other_targets_and_the_kernels_own_are_unreachable(kernel: SandboxKernelHandle) -> None:
    from kernel_helpers import status_of

    status_of(kernel)  # the status comm is open
    status_ids = [cid for cid, c in kernel_comm_targets(kernel).items() if c == "sandbox_kernel.status"]
    assert status_ids
    run = kernel.run(
        "from comm import create_comm\n"
        "a = create_comm(target_name='sandbox_kernel.status', data={'type': 'state', 'state': {'sensitivity': 'PUBLIC'}})\n"
        f"b = create_comm(comm_id={status_ids[0]!r}, target_name='jupyter.widget', data={{'state': {{}}}})\n"
        f"b.comm_id = {status_ids[0]!r}\n"
        "b.send({'type': 'state', 'state': {'sensitivity': 'PUBLIC', 'network': 'full'}})"
    )
    assert run.status == "ok", run.reply
    assert run.of("comm_open") == [] and run.of("comm_msg") == []
    assert "may open comms only for widgets" in run.stderr  # a
    assert "already open" in run.stderr  # b's open, on the status comm's id
    assert "not a widget of this session" in run.stderr  # b's message
    assert status_of(kernel)["level"] == "PUBLIC"  # the kernel's comms still answer the frontend


def kernel_comm_targets(handle: SandboxKernelHandle) -> dict[str, str]:
    handle.kc.comm_info()
    reply = handle.kc.get_shell_msg(timeout=30)
    return {cid: c["target_name"] for cid, c in reply["content"]["comms"].items()}


def test_oversized_and_flooding_widget_messages_are_dropped(kernel: SandboxKernelHandle) -> None:
    run = kernel.run("import ipywidgets as w\nbig = w.Text(value='x' * (9 * 1024 * 1024))")
    assert run.status == "ok" and not opened(run, "TextModel")
    assert "over the limit" in run.stderr
    run = kernel.run("small = w.IntText()\nfor i in range(3000): small.value = i\nprint('done')")
    assert run.status == "ok" and "done" in run.stdout
    assert len(run.of("comm_msg")) < 2000 and "widget messages a second" in run.stderr
    assert kernel.run("small.value").result == {"text/plain": "2999"}


def test_output_widget_outputs_pass_the_output_policy(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import ipywidgets as w\n"
        "o = w.Output()\n"
        "o.outputs = ({'output_type': 'display_data', 'metadata': {},\n"
        "              'data': {'text/html': '<img src=x onerror=alert(1)>', 'application/javascript': 'alert(2)'}},)"
    )
    outputs = [c["data"]["state"]["outputs"] for c in run.of("comm_msg") if "outputs" in c["data"].get("state", {})]
    assert outputs and outputs[-1][0]["data"].keys() == {"text/html"}
    assert "onerror" not in outputs[-1][0]["data"]["text/html"]


def test_frontend_messages_for_unknown_comms_never_reach_the_sandbox(kernel: SandboxKernelHandle) -> None:
    kernel.run("import ipywidgets as w\nprobe = w.IntSlider()\nseen = []\nprobe.observe(lambda c: seen.append(1))")
    got = send(kernel, "comm_msg", {"comm_id": "f" * 32, "data": {"method": "update", "state": {"value": 1}}})
    assert got == []
    got = send(kernel, "comm_msg", {"comm_id": "../../x", "data": {}})
    assert got == []
    assert kernel.run("len(seen)").result == {"text/plain": "0"}


def test_links_are_defanged_once_private(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        assert handle.run("%private payroll").status == "ok"
        run = handle.run(
            "import ipywidgets as w\n"
            "h = w.HTML(value='<a href=\"https://evil.example/?d=1\">x</a> https://evil.example/?d=2')\n"
            "t = w.Text(value='see https://evil.example/?d=3')"
        )
        text = str(run.of("comm_open"))
        assert "evil.example" in text and "https://evil" not in text
    finally:
        handle.shutdown()


def test_widgets_made_while_public_are_not_shown_once_private(tmp_path: Path) -> None:
    """Widgets made while public and never shown held image addresses; after
    the rise (PROXIED: the same sandbox and comms) a cell showing one of them
    per bit of a secret made the browser fetch that address (an attack
    review). Widgets with nothing to fetch go on as before."""
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=bwrap"])
    try:
        run = handle.run(
            "import ipywidgets as w\n"
            "imgs = [w.HTML(f'<img src=\"//127.0.0.1:9/leak-{i}\">') for i in range(4)]\n"
            "s = w.IntSlider(value=3)"
        )
        assert len(opened(run, "HTMLModel")) == 4 and "leak-2" in str(run.of("comm_open"))
        slider = comm_id_of(run, "IntSliderModel")
        assert handle.run("%private payroll").status == "ok"
        run = handle.run("display(imgs[2])\nbox = w.VBox([imgs[1]])\ndisplay(s)\nprint('shown')")
        assert run.status == "ok" and "shown" in run.stdout
        views = [d["data"][VIEW]["model_id"] for d in run.of("display_data") if VIEW in d["data"]]
        assert views == [slider], views  # the slider shows; the image widget is text only
        assert "made while the session was public" in run.stderr, run.stderr
        assert opened(run, "VBoxModel") == []
        # made once private, an image widget is cleaned as private and shows
        run = handle.run("display(w.HTML('<img src=\"//127.0.0.1:9/leak-9\">'))")
        assert [d for d in run.of("display_data") if VIEW in d["data"]], run.stderr
        assert "127.0.0.1:9/leak-9" not in str(run.of("comm_open"))
    finally:
        handle.shutdown()


def test_forged_comm_frames_are_refused(kernel: SandboxKernelHandle) -> None:
    """A cell writing comm frames to the channel itself, malformed on purpose."""
    run = kernel.run(
        "import sys\n"
        "ch = sys.modules['sandbox_kernel_worker.comms']._channel\n"
        "def forge(kind, content, buffers):\n"
        "    ch.send({'type': 'comm', 'msg_type': kind, 'content': content, 'metadata': {}, 'buffers': buffers})\n"
        "opening = {'comm_id': 'abc', 'target_name': 'jupyter.widget', 'data': {'state': {}}}\n"
        "forge('comm_open', opening, 'zz')\n"
        "forge('comm_open', opening, ['!!not base64'])\n"
        "forge('execute_request', {}, [])\n"
        "forge('comm_open', 'x', [])\n"
        "print('sent')"
    )
    assert run.status == "ok" and "sent" in run.stdout
    assert run.of("comm_open") == []
    for problem in ("buffers must be a list of base64 strings", "unknown comm message kind", "must be objects"):
        assert problem in run.stderr, (problem, run.stderr)
    assert kernel.run("print('serving')").stdout == "serving\n"


def test_a_cell_queued_behind_a_slow_widget_message_goes_idle_as_itself(kernel: SandboxKernelHandle) -> None:
    """A widget message that arrives while a cell runs is handled beside it and waits
    for the sandbox; the next cell must still get its own busy/idle. (ipykernel 7
    restored the parent it saw when the comm arrived, so the next cell's idle named
    the previous one and JupyterLab's prompt stayed [*]: seen after a restart, when
    the widget manager's comms and the first cell arrive together.)"""
    run = kernel.run("import ipywidgets as w, time\nslow = w.Button()\nslow.on_click(lambda b: time.sleep(1.5))")
    cid = comm_id_of(run, "ButtonModel")
    kc = kernel.kc
    first = kc.execute("time.sleep(0.5)")
    time.sleep(0.2)  # `first` holds the shell: the click is dispatched beside it
    click = kc.session.msg("comm_msg", {"comm_id": cid, "data": {"method": "custom", "content": {"event": "click"}}})
    kc.session.send(kc.shell_channel.socket, click)
    second = kc.execute("print('second')")
    idle: set[str] = set()
    deadline = time.monotonic() + 60
    while second not in idle and time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle.add(msg["parent_header"].get("msg_id", ""))
    assert {first, second} <= idle, f"idle seen for {idle}; first={first}, second={second}"
    replies = {}
    while len(replies) < 2:
        reply = kc.get_shell_msg(timeout=30)
        replies[reply["parent_header"]["msg_id"]] = reply["content"]["status"]
    assert replies == {first: "ok", second: "ok"}
