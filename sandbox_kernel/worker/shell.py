"""The IPython shell inside the sandbox, wired to the host channel.

Mirrors what ipykernel's ZMQInteractiveShell does (display publisher,
displayhook, tracebacks, pager payloads), but every output becomes a framed
JSON message instead of a ZMQ message: the host re-publishes it after
sanitising.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from IPython.core import page
from IPython.core.autocall import ExitAutocall
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.events import EventManager, available_events
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.process import system  # type: ignore[attr-defined]  # re-exported per platform
from traitlets import Instance, default
from traitlets.config import Application, Config

from . import comms, interrupts, kernel_magics, pip_magic, streams
from .cell_names import CellNames
from .channel import Channel
from .protocol import Msg
from .streams import parent_tag


def _flush_std() -> None:
    streams.drain_captures()  # what C code and subprocesses wrote, first
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class ChannelDisplayPublisher(DisplayPublisher):
    channel: Channel | None = None

    def publish(
        self,
        data: Any,
        metadata: Any = None,
        source: Any = None,
        *,
        transient: Any = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        _flush_std()
        msg_type = "update_display_data" if update else "display_data"
        if self.channel is not None and self.channel.enabled:
            self.channel.send(
                {
                    "type": msg_type,
                    "data": data,
                    "metadata": metadata or {},
                    "transient": transient or {},
                    **parent_tag(),
                }
            )

    def clear_output(self, wait: bool = False) -> None:
        _flush_std()
        if self.channel is not None and self.channel.enabled:
            self.channel.send({"type": Msg.CLEAR_OUTPUT, "wait": bool(wait), **parent_tag()})


class ChannelDisplayHook(DisplayHook):
    channel: Channel | None = None
    msg: dict[str, Any] | None = None

    def start_displayhook(self) -> None:
        self.msg = {"data": {}, "metadata": {}}

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
        assert self.msg is not None
        self.msg["data"] = format_dict
        self.msg["metadata"] = md_dict or {}

    def finish_displayhook(self) -> None:
        _flush_std()
        if self.msg is not None and self.msg["data"] and self.channel is not None and self.channel.enabled:
            self.channel.send({"type": Msg.EXECUTE_RESULT, "execution_count": self.prompt_count, **self.msg})
        self.msg = None


#: GUI toolkits and the matplotlib backends that need one (matched case-insensitively)
_GUI = re.compile(r"(qt\d?|tk|gtk\d?|wx|osx|macosx|cocoa|glut|pyglet|gtk3cairo|gtk4cairo)(agg|cairo)?\Z", re.I)


def _refuse_gui(gui: str) -> None:
    from IPython.core.error import UsageError

    if _GUI.match(gui.strip()):
        raise UsageError(
            f"the sandbox has no display, so the GUI backend {gui!r} cannot open windows: "
            "use %matplotlib inline (figures appear in the notebook) or a non-GUI backend such as agg"
        )


class ZMQExitAutocall(ExitAutocall):
    """``exit``, ``quit`` and ``exit(keep_kernel=True)``, as in ipykernel."""

    def __call__(self, keep_kernel: bool = False) -> None:
        shell = self._ip
        assert shell is not None
        shell.keepkernel_on_exit = keep_kernel
        shell.ask_exit()


class WorkerApp(Application):
    """The application singleton code in the sandbox finds, as it finds
    ipykernel's app in a kernel: ``IPython.Application.instance().kernel``."""

    name = "sandbox-worker"
    kernel = comms.KERNEL


