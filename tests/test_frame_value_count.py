"""The host counts a frame's JSON values before parsing it, in windows.

A frame over the value limit is not parsed (``engine/channel.py``,
``json_values``). Counting cut every string out of the whole frame in one
``re.sub``: on a 64 MB frame of short strings that one C call held the GIL
5.4 s, and the cut watchdog's thread, which takes a risen sandbox's network
while the kernel's loop is busy, could not run meanwhile (an attack this
stop). The count now looks at ``WINDOW`` bytes per call; it must give the
same answer as the whole-frame count, strings cut by a window's end
included.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from sandbox_kernel.engine import channel
from sandbox_kernel.engine.channel import json_values


def _whole_frame_count(body: bytes) -> int:
    """The count as it was made before: every string cut out at once."""
    bare = channel._STRING.sub(b'""', body)
    return bare.count(b"{") + bare.count(b"[") + bare.count(b",")


def _random_json(rnd: random.Random, depth: int = 0) -> Any:
    r = rnd.random()
    if depth > 4 or r < 0.3:
        return rnd.choice([1, "a,b", 'q"u,o{t[e', "\\", "\\\\,", "x" * rnd.randint(0, 40), None, ",,,", "é[,"])
    if r < 0.65:
        return [_random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 6))]
    return {f"{rnd.random()},[": _random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 5))}


@pytest.mark.parametrize("window", [2, 3, 5, 64, channel.WINDOW])
def test_the_windowed_count_is_the_whole_frame_count(window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "WINDOW", window)
    rnd = random.Random(window)
    frames = [json.dumps(_random_json(rnd)).encode() for _ in range(1500)]
    frames += [b'"' + b"\\" * 2 * n + b'"' for n in range(6)]  # backslashes on every window boundary
    frames += [b'["' + b"a\\\\" * n + b'", "' + b"\\\\" * n + b',"]' for n in range(1, 9)]
    for body in frames:
        expected = _whole_frame_count(body)
        # a limit the frame reaches but does not pass: every window is counted
        assert json_values(body, expected) == expected, body
        # one it passes: the count may stop early, over the limit
        assert json_values(body, expected - 1) > expected - 1, body


def test_a_frame_that_is_not_json_ends_the_count() -> None:
    """A string never closed (the parser then refuses the frame) ends the
    count with what came before it, also when it spans windows."""
    for body, before in ((b'["abc', 1), (b'["ab\\', 1), (b'["a", "b\\"]', 2), (b'"' + b"x," * channel.WINDOW, 0)):
        assert json_values(body, -1) == before, body


class _Recorder:
    """Stands in for a compiled pattern and remembers how much each call looked at."""

    def __init__(self, pattern: re.Pattern[bytes], spans: list[int]) -> None:
        self.pattern, self.spans = pattern, spans

    def match(self, body: bytes, pos: int, end: int) -> re.Match[bytes] | None:
        self.spans.append(end - pos)
        return self.pattern.match(body, pos, end)

    def sub(self, repl: bytes, body: bytes) -> bytes:
        self.spans.append(len(body))
        return self.pattern.sub(repl, body)


@pytest.mark.parametrize(
    "body",
    [
        b'["' + b'a","' * (4 * 1024 * 1024) + b'"]',  # short strings (64 MB of them held the GIL 5.4 s)
        json.dumps({"text": "\n".join(f'"{i}","name",{i}' for i in range(1_500_000))}).encode(),  # CSV text
        b'{"a": "' + b'\\",' * (8 * 1024 * 1024) + b'"}',  # one 24 MB string of escapes
    ],
    ids=["short strings", "csv text", "escapes"],
)
def test_no_call_of_the_count_looks_at_more_than_a_window(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    spans: list[int] = []
    for name in ("_STRING", "_WHOLE", "_INSIDE"):
        monkeypatch.setattr(channel, name, _Recorder(getattr(channel, name), spans))
    got = json_values(body, channel.MAX_FRAME_VALUES)
    monkeypatch.undo()
    assert spans, "the strings were never cut out: the frame was under the limit"
    assert max(spans) <= channel.WINDOW, f"one call looked at {max(spans):,} bytes"
    expected = _whole_frame_count(body)
    assert got == expected if expected <= channel.MAX_FRAME_VALUES else got > channel.MAX_FRAME_VALUES
