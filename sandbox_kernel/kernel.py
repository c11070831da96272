"""The Jupyter face of the engine: protocol translation only.

Requests become engine calls, engine events become iopub messages. All
sandboxing, state carry and output sanitising live in the engine, so agent
tools get exactly the same behaviour.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import fnmatch
import os
import platform
import signal
import threading
import uuid
from pathlib import Path
from typing import Any, cast

import comm
from ipykernel.comm import CommManager
from ipykernel.comm.comm import BaseComm
from ipykernel.kernelbase import Kernel
from IPython.core.inputtransformer2 import TransformerManager
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int, List, Unicode

from . import __version__, requests
from .engine import Session, owned_dirs
from .engine.ratchet import Ratchet
from .engine.settings import EngineSettings
from .host_streams import iopub_barrier
from .outputs.links import defang_text
from .outputs.replies import (
    clean_completion_metadata,
    clean_payloads,
    clean_reply_bundle,
    clean_user_expressions,
    plain_text,
)
from .outputs.sizing import text_of, utf8_len
from .outputs.widgets import WidgetRefused, installed_widget_modules
from .privacy import default_user_id, session_id_for_notebook, validate_id
from .privacy.store import default_data_dir
from .sandbox import get_sandbox
from .status_comm import StatusComm
from .stop_on_error import StopOnError
from .terminal_text import terminal_safe_message, terminal_safe_output
from .worker.language import language_info

#: the largest code ``is_complete`` judges, in UTF-8 bytes (larger: "unknown")
MAX_IS_COMPLETE_BYTES = 1 << 20


class _HostComms(CommManager):
    """The kernel's own comms. ipykernel's shell thread looks up every
    comm_msg here first, and most belong to the sandbox's widgets: a miss is
    normal, not worth the warning that would land in the last cell's output."""

    def get_comm(self, comm_id: str) -> Any:
        return self.comms.get(comm_id)


_comm_manager: CommManager | None = None


def _get_comm_manager(*args: Any, **kwargs: Any) -> CommManager:
    global _comm_manager
    if _comm_manager is None:
        _comm_manager = _HostComms(*args, **kwargs)
    return _comm_manager