class CellEvents(EventManager):
    """IPython's events, except for an interrupt in a callback that runs
    before the cell's code (``pre_execute``, ``pre_run_cell``): IPython
    catches KeyboardInterrupt there, printed "Error in callback" and ran the
    code on. Here the callbacks stop, and the cell stops before its code
    (``interrupts.stop_before_code``)."""

    def trigger(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event not in ("pre_execute", "pre_run_cell"):
            return super().trigger(event, *args, **kwargs)
        for func in self.callbacks[event][:]:
            try:
                func(*args, **kwargs)
            except KeyboardInterrupt:
                interrupts.note_raised()
                return
            except Exception:
                if self.print_on_error:
                    print(f"Error in callback {func} (for {event}), with arguments args {args},kwargs {kwargs}:")
                self.shell.showtraceback()


class ZMQInteractiveShell(InteractiveShell):
    """InteractiveShell whose outputs go to the host channel.

    Named as ipykernel's shell on purpose: libraries decide whether they run
    in a notebook by this class name (rich, plotly, tqdm's older releases,
    many ``is_notebook()`` helpers), and here they do.
    """

    displayhook_class = ChannelDisplayHook
    #: the kernel as the sandbox sees it (comms.KERNEL): the real one is on the host
    kernel = comms.KERNEL
    exiter = Instance(ExitAutocall)
    #: set by ``exit(keep_kernel=True)``; ``exit_now`` (InteractiveShell's) goes
    #: back to the host in the cell's reply, which then ends the kernel
    keepkernel_on_exit: bool | None = None

    @default("exiter")
    def _default_exiter(self) -> ExitAutocall:
        return ZMQExitAutocall(self)

    #: the last error of the running cell (the worker reports it in the cell's reply)
    _last_error: dict[str, Any] | None = None
    #: an error was shown while the displayhook formatted the cell's result
    _error_in_displayhook = False
    display_pub_class = ChannelDisplayPublisher
    channel: Channel | None = None

    def init_events(self) -> None:
        self.events = CellEvents(self, available_events)
        self.events.register("pre_execute", self._clear_warning_registry)

    async def run_code(self, code_obj: Any, result: Any = None, *, async_: bool = False) -> bool:
        """IPython's, but a cell interrupted while IPython prepared it stops
        here, shown as a cell stopped before its code (``interrupts``)."""
        if interrupts.stop_before_code():
            stopped = KeyboardInterrupt()
            if result is not None:
                result.error_in_exec = stopped
            self.showtraceback((KeyboardInterrupt, stopped, None), exception_only=True)
            return True
        try:
            return bool(await super().run_code(code_obj, result, async_=async_))
        finally:
            interrupts.delivered()

    def init_environment(self) -> None:
        """ipykernel's: colour in what cells run (``!ls``, pip, pytest), no pagers."""
        env = os.environ
        env["TERM"] = "xterm-color"
        env["CLICOLOR"] = "1"
        env["FORCE_COLOR"] = "1"
        env["CLICOLOR_FORCE"] = "1"
        env["PAGER"] = "cat"
        env["GIT_PAGER"] = "cat"

    def init_virtualenv(self) -> None:
        """No virtualenv detection: the sandbox's interpreter is the one to use."""

    def init_hooks(self) -> None:
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(self._page_payload), 99)

    def _page_payload(self, strg: Any, start: int = 0, screen_lines: int = 0, pager_cmd: Any = None) -> None:
        data = strg if isinstance(strg, dict) else {"text/plain": strg}
        assert self.payload_manager is not None
        self.payload_manager.write_payload({"source": "page", "data": data, "start": max(0, start)})

    def set_next_input(self, text: str, replace: bool = False) -> None:
        assert self.payload_manager is not None
        self.payload_manager.write_payload({"source": "set_next_input", "text": text, "replace": replace})

    def ask_exit(self) -> None:
        assert self.payload_manager is not None
        self.exit_now = not self.keepkernel_on_exit
        self.payload_manager.write_payload({"source": "ask_exit", "keepkernel": bool(self.keepkernel_on_exit)})

    def enable_matplotlib(self, gui: str | None = None) -> Any:
        """Refuse GUI backends before matplotlib tries to import their toolkit
        (which would fail with a confusing import error instead)."""
        if gui is not None:
            _refuse_gui(gui)
        return super().enable_matplotlib(gui)

    def enable_gui(self, gui: str | None = None) -> None:
        """``%matplotlib`` and ``%gui`` call this (InteractiveShell leaves it to
        subclasses, as ipykernel's shell implements it). Inline and non-GUI
        backends need no event loop; a GUI toolkit cannot work in a sandbox
        that has no display, so the user is told that plainly."""

        if gui is not None:
            _refuse_gui(gui)
        self.active_eventloop = None if gui in (None, "", "none") else gui

    #: set while a standby warms ``run_cell`` up: an error met there is nobody's
    _quiet_errors = False

    def _showtraceback(self, etype: Any, evalue: Any, stb: Any) -> None:
        if self._quiet_errors:
            return
        _flush_std()
        if getattr(self.displayhook, "msg", None) is not None:
            self._error_in_displayhook = True
        self._last_error = {"ename": str(etype.__name__), "evalue": str(evalue), "traceback": list(stb)}
        if self.channel is not None and self.channel.enabled:
            self.channel.send({"type": Msg.ERROR, **self._last_error})

    def system_piped(self, cmd: str) -> None:
        if cmd.rstrip().endswith("&"):
            raise OSError("Background processes not supported.")
        self.user_ns["_exit_code"] = system(self.var_expand(cmd, depth=1))

    system = system_piped


