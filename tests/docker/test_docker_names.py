"""Container names never mix two (user, session) pairs up (no daemon needed).

Ids may contain ``-``, the separator of the name's parts: ``alice-x``/``s`` and
``alice``/``x-s`` once shared a name, so one user's persistent session was
refused, or another user's container removed as this one's stale one.
"""

from __future__ import annotations

import itertools
import re

from sandbox_kernel.docker.names import container_name

#: every id of up to three characters over an alphabet with the separator
_IDS = ["".join(chars) for n in (1, 2, 3) for chars in itertools.product("a-", repeat=n) if chars[0] != "-"]


def test_the_reported_pairs_get_different_names() -> None:
    assert container_name("p", "alice-x", "s") != container_name("p", "alice", "x-s")


def test_no_two_pairs_share_a_persistent_name() -> None:
    names: dict[str, tuple[str, str]] = {}
    for pair in itertools.product(_IDS, repeat=2):
        name = container_name("p", *pair)
        assert names.setdefault(name, pair) == pair, f"{pair} and {names[name]} are both {name!r}"


def _splits(text: str) -> list[tuple[str, str]]:
    """Every (user, session) pair whose ``<user>-<session>`` reads ``text``."""
    return [
        (text[:i], text[i + 1 :])
        for i, char in enumerate(text)
        if char == "-" and text[:i][:1] not in ("", "-") and text[i + 1 :][:1] not in ("", "-")
    ]


def test_no_persistent_name_is_an_ephemeral_one() -> None:
    """A persistent name is ``p-<user>-<session>`` maybe followed by
    ``-<12 hex>``, so any pair that could own an ephemeral name as its
    persistent one is a split of that name: none of them does."""
    for pair in itertools.product(_IDS, repeat=2):
        ephemeral = container_name("p", *pair, ephemeral=True)
        text = ephemeral[len("p-") :]
        for candidate in _splits(text) + _splits(text[: -len("-0123456789ab")]):
            assert container_name("p", *candidate) != ephemeral, (pair, candidate)


def test_names_stay_readable_and_valid_for_docker() -> None:
    assert container_name("p", "alice", "s1") == "p-alice-s1"  # ids without '-': as before
    hashed = container_name("p", "alice-x", "s")
    assert re.fullmatch(r"p-alice-x-s-[0-9a-f]{12}", hashed)
    assert container_name("p", "alice-x", "s") == hashed  # stable: a persistent session finds its container
    for pair in itertools.product(_IDS, repeat=2):
        assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", container_name("p", *pair, ephemeral=True))
