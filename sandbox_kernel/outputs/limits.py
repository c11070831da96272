"""Per-cell output budget.

A cell printing 200 MB (or displaying a 500 MB image) would otherwise be
forwarded in full: the kernel would hold it, the notebook file would grow,
and the browser would freeze rendering it. The limiter forwards output until
the cell's budget is spent, then discards the rest and counts what it dropped
so the user can be told exactly how much was cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .sizing import json_size, utf8_len


def format_bytes(n: int) -> str:
    """``187.3 MB`` style sizes (binary units, as the limits are set)."""
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    if n >= 1 << 60:  # any int says a size: beyond floats, whole MB
        return f"{n >> 20:,} MB"
    return f"{n / (1024 * 1024):.1f} MB"


def bundle_size(data: Mapping[str, Any]) -> int:
    """Bytes a bundle occupies on the wire: UTF-8 text, JSON values serialised."""
    size = 0
    for mime, value in data.items():
        size += utf8_len(str(mime))
        size += json_size(value) if value is not None else 4
    return size


#: what a message without data (``clear_output``) is charged: its wire size,
#: roughly (a cell sending 200,000 of them kept the host busy for 30 s)
MESSAGE_COST = 256


class OutputLimiter:
    """Per-cell output budget so a cell printing 200 MB cannot take the kernel (or the browser) down.

    Stream text and display bundles share one budget of ``max_bytes``. A single
    bundle over ``max_bundle_bytes`` is refused outright; a smaller one is
    admitted while the budget is not yet spent (so one large figure still shows
    even if it is bigger than the text budget), and its size is charged to it.
    One limiter serves one cell; make a new one per execution.
    """

    def __init__(self, max_bytes: int = 10 * 1024 * 1024, max_bundle_bytes: int = 20 * 1024 * 1024) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_bundle_bytes = max(0, int(max_bundle_bytes))
        self.used = 0
        self.discarded = 0
        self.refused_bundles = 0
        self.largest_refused = 0

    def admit_text(self, text: str) -> str | None:
        """The part of ``text`` to forward: all of it while within budget, the
        part that fits when crossing it, None once nothing more is to be sent."""
        n = utf8_len(text)
        room = self.max_bytes - self.used
        if n <= room:
            self.used += n
            return text
        if room <= 0:
            self.discarded += n
            return None
        # Non-ASCII text is cut on a character boundary.
        head = text[:room] if text.isascii() else text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        kept = utf8_len(head)
        self.used = self.max_bytes
        self.discarded += n - kept
        return head or None

    def admit_bundle(self, data: Mapping[str, Any]) -> bool:
        """Whether to forward this display bundle; its size is charged to the budget."""
        return self.admit_size(bundle_size(data))

    def admit_size(self, size: int) -> bool:
        """Whether to forward a message of ``size`` bytes (a bundle, a widget
        message); its size is charged to the budget."""
        if size > self.max_bundle_bytes:
            self.discarded += size
            self.refused_bundles += 1
            self.largest_refused = max(self.largest_refused, size)
            return False
        if self.used >= self.max_bytes and size > 0:
            self.discarded += size
            self.refused_bundles += 1
            return False
        self.used += size
        return True

    @property
    def truncated(self) -> bool:
        """True once anything was cut or refused."""
        return self.discarded > 0 or self.refused_bundles > 0

    def truncation_note(self) -> str | None:
        """A note to show at the end of the cell's output; None when nothing was cut."""
        if not self.truncated:
            return None
        note = (
            f"[sandbox_kernel: output truncated; {format_bytes(self.discarded)} more were discarded "
            f"(limit {format_bytes(self.max_bytes)} per cell, set SandboxKernel.max_output_bytes)"
        )
        if self.largest_refused:
            note += (
                f"; a display of {format_bytes(self.largest_refused)} was over the "
                f"{format_bytes(self.max_bundle_bytes)} limit per display"
            )
        return note + "]"
