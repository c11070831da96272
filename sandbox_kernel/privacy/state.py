"""A session's privacy state: an immutable value, and the only way to combine two.

``merge`` is the heart of the ratchet: the result is never lower than any
input (levels are maxed, datasets unioned), so whoever merges a stale or
hostile state into the stored one can only raise it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .modes import NetworkMode
from .records import Dataset, SessionMark
from .sensitivity import Sensitivity

#: Datasets listed by name per session; more are counted in ``omitted_datasets``
#: (their level still counts). Keeps the file far below the 1 MiB read limit.
MAX_DATASETS = 1000

_NETWORK_JSON = {NetworkMode.FULL: "full", NetworkMode.NONE: "none", NetworkMode.PROXIED: "proxied"}


def _order(ds: Dataset) -> tuple[str, str]:
    return (ds.added_at, ds.name)  # canonical stamps sort as text in time order


def network_mode_for(private: bool) -> NetworkMode:
    """NONE for a private session, FULL otherwise (PROXIED is not used yet)."""
    return NetworkMode.NONE if private else NetworkMode.FULL


@dataclass(frozen=True)
class PrivacyState:
    """What is known about one session's private data, at one moment.

    Invariants (checked on construction): ``sensitivity`` is at least every
    dataset's and the mark's level; ``has_private_data`` is
    ``sensitivity > PUBLIC``; ``network_mode`` is NONE exactly when private; a
    state with an ``error`` is SECRET. Build one with :meth:`build`.
    """

    has_private_data: bool
    sensitivity: Sensitivity
    datasets: tuple[Dataset, ...] = ()
    network_mode: NetworkMode = NetworkMode.FULL
    error: str | None = None
    #: The whole session was marked private (see ``SessionMark``); not in ``to_json``.
    mark: SessionMark | None = None
    #: Datasets beyond MAX_DATASETS that raised the level but are not listed.
    omitted_datasets: int = 0

    def __post_init__(self) -> None:
        datasets = tuple(self.datasets)
        if not all(isinstance(d, Dataset) for d in datasets):
            raise ValueError("datasets must be Dataset records")
        names = [d.name for d in datasets]
        if len(set(names)) != len(names):
            raise ValueError("datasets must have distinct names")
        object.__setattr__(self, "datasets", tuple(sorted(datasets, key=_order)))
        level = Sensitivity.parse(self.sensitivity)
        object.__setattr__(self, "sensitivity", level)
        if self.mark is not None and not isinstance(self.mark, SessionMark):
            raise ValueError("mark must be a SessionMark or None")
        lowest = max(
            [d.sensitivity for d in datasets] + ([self.mark.sensitivity] if self.mark else []),
            default=Sensitivity.PUBLIC,
        )
        if level < lowest:
            raise ValueError(f"sensitivity {level.name} is below a recorded level ({lowest.name})")
        if not isinstance(self.omitted_datasets, int) or self.omitted_datasets < 0:
            raise ValueError("omitted_datasets must be a non-negative integer")
        if self.omitted_datasets and level == Sensitivity.PUBLIC:
            raise ValueError("omitted datasets imply a private level")
        if self.error is not None and (not isinstance(self.error, str) or level != Sensitivity.SECRET):
            raise ValueError("a state with an error must be a SECRET one with a text error")
        if self.has_private_data is not (level > Sensitivity.PUBLIC):
            raise ValueError("has_private_data must be True exactly when sensitivity is above PUBLIC")
        if self.network_mode is not network_mode_for(self.has_private_data):
            raise ValueError("network_mode must be NONE exactly when the session is private")

    @classmethod
    def build(
        cls,
        datasets: Iterable[Dataset] = (),
        mark: SessionMark | None = None,
        floor: Sensitivity = Sensitivity.PUBLIC,
        omitted_datasets: int = 0,
        error: str | None = None,
    ) -> PrivacyState:
        """A consistent state from its parts (an error makes it SECRET)."""
        datasets = tuple(datasets)
        level = max(
            [Sensitivity.parse(floor)] + [d.sensitivity for d in datasets] + ([mark.sensitivity] if mark else [])
        )
        if error is not None or omitted_datasets:
            level = max(level, Sensitivity.SECRET if error is not None else Sensitivity.INTERNAL)
        private = level > Sensitivity.PUBLIC
        return cls(
            has_private_data=private,
            sensitivity=level,
            datasets=datasets,
            network_mode=network_mode_for(private),
            error=error,
            mark=mark,
            omitted_datasets=omitted_datasets,
        )

    @classmethod
    def public(cls) -> PrivacyState:
        # immutable and asked for on every read of a folder without records
        if cls is PrivacyState:
            return _PUBLIC
        return cls.build()

    def dataset(self, name: str) -> Dataset | None:
        for d in self.datasets:
            if d.name == name:
                return d
        return None

    def covers(self, other: PrivacyState) -> bool:
        """True when this state is at least ``other`` (nothing of it would be lost)."""
        if self.sensitivity < other.sensitivity or self.omitted_datasets < other.omitted_datasets:
            return False
        if other.mark and (self.mark is None or self.mark.sensitivity < other.mark.sensitivity):
            return False
        mine_by_name = {d.name: d for d in self.datasets}
        for d in other.datasets:
            mine = mine_by_name.get(d.name)
            if mine is None and self.omitted_datasets == 0:
                return False
            if mine is not None and mine.sensitivity < d.sensitivity:
                return False
        return True

    def to_json(self) -> dict[str, Any]:
        """The dict the status widget receives (JSON-serialisable)."""
        return {
            "private": self.has_private_data,
            "level": self.sensitivity.name,
            "network": _NETWORK_JSON[self.network_mode],
            "datasets": [d.to_json() for d in self.datasets],
            "error": self.error,
        }


_PUBLIC = PrivacyState.build()


def _combine(a: Dataset, b: Dataset) -> Dataset:
    """The same dataset seen twice: the higher level, the first sighting's time and source."""
    first = a if a.added_at <= b.added_at else b
    level = max(a.sensitivity, b.sensitivity)
    if first.sensitivity == level:
        return first
    return Dataset(name=first.name, sensitivity=level, added_at=first.added_at, source=first.source)


