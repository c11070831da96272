"""The seeds' API over the store: ``PrivateData`` and ``get_network_mode``.

There is deliberately no way to lower or clear anything: no setter, no
``remove``/``clear``/``reset``, and the attributes are read-only. Every
property reads the store, so two ``PrivateData`` objects (in one process or
several) on the same session always agree.
"""

from __future__ import annotations

import logging

from .identity import validate_id
from .modes import NetworkMode
from .records import Dataset, SessionMark
from .sensitivity import Sensitivity
from .state import PrivacyState
from .store import PrivacyStore, default_store

log = logging.getLogger("sandbox_kernel.privacy")


class PrivateData:
    """The private-data ratchet of one session: it only goes up.

    ``store`` defaults to :func:`default_store` (taken when the object is made).
    """

    __slots__ = ("_session_id", "_store", "_user_id")
    _user_id: str
    _session_id: str
    _store: PrivacyStore

    def __init__(self, user_id: str, session_id: str, store: PrivacyStore | None = None) -> None:
        validate_id(user_id, "user_id")
        validate_id(session_id, "session_id")
        if store is not None and not isinstance(store, PrivacyStore):
            raise ValueError(f"store must be a PrivacyStore, got {type(store).__name__}")
        object.__setattr__(self, "_user_id", user_id)
        object.__setattr__(self, "_session_id", session_id)
        object.__setattr__(self, "_store", store if store is not None else default_store())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"PrivateData.{name} cannot be set: the privacy level only goes up, through "
            "add_private_dataset() or mark_private()"
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"PrivateData.{name} cannot be deleted: the privacy level only goes up")

    def __repr__(self) -> str:
        return f"PrivateData(user_id={self._user_id!r}, session_id={self._session_id!r})"

    @property
    def user_id(self) -> str:
        return self._user_id

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def store(self) -> PrivacyStore:
        return self._store

    @property
    def state(self) -> PrivacyState:
        """The session's current state (read from the store, fails closed)."""
        return self._store.read(self._user_id, self._session_id)

    @property
    def has_private_data(self) -> bool:
        """True once any dataset was added or the session was marked private."""
        return self.state.has_private_data

    @property
    def sensitivity(self) -> Sensitivity:
        """The highest level that entered the session (PUBLIC when none)."""
        return self.state.sensitivity

    @property
    def datasets(self) -> list[Dataset]:
        return list(self.state.datasets)

    @property
    def network_mode(self) -> NetworkMode:
        return self.state.network_mode

    @property
    def error(self) -> str | None:
        return self.state.error

    def add_private_dataset(
        self,
        name: str,
        sensitivity: Sensitivity | str = Sensitivity.CONFIDENTIAL,
        source: str = "api",
        wait: bool | float = False,
    ) -> PrivacyState:
        """Record that dataset ``name`` entered the session at ``sensitivity``.

        Adding it again at a higher level raises its level; at a lower level
        keeps the higher one. ``sensitivity`` must be above PUBLIC (a level
        object or a name in any case); ``source`` is one of ``SOURCES``.
        Raises ``ValueError`` for bad input, ``PrivacyStoreError`` when the
        change could not be written (this process still keeps it).

        ``wait`` (True, or a timeout in seconds; True is 10 s): return only once
        every live sandbox of the session, and of sessions sharing its folder,
        runs without network; ``TimeoutError`` otherwise. Hand data over after
        that, not before.
        """
        dataset = Dataset.create(name, sensitivity, source)
        state = self._store.add_dataset(self._user_id, self._session_id, dataset)
        log.info(
            "session %s/%s: dataset %r added at %s from %s; session level %s",
            self._user_id,
            self._session_id,
            name,
            dataset.sensitivity.name,
            source,
            state.sensitivity.name,
        )
        self._wait(state, wait)
        return state

    def _wait(self, state: PrivacyState, wait: bool | float) -> None:
        from .enforcement import pending_holders, wait_enforced

        if wait is False or wait is None:
            # One look at the holders all the same: a dead holder's Docker
            # containers (they outlive it, on their network) are removed by
            # that look, the only one that may come (enforcement._left_behind).
            try:
                pending_holders(self._store.root, self._user_id, self._session_id, state.sensitivity)
            except Exception as exc:  # the rise itself is stored; waiting was not asked for
                log.warning("could not look for holders left by dead processes: %s", exc)
            return

        timeout = 10.0 if wait is True else float(wait)
        wait_enforced(self._store.root, self._user_id, self._session_id, state.sensitivity, timeout)

    def mark_private(
        self,
        sensitivity: Sensitivity | str = Sensitivity.CONFIDENTIAL,
        source: str = "api",
        reason: str = "",
        wait: bool | float = False,
    ) -> PrivacyState:
        """Mark the whole session private without naming a dataset (e.g. the
        widget's button). Stored as the session's ``mark``, not as a dataset;
        the higher of this and any earlier mark is kept. ``wait`` as for
        :meth:`add_private_dataset`."""
        mark = SessionMark.create(sensitivity, source, reason)
        state = self._store.mark(self._user_id, self._session_id, mark)
        log.info(
            "session %s/%s: marked private at %s from %s (%s); session level %s",
            self._user_id,
            self._session_id,
            mark.sensitivity.name,
            source,
            reason or "no reason given",
            state.sensitivity.name,
        )
        self._wait(state, wait)
        return state


def get_network_mode(user_id: str, session_id: str, store: PrivacyStore | None = None) -> NetworkMode:
    """NONE when the session is private (or its state cannot be known), else FULL."""
    validate_id(user_id, "user_id")
    validate_id(session_id, "session_id")
    try:
        return (store if store is not None else default_store()).read(user_id, session_id).network_mode
    except Exception:  # fail closed: an unknown state is a private one
        log.exception("cannot read the privacy state of %s/%s; cutting the network", user_id, session_id)
        return NetworkMode.NONE


def session_has_private_data(user_id: str, session_id: str, store: PrivacyStore | None = None) -> bool:
    """The seeds' spelling of ``get_network_mode(...) is NetworkMode.NONE``."""
    return get_network_mode(user_id, session_id, store) is NetworkMode.NONE
