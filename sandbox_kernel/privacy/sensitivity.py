"""How sensitive the data in a session is: an ordered, parse-able level."""

from __future__ import annotations

from enum import IntEnum


class Sensitivity(IntEnum):
    """Data sensitivity, ordered ``PUBLIC < INTERNAL < CONFIDENTIAL < SECRET``.

    Any level above PUBLIC makes a session private (its sandboxes lose the
    network). Use :meth:`parse` for names coming from outside (comm messages,
    tool arguments, JSON files): it is case-insensitive and accepts nothing but
    a level name or a ``Sensitivity``.
    """

    PUBLIC = 0
    INTERNAL = 1
    CONFIDENTIAL = 2
    SECRET = 3

    def __str__(self) -> str:
        return self.name

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The level names, lowest first."""
        return tuple(level.name for level in cls)

    @classmethod
    def parse(cls, value: object, what: str = "sensitivity") -> Sensitivity:
        """Return the level named by ``value`` (a name in any case, or a level).

        Integers are refused on purpose: ``2`` in a message is more likely a
        mistake than a level. Raises ``ValueError`` naming the bad value and
        the allowed names.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            level = cls.__members__.get(value.strip().upper())
            if level is not None:
                return level
        allowed = ", ".join(cls.names())
        if isinstance(value, str):
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise ValueError(f"{what} {shown!r} is not a sensitivity level; allowed: {allowed}")
        raise ValueError(f"{what} must be a level name (one of {allowed}), got {type(value).__name__} {value!r:.40}")