class SandboxKernel(Kernel, EngineSettings):
    """Python 3 (sandboxed): every cell runs in a bubblewrap or Docker sandbox."""

    implementation = "sandbox_kernel"
    implementation_version = __version__
    language = "python"
    language_version = platform.python_version()
    language_info = language_info()
    banner = f"Python {platform.python_version()} in a sandbox (sandbox_kernel {__version__})"
    help_links = [  # noqa: RUF012 - ipykernel declares it on instances
        {"text": "sandbox_kernel", "url": "https://pypi.org/project/sandbox-kernel/"}
    ]

    workspace = Unicode(
        "",
        help="Host directory mounted read-write at /workspace (default: the kernel's working "
        "directory, i.e. the notebook's folder).",
    ).tag(config=True)
    cell_timeout = Float(
        0.0,
        help="Seconds after which a running cell is killed (its changes discarded). 0 disables it.",
    ).tag(config=True)
    privacy_dir = Unicode(
        "",
        help="Where the ratchet's store lives on the host, if not <data_dir>/privacy (kernels and agent tools "
        "that share a store share their sessions' levels).",
    ).tag(config=True)
    max_code_bytes = Int(
        requests.MAX_CODE_BYTES,
        help="Largest code (in UTF-8 bytes) an execute, complete, inspect or is_complete "
        "request may carry; a larger one gets an error reply naming the limit.",
    ).tag(config=True)
    _execute_sleep = Float(
        0.0,
        help="Seconds ipykernel sleeps before each execute_reply. Its 0.5 ms default is for output written "
        "in-process; here every output is on iopub before the reply (see host_streams.iopub_barrier).",
    ).tag(config=True)
    privacy_poll_interval = Float(
        0.25,
        help="Seconds between checks of the ratchet store for rises made by other processes (a check is a "
        "stat() while nothing changed). A rise cuts the sandbox's network within about this time.",
    ).tag(config=True)

    widget_modules = List(
        Unicode(),
        help="Widget frontend packages whose models cells may create, besides the standard @jupyter-widgets "
        "ones and the JupyterLab extensions installed where this server looks (jupyter_path('labextensions')). "
        "A widget naming any other module is refused: no other code is loaded into the page. Packages whose "
        "models run code from their state (anywidget, ipyreact, jupyter-vue) are allowed only when listed here, "
        "even when installed: a cell's state would then be script in the page.",
    ).tag(config=True)
    widget_max_message_bytes = Int(
        8 * 1024 * 1024,
        help="Largest widget message (state and binary buffers) forwarded either way; larger ones are dropped "
        "with a notice.",
    ).tag(config=True)
    widget_rate = Float(
        500.0,
        help="Widget messages a sandbox may send a second (a burst of this many is allowed); more are dropped "
        "with a notice.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stop_on_error = StopOnError()
        #: held by the one thread using the stdin socket (a prompt superseded
        #: by the next is still polling it for a moment; see ``_cancellable_input_request``)
        self._stdin_lock = threading.Lock()
        comm.create_comm = lambda *a, **k: BaseComm(*a, **k)
        comm.get_comm_manager = _get_comm_manager
        self.comm_manager = comm.get_comm_manager(parent=self, kernel=self)
        for msg_type in ("comm_open", "comm_msg", "comm_close"):
            self.shell_handlers[msg_type] = self._comm_handler(msg_type)
        sandbox = get_sandbox(self.backend, parent=self)
        store = self.privacy_store(Path(self.privacy_dir) if self.privacy_dir else None)
        workspace = Path(self.workspace or Path.cwd())
        self.ratchet = Ratchet(self._user_id(), self._session_id(), store, self.private_datasets, workspace=workspace)
        if not sandbox.isolates:  # its notices (widget, cells) say the network was NOT cut
            self.ratchet.unisolated = sandbox.name
        # the egress log is kept with the session's records, where no sandbox can write
        data = self.data_root() or default_data_dir()
        user, session = self.ratchet.user_id, self.ratchet.session_id
        # Checkpoints and the replay log outlive a kernel that dies (killed, OOM):
        # the next kernel of the session resumes from them. A clean shutdown or a
        # restart asked for by the user removes them (do_shutdown), as ipykernel's
        # restart starts afresh.
        self._state_root: Path | None = data / "state" / user / session
        self._packages_dir = data / "packages" / user / session
        #: a session no later kernel can name again (no notebook, no session_id:
        #: nbclient, papermill): its %pip layer goes with its clean shutdown
        self._throwaway_session = not self.session_id and not os.environ.get("JPY_SESSION_NAME")
        if not self._lock_state(self._state_root):
            self._state_root = None  # another live kernel of the session holds it: no resume here
        resuming = self._state_root is not None and any(
            (self._state_root / name).exists() for name in ("sandbox/checkpoint.json", "replay.json")
        )
        self.engine = Session(
            self.engine_config(
                workspace,
                egress_log=data / "egress" / user / f"{session}.jsonl",
                # %pip's layer outlives kernels: restarts and new kernels on the notebook keep it
                packages_dir=self._packages_dir,
                state_dir=self._state_root / "sandbox" if self._state_root else None,
                replay_file=self._state_root / "replay.json" if self._state_root else None,
                widget_modules=frozenset(self.widget_modules) | installed_widget_modules(),
                widget_max_message_bytes=self.widget_max_message_bytes,
                widget_rate=self.widget_rate,
            ),
            log=self.log,
            sandbox=sandbox,
            ratchet=self.ratchet,
            on_privacy_change=self._on_privacy_change,
        )
        self.engine.widgets.host_comm = lambda comm_id: comm_id in self.comm_manager.comms
        if resuming:
            self.engine.resume_reason = "the previous kernel of this session stopped without shutting down"
        self.status_comm: StatusComm | None = None
        self._egress_seen: tuple[int, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transformer = TransformerManager()
        self._end_task: asyncio.Task[None] | None = None  # a cell asked the kernel to end (_end_after_reply)

    def _lock_state(self, root: Path) -> bool:
        """Hold the session's state folder for this kernel's life (two live
        kernels of one session must not share checkpoints)."""
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.log.warning(
                "the session's state folder %s is in use or unusable (%s): no resume after a crash", root, exc
            )
            return False
        self._state_lock = fd  # released when the process ends, however it ends
        return True

    def _user_id(self) -> str:
        return validate_id(self.user_id, "user_id") if self.user_id else default_user_id()

    def _session_id(self) -> str:
        if self.session_id:
            return validate_id(self.session_id, "session_id")
        notebook = os.environ.get("JPY_SESSION_NAME")
        if notebook:
            return session_id_for_notebook(notebook)
        # No notebook path (nbclient, papermill, a bare KernelManager): a kernel
        # restarted by its manager keeps its connection file, so it keeps its
        # session, and with it the ratchet's level.
        connection_file = getattr(self.parent, "connection_file", "") if self.parent is not None else ""
        if connection_file:
            return session_id_for_notebook(os.path.abspath(connection_file))
        return f"kernel-{uuid.uuid4().hex[:16]}"

    # ---- status comm (the widget) ----------------------------------------------------
    def status(self) -> dict[str, Any]:
        privacy = self.ratchet.state
        state = privacy.to_json()
        if privacy.mark is not None:
            # A whole-session mark (widget, host API) is listed with what made the
            # session private, so the popup can say who did it and why.
            mark = privacy.mark
            name = "session marked private" + (f": {mark.reason}" if mark.reason else "")
            state["datasets"] = [
                *state["datasets"],
                {"name": name[:200], "level": mark.sensitivity.name, "source": mark.source, "added_at": mark.added_at},
            ]
        # A backend that isolates nothing has the host's network whatever the
        # setting says, until the session turns private (then nothing runs).
        network = "full" if not self.engine.sandbox.isolates and not privacy.has_private_data else None
        return {
            **state,
            "network": network or self.engine.network_mode,
            "backend": self.engine.backend,
            # the widget says "network cut" only when it was (not on the subprocess fallback)
            "enforces_network": self.engine.sandbox.enforces_network,
            "warnings": self.engine.warnings,
            "user_id": self.ratchet.user_id,
            "session_id": self.ratchet.session_id,
            **({"egress": egress} if (egress := self.engine.egress()) is not None else {}),
        }

    async def mark_private(self, level: str, reason: str) -> None:
        await self.engine.mark_private(level, reason, source="widget")

    def _push_egress_change(self) -> None:
        """Tell the widget when the cell used the egress proxy (its label counts domains)."""
        egress = self.engine.egress()
        key = (egress["allowed"], egress["refused"]) if egress else None
        if key != self._egress_seen:
            self._egress_seen = key
            if self.status_comm is not None:
                self.status_comm.push()

    def _on_privacy_change(self, notice: str | None) -> None:
        if self.status_comm is not None:
            self.status_comm.push(notice=notice)

    # ---- startup -------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self.io_loop.add_callback(self._start_engine)
        # tornado's IOLoop on asyncio (AsyncIOMainLoop) has the loop; its stubs do not say so
        self.status_comm = StatusComm(self.comm_manager, self, loop=cast(Any, self.io_loop).asyncio_loop)
        self._privacy_poll = PeriodicCallback(self._poll_privacy, self.privacy_poll_interval * 1000)
        self._privacy_poll.start()
        self.engine.watch_cuts(self.privacy_poll_interval)  # the poll's stand-in while the loop is busy
        self._stop_listening: Any = None
        store = self.ratchet.data.store
        if hasattr(store, "listen"):  # the shared store: a rise on another host is acted on at once
            me = (self.ratchet.user_id, self.ratchet.session_id)
            loop = self.io_loop

            def on_rise(user: str, session: str) -> None:
                if (user, session) == me:
                    loop.add_callback(self._poll_privacy)  # thread-safe

            self._stop_listening = store.listen(on_rise)
        try:
            signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread (embedded use)
            pass

    async def _poll_privacy(self) -> None:
        try:
            await self.engine.refresh_privacy()
            # a connection is logged when it closes, possibly just after its cell ended
            self._push_egress_change()
        except Exception as exc:  # never let the poller die
            self.log.error("privacy poll failed: %s", exc)

    async def _start_engine(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self.engine.start()
        except Exception as exc:  # reported again on the first cell
            self.log.error("sandbox failed to start: %s", exc)

    @property
    def kernel_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super().kernel_info
        # Subshells would run cells concurrently in one sandbox namespace: not offered.
        info["supported_features"] = [
            f for f in info.get("supported_features", []) if f not in ("kernel subshells", "debugger")
        ]
        info["debugger"] = False
        return info

    async def create_subshell_request(self, socket: Any, ident: Any, parent: Any) -> None:
        self._wire().send(
            socket,
            "create_subshell_reply",
            {
                "status": "error",
                "ename": "NotSupported",
                "evalue": "this kernel does not offer subshells",
                "traceback": [],
            },
            parent,
            ident,
        )

    # ---- request validation, before ipykernel touches the fields ----------------------
    # ipykernel re-publishes the code (execute_input) and reads the fields before
    # do_* runs: a lone surrogate there made the publish fail and the client never
    # got a reply, and a missing field is only logged. Checked here first.
    def _refuse(self, stream: Any, ident: Any, parent: Any, reply_type: str, problem: str, **extra: Any) -> None:
        self.log.warning("%s refused: %s", reply_type.replace("_reply", "_request"), problem)
        self._wire().send(stream, reply_type, requests.error_reply(problem, **extra), parent, ident)

    def _wire(self) -> Any:
        """The kernel's jupyter_client Session (set by the kernel app before any request)."""
        assert self.session is not None
        return self.session

    @staticmethod
    def _content(parent: Any) -> tuple[dict[str, Any] | None, str | None]:
        content = parent.get("content") if isinstance(parent, dict) else None
        if not isinstance(content, dict):
            return None, "the request's content must be an object"
        return content, None

    async def execute_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content, problem = self._content(parent)
        if content is not None:
            silent = content.get("silent", False)
            problem = (
                (None if "code" in content else "code is missing")
                or (None if isinstance(parent.get("metadata", {}), dict) else "metadata must be an object")
                or requests.execute_problem(
                    content.get("code"),
                    silent,
                    content.get("store_history", not silent if isinstance(silent, bool) else True),
                    content.get("user_expressions", {}),
                    content.get("allow_stdin", False),
                    self.max_code_bytes,
                )
            )
        if problem:
            self._refuse(stream, ident, parent, "execute_reply", problem, execution_count=self.execution_count)
            return
        await super().execute_request(stream, ident, parent)

    async def complete_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content, problem = self._content(parent)
        if content is not None:
            problem = None if {"code", "cursor_pos"} <= content.keys() else "code and cursor_pos are required"
        if problem:
            self._refuse(
                stream, ident, parent, "complete_reply", problem, matches=[], cursor_start=0, cursor_end=0, metadata={}
            )
            return
        await super().complete_request(stream, ident, parent)

    async def inspect_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content, problem = self._content(parent)
        if content is not None:
            problem = None if {"code", "cursor_pos"} <= content.keys() else "code and cursor_pos are required"
        if problem:
            self._refuse(stream, ident, parent, "inspect_reply", problem, found=False, data={}, metadata={})
            return
        await super().inspect_request(stream, ident, parent)

    async def is_complete_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content, problem = self._content(parent)
        if content is not None:
            problem = None if "code" in content else "code is required"
        if problem:
            self._refuse(stream, ident, parent, "is_complete_reply", problem)
            return
        await super().is_complete_request(stream, ident, parent)

    async def history_request(self, stream: Any, ident: Any, parent: Any) -> None:
        content, problem = self._content(parent)
        if content is not None:
            problem = None if "hist_access_type" in content else "hist_access_type is required"
        if problem or content is None:
            self._refuse(stream, ident, parent, "history_reply", problem or "bad request", history=[])
            return
        # ipykernel passes the content as keyword arguments: unknown keys would raise there
        known = ("hist_access_type", "output", "raw", "session", "start", "stop", "n", "pattern", "unique")
        cleaned = {"output": False, "raw": True, **{k: v for k, v in content.items() if k in known}}
        await super().history_request(stream, ident, {**parent, "content": cleaned})

    # ---- execution ----------------------------------------------------------------
    async def do_execute(
        self,
        code: Any,
        silent: Any,
        store_history: Any = True,
        user_expressions: Any = None,
        allow_stdin: Any = False,
        *,
        cell_meta: Any = None,
        cell_id: Any = None,
    ) -> dict[str, Any]:
        self._loop = asyncio.get_running_loop()
        reply = await self._answer_execute(code, silent, store_history, user_expressions, allow_stdin)
        await self._stop_on_error.before_reply(self, self.get_parent("shell"), reply)
        return reply

    def _abort_queues(self, subshell_id: str | None = None) -> None:
        if not self._stop_on_error.already_done(self.get_parent("shell")):
            super()._abort_queues(subshell_id)

    async def _answer_execute(
        self, code: Any, silent: Any, store_history: Any, user_expressions: Any, allow_stdin: Any
    ) -> dict[str, Any]:
        problem = requests.execute_problem(
            code, silent, store_history, user_expressions, allow_stdin, self.max_code_bytes
        )
        if problem:
            self.log.warning("execute_request refused: %s", problem)
            return requests.error_reply(problem, execution_count=self.execution_count)
        try:
            return await self._execute(code, silent, store_history, user_expressions or {}, allow_stdin)
        except Exception as exc:  # whatever went wrong, the client gets a reply and the kernel stays idle-able
            self.log.exception("execute_request failed")
            return requests.error_reply(
                f"the kernel could not run this request: {type(exc).__name__}: {exc}"[:2000],
                execution_count=self.execution_count,
            ) | {"ename": "KernelError"}
        finally:
            # the cell's outputs go out before its reply, as with ipykernel's
            # flushes (which cost nothing now: host_streams.HostOutStream)
            iopub_barrier(self.iopub_thread)

    async def _execute(
        self, code: str, silent: bool, store_history: bool, user_expressions: dict[str, str], allow_stdin: bool
    ) -> dict[str, Any]:
        parent = self.get_parent("shell")
        ident = self._get_shell_context_var(self._shell_parent_ident)

        def emit(kind: str, content: dict[str, Any]) -> None:
            # A silent request's output is published as ipykernel publishes
            # it (streams, displays, errors, widget messages: the client that
            # sent it may read them; JupyterLab shows them in no cell), all
            # but a result, which IPython makes none of when silent.
            if not (silent and kind == "execute_result"):
                self._publish(kind, content, parent)

        async def ask_input(prompt: str, password: bool) -> str:
            if self.engine.private:  # (text of the sandbox's, as streams are; other frontends link it)
                prompt = defang_text(prompt)
            cancelled = threading.Event()
            try:
                return await asyncio.to_thread(
                    self._cancellable_input_request, prompt, ident, parent, password, cancelled
                )
            finally:
                cancelled.set()  # an interrupted prompt stops waiting for its reply

        result = await self.engine.execute(
            code,
            execution_count=self.execution_count,
            emit=emit,
            silent=silent,
            store_history=store_history,
            user_expressions=user_expressions,
            allow_stdin=allow_stdin,
            ask_input=ask_input if allow_stdin else None,
            timeout=self.cell_timeout or None,
            parent_id=str(parent.get("header", {}).get("msg_id", "")),
        )
        self._push_egress_change()
        if result.exit_requested:
            self._end_after_reply()
        reply: dict[str, Any] = {
            "status": "ok" if result.status == "ok" else "error",
            "execution_count": self.execution_count,
        }
        # Sandbox-made too: cleaned by the output policy (outputs/replies.py).
        private = self.engine.private
        # ipykernel sends a failed cell's payloads too (a set_next_input made
        # before the error, say), and no user_expressions
        reply["payload"] = clean_payloads(result.payload, private=private, defang=defang_text)
        if result.status == "ok":
            reply["user_expressions"] = clean_user_expressions(
                result.user_expressions, user_expressions, private=private, defang=defang_text
            )
        else:
            reply["user_expressions"] = {}
            # ipykernel's (ipyparallel reads it): the engine is this kernel
            reply["engine_info"] = {"engine_uuid": self.ident, "engine_id": -1, "method": "execute"}
            defang = defang_text if private else (lambda t: t)
            reply.update(
                ename=plain_text(result.ename, 200, defang=defang),
                evalue=plain_text(result.evalue, defang=defang),
                traceback=[plain_text(line, defang=defang) for line in result.traceback[:1000]],
            )
        return reply

    def _publish(self, kind: str, content: dict[str, Any], parent: Any) -> None:
        """An engine event on iopub; widget comm messages carry their buffers."""
        if kind in ("comm_open", "comm_msg", "comm_close"):
            self._wire().send(
                self.iopub_socket,
                kind,
                content["content"],
                parent=parent,
                metadata=content["metadata"],
                buffers=content["buffers"],
                ident=self._topic(kind),
            )
        else:
            # what a terminal frontend (jupyter console) prints holds no control sequence
            content = terminal_safe_message(kind, content)
            self._wire().send(self.iopub_socket, kind, content, parent=parent, ident=self._topic(kind))

    # ---- comms: the kernel's own (the status widget) here, widgets in the sandbox ------
    async def shell_main(self, subshell_id: str | None, msg: Any) -> None:
        """Dispatch a comm message that arrives while another request runs without
        putting back a stale parent afterwards.

        ipykernel 7 handles such a comm beside the running request and then restores
        the parent it saw when the comm arrived. A widget message here waits for the
        sandbox, so by then the request that was running may have finished and the
        next one (a cell) begun: the restore gave the cell's idle status the comm's
        parent, and JupyterLab's prompt stayed ``[*]`` (seen after a restart, when
        the widget manager's comms and the first cell arrive together). The comm runs
        in a copy of the context, so the shared context still holds the running
        request's parent: only the fallback for threads needs refreshing."""
        lock = getattr(self, "_main_asyncio_lock", None)
        if subshell_id is None and lock is not None and lock.locked() and self._is_comm_message(msg):
            # a task runs in a copy of the current context
            await asyncio.ensure_future(self.dispatch_shell(msg, subshell_id=None, concurrent=True))
            self._shell_context = contextvars.copy_context()
            return
        await super().shell_main(subshell_id, msg)

    def _is_comm_message(self, msg: Any) -> bool:
        if self.session is None:
            return False
        try:
            _, frames = self.session.feed_identities(msg, copy=False)
            header = self.session.deserialize(frames, content=False, copy=False)["header"]
        except Exception:  # ipykernel reports a malformed message when it dispatches it
            return False
        return header.get("msg_type") in {"comm_open", "comm_msg", "comm_close"}

    def _comm_handler(self, msg_type: str) -> Any:
        host_handler = getattr(self.comm_manager, msg_type)

        async def handle(stream: Any, ident: Any, msg: Any) -> None:
            content = msg.get("content") if isinstance(msg, dict) else None
            buffers = [bytes(b) for b in msg.get("buffers") or []] if isinstance(msg, dict) else []
            try:
                sandbox_owned = self.engine.widgets.for_sandbox(msg_type, content, buffers)
            except WidgetRefused as exc:
                self.log.warning("%s refused: %s", msg_type, exc)
                return
            if not sandbox_owned:
                comm_id = content.get("comm_id") if isinstance(content, dict) else None
                if msg_type == "comm_open" and isinstance(comm_id, str) and comm_id in self.comm_manager.comms:
                    # ipykernel would replace the live comm, and the replaced one's
                    # __del__ then tells the frontend "closed": the status widget
                    # stops hearing about rises while it still shows the old state
                    self.log.warning("comm_open refused: comm %.80s is already open", comm_id)
                    return
                host_handler(stream, ident, msg)
                return
            parent = self.get_parent("shell")
            metadata = msg.get("metadata")
            result = await self.engine.comm(
                msg_type,
                dict(content),  # type: ignore[arg-type]  # a mapping: checked by for_sandbox
                emit=lambda kind, c: self._publish(kind, c, parent),
                metadata=metadata if isinstance(metadata, dict) else {},
                buffers=buffers,
                parent_id=str(msg.get("header", {}).get("msg_id", "")),
                timeout=self.cell_timeout or None,
            )
            if result.exit_requested:
                self._end_after_reply()

        return handle

    async def comm_info_request(self, stream: Any, ident: Any, parent: Any) -> None:
        """The kernel's comms and the sandbox's widget comms (a reloaded page
        finds its widgets through this)."""
        content, problem = self._content(parent)
        target = content.get("target_name") if content is not None else None
        if problem or not isinstance(target, (str, type(None))):
            self._refuse(stream, ident, parent, "comm_info_reply", problem or "target_name must be a string", comms={})
            return
        comms = {
            k: {"target_name": v.target_name}
            for k, v in self.comm_manager.comms.items()
            if target is None or v.target_name == target
        }
        comms.update(self.engine.widgets.comms(target))
        self._wire().send(stream, "comm_info_reply", {"status": "ok", "comms": comms}, parent, ident)

    def _cancellable_input_request(
        self, prompt: str, ident: Any, parent: Any, password: bool, cancelled: threading.Event
    ) -> str:
        """ipykernel's ``_input_request``, but it gives up once ``cancelled`` is
        set: it runs in a thread here, where no KeyboardInterrupt can reach it,
        so an interrupted prompt would otherwise wait for a reply forever.

        One thread at a time: a zmq socket is not thread-safe, and a cell
        that sent prompts in a burst had threads of superseded prompts and the
        new one's sending and receiving on it at once (libzmq aborted the
        kernel in half of the runs of an attack review; the others sent the
        client interleaved, corrupt messages). A prompt superseded before its
        turn sends nothing."""
        with self._stdin_lock:
            if cancelled.is_set():
                raise InterruptedError("the input prompt was cancelled")
            return self._input_request_locked(prompt, ident, parent, password, cancelled)

    def _input_request_locked(
        self, prompt: str, ident: Any, parent: Any, password: bool, cancelled: threading.Event
    ) -> str:
        import zmq

        while True:  # drop stale replies (an earlier, interrupted prompt's)
            try:
                self.stdin_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EAGAIN:
                    break
                raise
        self._wire().send(
            self.stdin_socket,
            "input_request",
            {"prompt": terminal_safe_output(prompt), "password": password},
            parent,
            ident=ident,
        )
        while not cancelled.is_set():
            rlist, _, xlist = zmq.select([self.stdin_socket], [], [self.stdin_socket], 0.05)
            if not (rlist or xlist):
                continue
            try:
                _, reply = self._wire().recv(self.stdin_socket)
            except Exception:
                self.log.warning("invalid input_reply", exc_info=True)
                continue
            if reply is None:
                continue
            content = reply.get("content") if isinstance(reply, dict) else None
            value = content.get("value") if isinstance(content, dict) else None
            if not isinstance(value, str):
                self.log.error("input_reply without a text value: %r", content)
                value = ""
            return value
        raise InterruptedError("the input prompt was cancelled")

    async def do_complete(self, code: Any, cursor_pos: Any) -> dict[str, Any]:
        problem = requests.text_problem(code, "code", self.max_code_bytes) or requests.cursor_problem(cursor_pos, code)
        if problem:
            return requests.error_reply(problem)
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        try:
            reply = await self.engine.complete(code, cursor_pos)
        except Exception as exc:
            self.log.warning("completion failed: %s", exc)
            reply = {}
        found = reply.get("matches")  # from the sandbox: any JSON at all
        matches = [plain_text(m, 1000) for m in (found if isinstance(found, list) else []) if isinstance(m, str)][
            :10_000
        ]
        start, end = reply.get("cursor_start"), reply.get("cursor_end")
        return {
            "status": "ok",
            "matches": matches,
            "cursor_start": start if isinstance(start, int) and 0 <= start <= len(code) else cursor_pos,
            "cursor_end": end if isinstance(end, int) and 0 <= end <= len(code) else cursor_pos,
            "metadata": clean_completion_metadata(reply.get("metadata"), len(matches)),
        }

    async def do_inspect(
        self, code: Any, cursor_pos: Any, detail_level: Any = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        problem = (
            requests.text_problem(code, "code", self.max_code_bytes)
            or requests.cursor_problem(cursor_pos, code if isinstance(code, str) else "")
            or (
                None
                if detail_level in (0, 1) and not isinstance(detail_level, bool)
                else f"detail_level must be 0 or 1, not {str(detail_level)[:20]!r}"
            )
        )
        if problem:
            return requests.error_reply(problem)
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        try:
            reply = await self.engine.inspect(code, cursor_pos, detail_level)
        except Exception as exc:
            self.log.warning("inspection failed: %s", exc)
            reply = {}
        found = bool(reply.get("found"))
        clean = clean_reply_bundle(reply.get("data") or {}, {}, private=self.engine.private)
        return {"status": "ok", "found": found, "data": clean.data if found else {}, "metadata": {}}

    async def do_is_complete(self, code: Any) -> dict[str, Any]:
        """IPython's answer, off the event loop (it compiles the code: about
        2 s per MB), "unknown" for code over :data:`MAX_IS_COMPLETE_BYTES`
        (a console asks at each Enter; it runs code it gets "unknown" for) and
        for code IPython cannot judge: an attack review's ``1+1+...+1`` raised
        RecursionError while compiling, and the client never got a reply."""
        problem = requests.text_problem(code, "code", self.max_code_bytes)
        if problem:
            return requests.error_reply(problem)
        if utf8_len(code) > MAX_IS_COMPLETE_BYTES:
            return {"status": "unknown"}
        try:
            status, indent = await asyncio.to_thread(self._transformer.check_complete, code)
        except (Exception, RecursionError, MemoryError) as exc:
            self.log.warning("is_complete could not judge the code: %s: %s", type(exc).__name__, text_of(exc, 200))
            return {"status": "unknown"}
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply

    async def do_debug_request(self, msg: Any) -> dict[str, Any]:
        """A refusal in the Debug Adapter Protocol's shape: this kernel has no
        debugger (``kernel_info``'s ``debugger`` is false), and ipykernel's
        default raised, leaving the client without a reply."""
        command = msg.get("command") if isinstance(msg, dict) else None
        seq = msg.get("seq") if isinstance(msg, dict) else None
        return {
            "type": "response",
            "request_seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
            "success": False,
            "command": command if isinstance(command, str) else "",
            "message": "this kernel has no debugger (its kernel_info says debugger: false)",
        }

    async def do_history(
        self,
        hist_access_type: Any,
        output: Any,
        raw: Any,
        session: Any = None,
        start: Any = None,
        stop: Any = None,
        n: Any = None,
        pattern: Any = None,
        unique: Any = False,
    ) -> dict[str, Any]:
        problem = requests.history_problem(hist_access_type, n, start, stop, session, pattern)
        if problem:
            return requests.error_reply(problem, history=[])
        entries = [(1, count, code) for count, code in self.engine.history]
        if hist_access_type == "tail":
            entries = entries[-n:] if n else entries
        elif hist_access_type == "range":
            if session not in (None, 0, 1):
                entries = []
            # IPython names the current session 0 in what it returns for session 0 (the default)
            label = 1 if session == 1 else 0
            entries = [
                (label, count, code)
                for _, count, code in entries
                if (start is None or count >= start) and (stop is None or count < stop)
            ]
        elif hist_access_type == "search":
            glob = pattern or "*"
            entries = [e for e in entries if fnmatch.fnmatchcase(e[2], glob)]
            if unique:
                seen: set[str] = set()
                kept = []
                for entry in reversed(entries):  # the latest of each distinct input
                    if entry[2] not in seen:
                        seen.add(entry[2])
                        kept.append(entry)
                entries = kept[::-1]
            if n:
                entries = entries[-n:]
        else:
            entries = []
        if output:
            return {"status": "ok", "history": [(s, c, (code, None)) for s, c, code in entries]}
        return {"status": "ok", "history": entries}

    def _end_after_reply(self) -> None:
        """A cell ran ``exit``, ``quit()`` or ``kernel.do_shutdown(...)``: as
        ipykernel does, the kernel ends 0.1 s after the cell's reply, and the
        frontend's kernel manager starts a fresh one. The stop is a clean one
        (do_shutdown: the sandbox goes, the state is not resumed), because
        notebooks do this to restart after installing packages. The session's
        privacy level is kept in its store, so the new kernel has it too."""
        if self._end_task is not None:
            return  # already ending (two cells asked, one after the other)

        async def end() -> None:
            await asyncio.sleep(0.1)  # the reply goes out first
            self.log.info("a cell asked the kernel to end (exit, quit or kernel.do_shutdown): ending it")
            await self.do_shutdown(False)
            for stream in (self.control_stream, self.shell_stream):
                if stream is not None:
                    stream.io_loop.add_callback(stream.io_loop.stop)
            self.io_loop.add_callback(self.io_loop.stop)

        self._end_task = asyncio.get_running_loop().create_task(end())  # kept: a task nobody holds may be collected

    # ---- interrupt and shutdown (control thread) ----------------------------------------
    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._send_interrupt_children()

    def _send_interrupt_children(self) -> None:
        """Interrupt the cell in the sandbox, never this process."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.engine.interrupt)

    async def do_shutdown(self, restart: Any) -> dict[str, Any]:
        if getattr(self, "_privacy_poll", None) is not None:
            self._privacy_poll.stop()
        if getattr(self, "_stop_listening", None) is not None:
            self._stop_listening()
        # The status comm is left open on purpose: a comm_close from the kernel
        # tells the widget not to re-open it, but after a restart it must.
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            future = asyncio.run_coroutine_threadsafe(self.engine.shutdown(), self._loop)
            await asyncio.wrap_future(future)
        else:
            await self.engine.shutdown()
        if self._state_root is not None:
            # a clean stop: the next kernel starts afresh (a removal that never
            # raises: a cell's 3,000-deep folder chain made rmtree raise RecursionError)
            await asyncio.to_thread(owned_dirs.remove_tree, self._state_root)
            if self._throwaway_session and not restart:
                # every papermill run left its layer (what a cell wrote there,
                # without a cap) in a folder of its own, for good
                await asyncio.to_thread(owned_dirs.remove_tree, self._packages_dir)
        return {"status": "ok", "restart": restart}
