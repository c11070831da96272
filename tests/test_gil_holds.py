"""No single call over what a sandbox sent may hold the GIL for long.

The cut watchdog (``engine/cut_watchdog.py``) is a thread: when the event loop
is busy with a sandbox's outputs, it cuts a risen sandbox's network, but only
once it gets the GIL. Python code gives the GIL up every few milliseconds; one
long C call (``json.dumps``, ``str()`` of a list, one regular-expression pass)
does not. An attack review measured each of the calls below at the sizes a
sandbox may send: each held it 0.8 to 1.4 s, so a rise could be acted on that
much late. Each now goes a slice, a window or a Python call at a time.

These are timings of a security bound (how long the cut can wait), not of
speed: with each input the old call held the GIL 1.05 to 2.6 s (on the
machine this was written on), the new ones 5 to 80 ms; the bound is 0.6 s.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from frames import read_frame

from sandbox_kernel.engine.channel import MAX_FRAME
from sandbox_kernel.outputs import _policy
from sandbox_kernel.outputs import sizing as sizes
from sandbox_kernel.outputs._policy import Notes, clean_css, normalise_url
from sandbox_kernel.outputs.replies import plain_text
from sandbox_kernel.outputs.sizing import encoded_size, json_size, text_of
from sandbox_kernel.outputs.widgets import WidgetRefused, _comm_id, message_size
from sandbox_kernel.terminal_text import terminal_safe_message, terminal_safe_output

#: the longest the GIL may be held in one call (the poll interval is 0.25 s)
BOUND = 0.6
MB = 1024 * 1024


def longest_hold(call: Callable[[], Any]) -> tuple[float, Any]:
    """The longest stretch a thread waiting for the GIL could not run while
    ``call`` ran, and what ``call`` returned."""
    stop = threading.Event()
    longest = [0.0]
    ready = threading.Event()

    def sample() -> None:
        last = time.perf_counter()
        ready.set()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            longest[0] = max(longest[0], now - last)
            last = now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ready.wait()
    try:
        result = call()
    finally:
        stop.set()
        sampler.join()
    return longest[0], result


def _floats(n: int) -> list[float]:
    return [random.random() for _ in range(n)]


def test_sizing_a_million_floats_lets_other_threads_run() -> None:
    values = _floats(3_000_000)  # json.dumps held the GIL 1.2 s
    hold, size = longest_hold(lambda: json_size({"metadata": {"points": values}}))
    assert size == len(json.dumps({"metadata": {"points": values}}, ensure_ascii=False).encode())
    assert hold < BOUND, f"json_size held the GIL {hold:.2f} s"
    hold, size = longest_hold(lambda: message_size({"data": {"state": {"x": values}}}, [b"12"]))
    assert hold < BOUND, f"message_size held the GIL {hold:.2f} s"


def test_an_error_value_that_is_a_list_is_not_turned_into_text() -> None:
    values = _floats(3_000_000)  # str() held the GIL 1.1 s
    hold, text = longest_hold(lambda: plain_text(values))
    assert hold < BOUND, f"plain_text held the GIL {hold:.2f} s"
    assert text == "(list of 3000000 entries, not text)"
    error = {"ename": "E", "evalue": values, "traceback": [values, "line"]}
    hold, content = longest_hold(lambda: terminal_safe_message("error", error))
    assert hold < BOUND, f"terminal_safe_message held the GIL {hold:.2f} s"
    assert content["evalue"] == "(list of 3000000 entries, not text)"
    assert content["traceback"] == ["(list of 3000000 entries, not text)", "line"]
    # every text field of a message says what was wrong without str() of it: a comm id
    hold, refused = longest_hold(lambda: _refusal(lambda: _comm_id({"comm_id": values})))
    assert hold < BOUND, f"refusing the comm id held the GIL {hold:.2f} s"
    assert "not '(list of 3000000 entries, not text)'" in refused, refused


def _refusal(call: Callable[[], Any]) -> str:
    try:
        call()
    except WidgetRefused as exc:
        return str(exc)
    raise AssertionError("not refused")


def test_a_frame_of_long_integers_lets_other_threads_run() -> None:
    digits = b"9" * 4300  # the longest Python reads; each costs quadratic time
    body = b'{"type": "stream", "name": "stdout", "text": "x", "n": [' + b",".join([digits] * 15_000) + b"]}"
    assert len(body) <= MAX_FRAME

    hold, msg = longest_hold(lambda: read_frame(body))  # json.loads held it 1.05 s
    assert hold < BOUND, f"reading the frame held the GIL {hold:.2f} s"
    assert len(msg["n"]) == 15_000 and msg["n"][0] == int(digits)


def test_a_long_link_is_normalised_a_window_at_a_time() -> None:
    url = "a \t" * (20 * MB)  # 60 MB: one substitution held the GIL 1.7 s
    hold, norm = longest_hold(lambda: normalise_url(url))
    assert hold < BOUND, f"normalise_url held the GIL {hold:.2f} s"
    assert norm == "a" * (20 * MB)


def test_a_stream_of_controls_for_an_agent_lets_other_threads_run() -> None:
    text = "\x01" * (30 * MB)  # one substitution held the GIL 2.6 s
    hold, clean = longest_hold(lambda: terminal_safe_output(text, keep_colours=False))
    assert hold < BOUND, f"terminal_safe_output held the GIL {hold:.2f} s"
    assert clean == ""


def test_a_style_too_large_to_clean_is_removed_at_once() -> None:
    css = "-" * (20 * MB) + "src(x)"  # a pass over it held the GIL 1.1 s
    notes = Notes()
    hold, clean = longest_hold(lambda: clean_css(css, private=False, notes=notes, where="an output"))
    assert hold < BOUND, f"clean_css held the GIL {hold:.2f} s"
    assert clean is None
    assert any("too large to clean" in note for note in notes.items), notes.items
    # a large style a table really has is still cleaned and kept
    table = "".join(
        f"#T_row{i}_col{j} {{ background-color: #{i % 256:02x}20{j:02x}; }}\n" for i in range(40_000) for j in range(2)
    )
    assert len(table) < _policy.MAX_CSS_CHARS
    assert clean_css(table, private=False, notes=Notes(), where="an output") == table


def test_a_markdown_style_too_large_once_escaped_says_so() -> None:
    # markdown's style is also checked escaped (a renderer may escape its
    # quotes), which can make it six times as long: past the limit, it goes
    # for that reason, not for one it does not have
    from sandbox_kernel.outputs.sanitize import sanitize_bundle

    css = "p{font-family:" + '"A",' * 400_000 + '"B"}'  # 1.6 MB, 4.8 MB of quotes once escaped
    assert len(css) < _policy.MAX_CSS_CHARS < len(css) + 5 * css.count('"')
    clean = sanitize_bundle({"text/markdown": f"<style>{css}</style>\n\ntext"})
    assert any("over 5 MB once escaped, too large to clean" in note for note in clean.removed), clean.removed
    assert not any("could turn it into something unsafe" in note for note in clean.removed), clean.removed
    assert "text" in clean.data["text/markdown"]


# ---- the new ways give the old results ----------------------------------------------------


def _value(depth: int = 0) -> Any:
    pick = random.random()
    if depth > 4 or pick < 0.5:
        return random.choice(
            [
                None,
                True,
                False,
                random.randint(-(10**30), 10**30),
                random.random() * 10 ** random.randint(-300, 300),
                float("nan"),
                float("inf"),
                "".join(random.choice('ab"\\\n\x01é\ud800€😀') for _ in range(random.randint(0, 9))),
            ]
        )
    if pick < 0.75:
        return [_value(depth + 1) for _ in range(random.randint(0, 6))]
    return {
        "".join(random.choice('k"é\n') for _ in range(random.randint(0, 4))): _value(depth + 1)
        for _ in range(random.randint(0, 6))
    }


@pytest.mark.parametrize("slice_size", [1, 3, 4096])
def test_sizes_are_those_of_json_dumps(slice_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizes, "SLICE", slice_size)
    random.seed(slice_size)
    for _ in range(3000):
        value = _value()
        expected = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        assert encoded_size(value) == expected, value
    assert encoded_size({1: 2, None: [1.5], 2.5: "x", False: {}}) == len(
        json.dumps({1: 2, None: [1.5], 2.5: "x", False: {}})
    )
    assert encoded_size((1, [2, (3,)])) == len(json.dumps((1, [2, (3,)])))
    assert encoded_size([(), (), [], {}, ""]) == len(json.dumps([(), (), [], {}, ""]))  # (one empty tuple object)


def test_what_json_cannot_hold_is_over_any_budget() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert json_size(loop) == 1 << 62
    assert json_size({"x": object()}) == 1 << 62
    assert json_size({1: "a", "1": "b"}) == 1 << 62  # keys JSON writes alike
    shared = [1]
    assert json_size([shared, shared]) == 1 << 62  # (a parsed frame never shares)
    assert json_size(None) == 0 and json_size("é") == 2  # as before: bare text, its UTF-8 bytes


def test_no_call_sizes_more_than_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = json.dumps

    def counting(value: Any, **kwargs: Any) -> str:
        seen.append(_count(value))
        return real(value, **kwargs)

    monkeypatch.setattr(sizes.json, "dumps", counting)
    value = {"a": _floats(50_000), "b": [{"x": 1.5, "y": [1, 2]} for _ in range(20_000)], "c": [[[_floats(9000)]]]}
    assert encoded_size(value) == len(real(value))
    assert max(seen) <= 2 * sizes.SLICE + 1, max(seen)


def _count(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_count(v) for v in value.values())
    if isinstance(value, list | tuple):
        return 1 + sum(_count(v) for v in value)
    return 1


def test_text_of_keeps_what_is_text() -> None:
    assert text_of("abc", 2) == "ab"
    assert text_of(12) == "12" and text_of(None) == "None" and text_of(1.5, 2) == "1."
    assert text_of(["a", 1]) == "['a', 1]"  # small: as str() writes it
    assert text_of(list(range(100)), 50) == "(list of 100 entries, not text)"


def test_normalised_links_are_the_same_window_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    random.seed(7)
    values = ["".join(random.choice("a\\ \t\n\x00\x7f:/j") for _ in range(random.randint(0, 40))) for _ in range(3000)]
    whole = [normalise_url(v) for v in values]
    monkeypatch.setattr(_policy, "URL_WINDOW", 3)
    assert [normalise_url(v) for v in values] == whole
