"""The kernel side of the ``sandbox_kernel.status`` comm (protocol version 1).

The frontend (the JupyterLab / Notebook 7 status item) opens a comm on the
target ``sandbox_kernel.status``; this module answers with the session's
state, pushes every change, and lets the user raise the private-data ratchet
(``mark_private``). The wire format is documented in ``docs/comm.md``.

Rules this module keeps:

- Every incoming message is validated. Anything malformed (not an object,
  missing or unknown ``type``, ``version`` other than 1, unknown or lowering
  ``level``, unexpected fields) gets an ``error`` reply naming what was wrong,
  changes nothing, and leaves the comm usable.
- Nothing raises into ipykernel: every callback catches and logs.
- The provider (the thing that knows the session's state) is called only on
  the kernel's event loop, even when ipykernel hands a comm message to another
  thread (kernel subshells).
- If the provider cannot produce a state, the frontend is told the session is
  private at SECRET with no network and an ``error``: the widget fails closed,
  it never shows "Network on" for a state nobody could read.
- The kernel works the same with no frontend: with no comm open, ``push`` is a
  no-op.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .sandbox.registry import backend_names, load_backend

__all__ = [
    "LEVELS",
    "MARKABLE_LEVELS",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Request",
    "StatusComm",
    "StatusProvider",
    "parse_request",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
TARGET = "sandbox_kernel.status"

#: Sensitivity levels, lowest first (same names and order as
#: ``sandbox_kernel.privacy.Sensitivity``; the comm is strict: exact names only).
LEVELS: tuple[str, ...] = ("PUBLIC", "INTERNAL", "CONFIDENTIAL", "SECRET")
#: Levels a ``mark_private`` request may ask for.
MARKABLE_LEVELS: tuple[str, ...] = LEVELS[1:]
NETWORKS: tuple[str, ...] = ("proxied", "full", "none")
#: at most this many egress log entries and domains cross to the widget
MAX_EGRESS_RECENT = 10
MAX_EGRESS_DOMAINS = 50

#: Request types and the fields each may carry (besides ``version`` and ``type``).
REQUEST_FIELDS: dict[str, frozenset[str]] = {
    "hello": frozenset(),
    "request_state": frozenset(),
    "mark_private": frozenset({"level", "reason"}),
}
MAX_REASON_CHARS = 1000


def _short(value: object, limit: int = 60) -> str:
    """``repr`` of ``value`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rank(level: str) -> int:
    return LEVELS.index(level)


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------


class ProtocolError(ValueError):
    """A frontend message that breaks the comm contract.

    ``request`` is the message's ``type`` when it was a string (even an unknown
    one), so the error reply can say which request failed.
    """

    def __init__(self, message: str, request: str | None = None) -> None:
        super().__init__(message)
        self.request = request


@dataclass(frozen=True)
class Request:
    """A validated frontend request."""

    type: str
    level: str | None = None
    reason: str = ""


def parse_request(data: object) -> Request:
    """Validate the ``data`` of a frontend message; raise ProtocolError if bad.

    Accepted (version 1):
    ``{version: 1, type: "hello"}``, ``{version: 1, type: "request_state"}``,
    ``{version: 1, type: "mark_private", level: INTERNAL|CONFIDENTIAL|SECRET,
    reason?: string}``. Nothing else: no extra fields, no other versions.
    """
    if not isinstance(data, dict):
        raise ProtocolError(f"message data must be a JSON object, got {type(data).__name__} {_short(data)}")
    raw_type = data.get("type")
    request = raw_type[:100] if isinstance(raw_type, str) else None

    if "version" not in data:
        raise ProtocolError(
            f"missing 'version': this kernel speaks status protocol version {PROTOCOL_VERSION}",
            request,
        )
    version = data["version"]
    # bool is an int in Python: True == 1 must not pass.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported version {_short(version)}: this kernel speaks status protocol version {PROTOCOL_VERSION}",
            request,
        )

    if "type" not in data:
        raise ProtocolError("missing 'type'; expected one of " + ", ".join(REQUEST_FIELDS))
    if not isinstance(raw_type, str):
        raise ProtocolError(f"'type' must be a string, got {type(raw_type).__name__} {_short(raw_type)}")
    if raw_type not in REQUEST_FIELDS:
        raise ProtocolError(
            f"unknown type {_short(raw_type)}; expected one of " + ", ".join(REQUEST_FIELDS),
            request,
        )

    allowed = REQUEST_FIELDS[raw_type] | {"version", "type"}
    extra = sorted(str(key) for key in data if key not in allowed)
    if extra:
        raise ProtocolError(
            f"unexpected field(s) in {raw_type}: " + ", ".join(_short(k, 40) for k in extra),
            raw_type,
        )

    if raw_type != "mark_private":
        return Request(raw_type)

    if "level" not in data:
        raise ProtocolError("mark_private needs 'level', one of " + ", ".join(MARKABLE_LEVELS), raw_type)
    level = data["level"]
    if level == "PUBLIC":
        raise ProtocolError(
            "level 'PUBLIC' cannot be requested: a session can only be marked "
            + ", ".join(MARKABLE_LEVELS)
            + " (the private-data ratchet never goes down)",
            raw_type,
        )
    if not isinstance(level, str) or level not in MARKABLE_LEVELS:
        raise ProtocolError(
            f"unknown level {_short(level)}; expected one of " + ", ".join(MARKABLE_LEVELS),
            raw_type,
        )
    reason = data.get("reason")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise ProtocolError(f"'reason' must be a string, got {type(reason).__name__} {_short(reason)}", raw_type)
    if len(reason) > MAX_REASON_CHARS:
        raise ProtocolError(
            f"'reason' is {len(reason)} characters long; at most {MAX_REASON_CHARS} allowed",
            raw_type,
        )
    return Request(raw_type, level=level, reason=reason)


def error_message(message: str, request: str | None = None) -> dict[str, Any]:
    """An ``error`` message for the frontend."""
    msg: dict[str, Any] = {"version": PROTOCOL_VERSION, "type": "error", "message": message}
    if request is not None:
        msg["request"] = request
    return msg


#: the largest ``count`` of an egress entry sent to the widget (bounded: the
#: number grows with what a sandbox asks for)
MAX_EGRESS_COUNT = 10**9


def _times(value: object) -> int:
    """How many connections an egress entry stands for: the egress log writes
    identical refusals as one entry with a ``count`` (network/egress_log.py).
    Without it the widget would show one refusal where there were thousands."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"state.egress.recent[].count must be a positive integer, got {_short(value)}")
    return min(value, MAX_EGRESS_COUNT)


def _enforces_network(backend: str, claimed: object) -> bool:
    """Whether a private session's network is really cut on ``backend``. A
    provider may say less than the backend class (``Sandbox.enforces_network``)
    but never more: the widget must not tell a user the network was cut on a
    backend that cannot cut it (the development subprocess fallback)."""
    if claimed is not None and not isinstance(claimed, bool):
        raise ValueError(f"state.enforces_network must be a bool, got {_short(claimed)}")
    try:
        by_class = bool(load_backend(backend).enforces_network)
    except ValueError:
        by_class = False
    return by_class and claimed is not False


def _egress(value: Any) -> dict[str, Any] | None:
    """The egress summary (PROXIED mode), trimmed: hosts and rules come from what
    a sandbox asked for, so they are plain bounded strings (the widget shows text)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("state.egress must be an object")
    counts = {}
    for key in ("allowed", "refused", "bytes_up", "bytes_down"):
        n = value.get(key, 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"state.egress.{key} must be a count")
        counts[key] = n
    domains = value.get("domains", [])
    if not isinstance(domains, list):
        raise ValueError("state.egress.domains must be a list")
    recent = []
    for entry in list(value.get("recent", []))[-MAX_EGRESS_RECENT:]:
        if not isinstance(entry, dict):
            raise ValueError("state.egress.recent entries must be objects")
        recent.append(
            {
                "time": str(entry.get("time", ""))[:40],
                "host": str(entry.get("host", ""))[:253],
                "port": entry.get("port") if isinstance(entry.get("port"), int) else 0,
                "allowed": entry.get("allowed") is True,
                "rule": str(entry.get("rule", ""))[:300],
                "bytes_down": entry.get("bytes_down") if isinstance(entry.get("bytes_down"), int) else 0,
                "count": _times(entry.get("count", 1)),
            }
        )
    return {
        **counts,
        "cut": value.get("cut") is True,
        "domains": [str(d)[:253] for d in domains[:MAX_EGRESS_DOMAINS]],
        "recent": recent,
    }


def validate_state(state: object) -> dict[str, Any]:
    """Check a provider's state object against the contract; return a clean copy.

    Raises ValueError naming the first problem. Unknown extra keys are dropped.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict, got {type(state).__name__}")
    missing = [
        key
        for key in (
            "private",
            "level",
            "network",
            "datasets",
            "error",
            "backend",
            "warnings",
            "user_id",
            "session_id",
        )
        if key not in state
    ]
    if missing:
        raise ValueError("state is missing " + ", ".join(missing))
    if not isinstance(state["private"], bool):
        raise ValueError(f"state.private must be a bool, got {_short(state['private'])}")
    if state["level"] not in LEVELS:
        raise ValueError(f"state.level {_short(state['level'])} is not one of {', '.join(LEVELS)}")
    if state["network"] not in NETWORKS:
        raise ValueError(f"state.network {_short(state['network'])} is not one of {', '.join(NETWORKS)}")
    if state["backend"] not in backend_names():
        raise ValueError(f"state.backend {_short(state['backend'])} is not one of {', '.join(backend_names())}")
    if state["error"] is not None and not isinstance(state["error"], str):
        raise ValueError("state.error must be a string or None")
    for key in ("user_id", "session_id"):
        if not isinstance(state[key], str):
            raise ValueError(f"state.{key} must be a string")
    warnings = state["warnings"]
    if not isinstance(warnings, (list, tuple)) or not all(isinstance(w, str) for w in warnings):
        raise ValueError("state.warnings must be a list of strings")
    datasets = state["datasets"]
    if not isinstance(datasets, (list, tuple)):
        raise ValueError("state.datasets must be a list")
    clean_datasets = []
    for i, ds in enumerate(datasets):
        if not isinstance(ds, dict):
            raise ValueError(f"state.datasets[{i}] must be a dict")
        for key in ("name", "level", "source", "added_at"):
            if key not in ds:
                raise ValueError(f"state.datasets[{i}] is missing {key}")
        if ds["level"] not in LEVELS:
            raise ValueError(f"state.datasets[{i}].level {_short(ds['level'])} is not a level")
        clean_datasets.append(
            {
                "name": str(ds["name"]),
                "level": ds["level"],
                "source": str(ds["source"]),
                "added_at": ds["added_at"] if isinstance(ds["added_at"], str) else str(ds["added_at"]),
            }
        )
    # A private session never has network, and a public one is at PUBLIC: a
    # state that says otherwise is contradictory; refuse it rather than show it.
    if state["private"] != (state["level"] != "PUBLIC"):
        raise ValueError(f"state.private={state['private']} contradicts state.level={state['level']}")
    if state["private"] and state["network"] != "none":
        raise ValueError("state says private but network is not 'none'")
    egress = _egress(state.get("egress"))
    return {
        **({"egress": egress} if egress is not None else {}),
        "private": state["private"],
        "level": state["level"],
        "network": state["network"],
        "datasets": clean_datasets,
        "error": state["error"],
        "backend": state["backend"],
        "enforces_network": _enforces_network(state["backend"], state.get("enforces_network")),
        "warnings": list(warnings),
        "user_id": state["user_id"],
        "session_id": state["session_id"],
    }


# --------------------------------------------------------------------------
# the comm
# --------------------------------------------------------------------------


@runtime_checkable
class StatusProvider(Protocol):
    """What StatusComm needs from the kernel: the state and the ratchet."""

    def status(self) -> dict[str, Any]:
        """The state object of the comm contract (see docs/comm.md)."""
        ...

    async def mark_private(self, level: str, reason: str) -> None:
        """Raise the session to ``level``.

        Raises ValueError with a clear message if ``level`` is unknown or lower
        than the current level; the message is shown to the user.
        """
        ...


class StatusComm:
    """Serves the ``sandbox_kernel.status`` comm target for one kernel.

    ``comm_manager`` is the kernel's ipykernel ``CommManager`` (the object whose
    ``comm_open``/``comm_msg``/``comm_close`` handle the shell messages).
    ``loop`` is the kernel's event loop; the provider is only ever called on
    it. If omitted, the loop running when StatusComm is built is used, or else
    the one running when the first message arrives.
    """

    TARGET = TARGET

    def __init__(
        self,
        comm_manager: Any,
        provider: StatusProvider,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._manager = comm_manager
        self._provider = provider
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        self._lock = threading.Lock()
        self._comms: dict[str, Any] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._last_good: dict[str, Any] | None = None
        self._closed = False
        comm_manager.register_target(self.TARGET, self._on_open)

    # -- public API ------------------------------------------------------

    @property
    def open_comm_ids(self) -> list[str]:
        """Ids of the comms currently open on this target."""
        with self._lock:
            return list(self._comms)

    def push(self, *, notice: str | None = None) -> None:
        """Send the current state to every open comm, marked ``changed``.

        Call it on every change of network mode, level, datasets, backend or
        warnings. Safe to call from any thread and with no comm open.
        """
        if self._closed:
            return
        self._call_on_loop(self._broadcast, True, notice)

    def close(self) -> None:
        """Stop serving: unregister the target and close the open comms."""
        if self._closed:
            return
        self._closed = True
        try:
            self._manager.unregister_target(self.TARGET, self._on_open)
        except Exception:
            pass
        with self._lock:
            comms = list(self._comms.values())
            self._comms.clear()
        for comm in comms:
            try:
                comm.close()
            except Exception:
                log.debug("closing status comm %s failed", getattr(comm, "comm_id", "?"), exc_info=True)
        for task in list(self._tasks):
            task.cancel()

    # -- ipykernel callbacks (must never raise) --------------------------

    def _on_open(self, comm: Any, open_msg: dict[str, Any]) -> None:
        try:
            comm_id = comm.comm_id
            with self._lock:
                self._comms[comm_id] = comm
            comm.on_msg(lambda msg, _comm=comm: self._on_msg(_comm, msg))
            comm.on_close(lambda msg, _id=comm_id: self._forget(_id))
            data = _msg_data(open_msg)
            self._call_on_loop(self._handle_open, comm, data)
        except Exception:
            log.exception("status comm: failed to handle comm_open")

    def _on_msg(self, comm: Any, msg: dict[str, Any]) -> None:
        try:
            self._call_on_loop(self._handle, comm, _msg_data(msg))
        except Exception:
            log.exception("status comm: failed to handle comm_msg")

    def _forget(self, comm_id: str) -> None:
        with self._lock:
            self._comms.pop(comm_id, None)

    # -- dispatch (on the loop) ------------------------------------------

    def _handle_open(self, comm: Any, data: object) -> None:
        try:
            request = parse_request(data)
        except ProtocolError as err:
            self._send(comm, error_message(f"comm_open: {err}", err.request or "hello"))
        else:
            if request.type != "hello":
                self._send(
                    comm,
                    error_message(
                        f"comm_open data must be a hello, got {request.type}; the request was not carried out",
                        request.type,
                    ),
                )
        # Whatever the hello said, the frontend gets the state: it is read-only.
        self._send(comm, self._state_message(changed=False))

    def _handle(self, comm: Any, data: object) -> None:
        try:
            request = parse_request(data)
        except ProtocolError as err:
            self._send(comm, error_message(str(err), err.request))
            return
        if request.type in ("hello", "request_state"):
            self._send(comm, self._state_message(changed=False))
        elif request.type == "mark_private":
            self._start_mark_private(comm, request)
        else:  # pragma: no cover - parse_request knows every type
            self._send(comm, error_message(f"unhandled type {request.type}", request.type))

    def _start_mark_private(self, comm: Any, request: Request) -> None:
        assert request.level is not None
        before = self._read_state()
        if _rank(request.level) < _rank(before["level"]):
            self._send(
                comm,
                error_message(
                    f"cannot lower the session from {before['level']} to {request.level}: "
                    "the private-data ratchet only goes up",
                    "mark_private",
                ),
            )
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            self._send(comm, error_message("the kernel's event loop is not available", "mark_private"))
            return
        try:
            coro = self._provider.mark_private(request.level, request.reason)
            task = asyncio.ensure_future(coro, loop=loop)
        except Exception as exc:
            self._send(comm, _mark_private_error(exc))
            return
        self._tasks.add(task)
        task.add_done_callback(
            functools.partial(self._mark_private_done, comm=comm, before=before, level=request.level)
        )

    def _mark_private_done(self, task: asyncio.Future[Any], comm: Any, before: dict[str, Any], level: str) -> None:
        self._tasks.discard(task)
        try:
            if task.cancelled():
                self._send(comm, error_message("mark_private was cancelled", "mark_private"))
                return
            exc = task.exception()
            if exc is not None:
                self._send(comm, _mark_private_error(exc))
                return
            after = self._read_state()
            changed = _differs(before, after)
            if changed:
                notice = None
                if after["level"] != before["level"]:
                    notice = f"This session was marked {after['level']} from the status widget; " + (
                        "its sandbox has no network from now on."
                        if after["enforces_network"]
                        else f"its network was NOT cut: this kernel is NOT sandboxed (the {after['backend']!r} "
                        "backend), so it runs no more code in this session."
                    )
                # Every open comm hears of it (two views of one kernel), the
                # requester included.
                self._broadcast(True, notice, state=after)
            else:
                self._send(comm, self._state_message(changed=False, state=after))
        except Exception:
            log.exception("status comm: failed to finish mark_private")

    # -- helpers ---------------------------------------------------------

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the kernel loop (now if we are on it)."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None and running is not None:
            loop = self._loop = running
        if loop is None or loop is running or loop.is_closed() or not loop.is_running():
            fn(*args)
        else:
            loop.call_soon_threadsafe(self._guarded, fn, *args)

    @staticmethod
    def _guarded(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("status comm: handler failed")

    def _read_state(self) -> dict[str, Any]:
        """The provider's state, validated; a fail-closed state if that fails."""
        try:
            state = validate_state(self._provider.status())
        except Exception as exc:
            log.exception("status comm: could not read the session state: %s", exc)
            base = self._last_good or {
                "datasets": [],
                "backend": "subprocess",
                "enforces_network": False,
                "warnings": [],
                "user_id": "",
                "session_id": "",
            }
            return {
                **base,
                "private": True,
                "level": "SECRET",
                "network": "none",
                "error": f"could not read the session state ({type(exc).__name__}: {exc}); "
                "shown as private and without network until it can be read",
            }
        self._last_good = state
        return state

    def _state_message(
        self,
        *,
        changed: bool,
        notice: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "type": "state",
            "state": state if state is not None else self._read_state(),
            "changed": changed,
        }
        if notice:
            msg["notice"] = notice
        return msg

    def _broadcast(self, changed: bool, notice: str | None, state: dict[str, Any] | None = None) -> None:
        with self._lock:
            comms = list(self._comms.values())
        if not comms:
            return
        msg = self._state_message(changed=changed, notice=notice, state=state)
        for comm in comms:
            self._send(comm, msg)

    def _send(self, comm: Any, msg: dict[str, Any]) -> None:
        try:
            comm.send(msg)
        except Exception:
            log.warning(
                "status comm: sending to %s failed; forgetting it",
                getattr(comm, "comm_id", "?"),
                exc_info=True,
            )
            self._forget(getattr(comm, "comm_id", ""))


def _msg_data(msg: object) -> object:
    """``msg['content']['data']``, or a marker object the validator rejects."""
    if isinstance(msg, dict):
        content = msg.get("content")
        if isinstance(content, dict):
            return content.get("data")
    return None


def _mark_private_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ValueError):
        return error_message(str(exc) or "mark_private was refused", "mark_private")
    log.error("status comm: mark_private failed", exc_info=exc)
    return error_message(f"mark_private failed: {type(exc).__name__}: {exc}", "mark_private")


def _differs(before: dict[str, Any], after: dict[str, Any]) -> bool:
    keys = ("private", "level", "network", "datasets", "backend", "warnings", "error")
    return any(before.get(k) != after.get(k) for k in keys)
