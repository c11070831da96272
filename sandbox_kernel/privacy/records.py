"""What the privacy store records: named datasets and whole-session marks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .sensitivity import Sensitivity

#: Where private data can enter a session from.
SOURCES: frozenset[str] = frozenset({"cell", "widget", "tool", "connector", "mount", "api", "workspace"})
MAX_NAME_LENGTH = 128
MAX_REASON_LENGTH = 1000  # as the status comm's mark_private


def utc_now_iso() -> str:
    """Now, as ISO 8601 UTC with milliseconds and a ``Z``: ``2024-05-01T12:00:00.000Z``."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def validate_timestamp(value: object, what: str = "added_at") -> str:
    """Return ``value`` in the canonical form of :func:`utc_now_iso` if it is an
    ISO 8601 timestamp in UTC, else raise ``ValueError``. Canonical stamps sort
    as text in time order."""
    if not isinstance(value, str) or not 0 < len(value) <= 40:
        raise ValueError(f"{what} must be an ISO 8601 UTC timestamp string, got {value!r:.60}")
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not an ISO 8601 timestamp") from None
    offset = parsed.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValueError(f"{what} {value!r} is not in UTC")
    if len(value) == 24 and value.endswith("Z") and value[19] == ".":
        return value  # already canonical (the common case: cheap)
    return parsed.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def validate_source(value: object) -> str:
    if isinstance(value, str) and value in SOURCES:
        return value
    raise ValueError(f"source {value!r:.60} is not allowed; allowed: {', '.join(sorted(SOURCES))}")


def validate_name(value: object) -> str:
    """A dataset name: 1-128 printable characters (no control characters)."""
    if not isinstance(value, str):
        raise ValueError(f"dataset name must be a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise ValueError("dataset name is empty: it must be 1-128 printable characters")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"dataset name {value[:40]!r}... is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise ValueError(
            f"dataset name {value!r} contains the non-printable character {bad!r}; names must be printable text"
        )
    return value


_SPACES = str.maketrans({"\n": " ", "\r": " ", "\t": " "})


def validate_reason(value: object) -> str:
    """A mark's reason, normalised: up to 1000 characters (may be empty); line
    breaks and tabs become spaces, other control characters are refused."""
    if not isinstance(value, str):
        raise ValueError(f"reason must be a string, got {type(value).__name__}")
    if len(value) > MAX_REASON_LENGTH:
        raise ValueError(f"reason is {len(value)} characters long; at most {MAX_REASON_LENGTH} are allowed")
    value = value.replace("\r\n", " ").translate(_SPACES)
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise ValueError(f"reason contains the non-printable character {bad!r}")
    return value


def clean_reason(text: str) -> str:
    """Make internal text (an error message) a valid reason."""
    text = "".join(c if c.isprintable() else " " for c in text)
    if len(text) > MAX_REASON_LENGTH:
        text = text[: MAX_REASON_LENGTH - 3] + "..."
    return text


def _level(value: object, what: str) -> Sensitivity:
    level = Sensitivity.parse(value, what)
    if level <= Sensitivity.PUBLIC:
        raise ValueError(
            f"{what} {level.name} is not a private level: private data must be {', '.join(Sensitivity.names()[1:])}"
        )
    return level


def _expect_keys(data: object, what: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object, got {type(data).__name__}")
    missing = keys - data.keys()
    if missing:
        raise ValueError(f"{what} lacks the field(s) {', '.join(sorted(missing))}")
    return data


@dataclass(frozen=True)
class Dataset:
    """One named piece of private data that entered a session.

    ``sensitivity`` is always above PUBLIC: registering public data as private
    is refused, so "has a dataset" and "is private" mean the same thing.
    """

    name: str
    sensitivity: Sensitivity
    added_at: str
    source: str

    def __post_init__(self) -> None:
        validate_name(self.name)
        object.__setattr__(self, "sensitivity", _level(self.sensitivity, "sensitivity"))
        object.__setattr__(self, "added_at", validate_timestamp(self.added_at))
        validate_source(self.source)

    @classmethod
    def create(
        cls, name: str, sensitivity: Sensitivity | str = Sensitivity.CONFIDENTIAL, source: str = "api"
    ) -> Dataset:
        """A dataset added now."""
        return cls(name=name, sensitivity=_level(sensitivity, "sensitivity"), added_at=utc_now_iso(), source=source)

    def to_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "level": self.sensitivity.name,
            "source": self.source,
            "added_at": self.added_at,
        }

    @classmethod
    def from_json(cls, data: object) -> Dataset:
        d = _expect_keys(data, "dataset", {"name", "level", "source", "added_at"})
        return cls(name=d["name"], sensitivity=d["level"], added_at=d["added_at"], source=d["source"])


@dataclass(frozen=True)
class SessionMark:
    """The whole session was declared private, without a named dataset.

    Set by :meth:`PrivateData.mark_private` (e.g. the widget's button) and by
    the store itself when it found its file unreadable (level SECRET).
    """

    sensitivity: Sensitivity
    source: str
    reason: str
    added_at: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "sensitivity", _level(self.sensitivity, "sensitivity"))
        validate_source(self.source)
        object.__setattr__(self, "reason", validate_reason(self.reason))
        object.__setattr__(self, "added_at", validate_timestamp(self.added_at))

    @classmethod
    def create(cls, sensitivity: Sensitivity | str, source: str, reason: str) -> SessionMark:
        return cls(sensitivity=_level(sensitivity, "sensitivity"), source=source, reason=reason, added_at=utc_now_iso())

    def to_json(self) -> dict[str, str]:
        return {
            "level": self.sensitivity.name,
            "source": self.source,
            "reason": self.reason,
            "added_at": self.added_at,
        }

    @classmethod
    def from_json(cls, data: object) -> SessionMark:
        d = _expect_keys(data, "mark", {"level", "source", "reason", "added_at"})
        return cls(sensitivity=d["level"], source=d["source"], reason=d["reason"], added_at=d["added_at"])