def _union_into(by_name: dict[str, Dataset], datasets: Iterable[Dataset]) -> None:
    for d in datasets:
        seen = by_name.get(d.name)
        by_name[d.name] = d if seen is None else _combine(seen, d)


def union_datasets(datasets: Iterable[Dataset]) -> list[Dataset]:
    """One record per name (see ``merge``), oldest first; not truncated."""
    by_name: dict[str, Dataset] = {}
    _union_into(by_name, datasets)
    return sorted(by_name.values(), key=_order)


def merge(*states: PrivacyState) -> PrivacyState:
    """The least state that covers every input: max of levels, union of datasets.

    The result's ``error`` joins the inputs' errors. Datasets beyond
    ``MAX_DATASETS`` (newest first to go) are counted, not listed.
    """
    by_name: dict[str, Dataset] = {}
    mark: SessionMark | None = None
    floor = Sensitivity.PUBLIC
    omitted = 0
    errors: list[str] = []
    for state in states:
        floor = max(floor, state.sensitivity)
        omitted = max(omitted, state.omitted_datasets)
        if state.error and state.error not in errors:
            errors.append(state.error)
        _union_into(by_name, state.datasets)
        m = state.mark
        if m is not None and (
            mark is None
            or m.sensitivity > mark.sensitivity
            or (m.sensitivity == mark.sensitivity and m.added_at < mark.added_at)
        ):
            mark = m
    datasets = sorted(by_name.values(), key=_order)
    if len(datasets) > MAX_DATASETS:
        omitted += len(datasets) - MAX_DATASETS
        datasets = datasets[:MAX_DATASETS]
    return PrivacyState.build(
        datasets=datasets, mark=mark, floor=floor, omitted_datasets=omitted, error="; ".join(errors) or None
    )