SandboxShell = ZMQInteractiveShell


class _KernelModuleFirst:
    """Loads ipykernel's shell module just before a library that decides by
    its presence (``'ipykernel.zmqshell' in sys.modules``: tqdm.auto) is
    imported. Loading it up front would cost every sandbox's start about
    60 ms; most sessions never import these."""

    WATCHED = frozenset({"tqdm.autonotebook", "tqdm.auto"})

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in self.WATCHED and "ipykernel.zmqshell" not in sys.modules:
            try:
                import ipykernel.zmqshell  # noqa: F401
            except ImportError:  # an image without ipykernel: plain progress bars there
                pass
        return None  # the normal finders import the module itself


def make_shell(channel: Channel) -> ZMQInteractiveShell:
    """Create the one shell of this worker: no history file, no profile dir on disk
    outside the sandbox's private /tmp."""
    config = Config()
    # History in an in-memory database (no file, so no thread writing it):
    # %history -g, %hist -l and %rerun search it, as ipykernel's its file
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "neutral"  # ipykernel leaves IPython's default: the same ANSI colours
    config.InteractiveShell.xmode = "Context"
    config.InteractiveShell.autocall = 0
    # Libraries choose their notebook face by what ipykernel leaves behind: this
    # config section, and ipykernel's shell module being loaded (tqdm.auto).
    config.IPKernelApp = Config()
    sys.meta_path.insert(0, _KernelModuleFirst())
    ChannelDisplayPublisher.channel = channel
    ChannelDisplayHook.channel = channel
    ZMQInteractiveShell.channel = channel
    shell = ZMQInteractiveShell.instance(config=config, compiler_class=CellNames)
    WorkerApp.instance()
    shell._last_error = None
    # %pip installs into the session's package layer (site-packages are read-only)
    pip_magic.packages_dir()
    shell.magics_manager.register_function(_pip_line, magic_kind="line", magic_name="pip")
    kernel_magics.register(shell)  # ipykernel's own (%autosave, %less, ...)
    # IPython's default extension (InteractiveShellApp.default_extensions):
    # %store keeps values in the profile's database, here in the sandbox's
    # private /tmp, so for this sandbox only (never another session's)
    assert shell.extension_manager is not None  # made by InteractiveShell.__init__
    shell.extension_manager.load_extension("storemagic")
    return shell


def _pip_line(line: str) -> None:
    """``%pip ...`` (see worker/pip_magic.py); the exit code goes to ``_exit_code``, as for ``!cmd``."""
    code = pip_magic.pip(line)
    InteractiveShell.instance().user_ns["_exit_code"] = code
