"""Comms inside the sandbox: ipywidgets' ``Comm`` objects talk to the host over the channel.

ipykernel gives ``comm.create_comm`` / ``comm.get_comm_manager`` their kernel
implementations; the worker has no ZMQ, so here a comm's messages become
``Msg.COMM`` frames, which the host checks (outputs/widgets.py) and publishes
on iopub. Frontend messages for these comms arrive as ``Op.COMM`` and are
handled like a cell: in the forked child, which then holds the state (a
slider's new value is part of the namespace from then on).

``kernel`` on every comm answers ``get_parent()`` with the request being
handled, which is how ipywidgets' ``Output`` widget learns which outputs to
capture.
"""

from __future__ import annotations

import base64
from typing import Any

import comm
from comm.base_comm import BaseComm, BuffersType, CommManager, MaybeDict

from .channel import Channel
from .language import language_info
from .protocol import Msg


class _KernelFace:
    """The kernel as code in the sandbox sees it (``comm.kernel``,
    ``get_ipython().kernel``, ``IPython.Application.instance().kernel``): the
    parts of ipykernel's kernel that libraries and notebooks use. The real
    kernel runs on the host, out of reach."""

    def __init__(self) -> None:
        self.parent: dict[str, Any] = {}

    def get_parent(self, channel: str = "shell") -> dict[str, Any]:
        return self.parent

    @property
    def _parent_header(self) -> dict[str, Any]:  # ipywidgets < 8 asks for this name
        return self.parent

    @property
    def comm_manager(self) -> CommManager:
        """Older widget libraries register comm targets here (pyviz_comms, bokeh)."""
        return _get_comm_manager()

    @property
    def shell(self) -> Any:
        from IPython.core.interactiveshell import InteractiveShell

        return InteractiveShell.instance() if InteractiveShell.initialized() else None

    @property
    def language_info(self) -> dict[str, Any]:
        """``%notebook`` writes it into the notebook it saves."""
        return language_info()

    def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Notebooks restart their kernel from code after installing packages
        (``IPython.Application.instance().kernel.do_shutdown(True)``): as with
        ipykernel, the kernel ends once the cell's reply is sent, and its
        manager starts a fresh one."""
        shell = self.shell
        if shell is not None:
            shell.exit_now = True
        return {"status": "ok", "restart": restart}


KERNEL = _KernelFace()
_channel: Channel | None = None


class ChannelComm(BaseComm):
    """A comm whose messages go to the host as framed JSON (buffers base64)."""

    kernel = KERNEL

    def publish_msg(
        self,
        msg_type: str,
        data: MaybeDict = None,
        metadata: MaybeDict = None,
        buffers: BuffersType = None,
        **keys: Any,
    ) -> None:
        if _channel is None or not _channel.enabled:
            return
        from .shell import _flush_std

        _flush_std()  # earlier prints first, as ipykernel orders them
        content = {"data": {} if data is None else data, "comm_id": self.comm_id, **keys}
        _channel.send(
            {
                "type": Msg.COMM,
                "msg_type": msg_type,
                "content": content,
                "metadata": {} if metadata is None else metadata,
                "buffers": [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or []],
            }
        )


_manager: CommManager | None = None


def _get_comm_manager() -> CommManager:
    global _manager
    if _manager is None:
        _manager = CommManager()
    return _manager


def install(channel: Channel) -> None:
    """Make ``comm`` (and so ipywidgets) use the channel; before any cell runs."""
    global _channel
    _channel = channel
    comm.create_comm = ChannelComm
    comm.get_comm_manager = _get_comm_manager


def handle(msg: dict[str, Any]) -> None:
    """Deliver a frontend comm message (``Op.COMM``) to its comm, as
    ipykernel's comm manager would; handler errors are printed to stderr."""
    msg_type = str(msg.get("msg_type"))
    parent_id = str(msg.get("parent_id") or "")
    header = {"msg_id": parent_id, "msg_type": msg_type}
    KERNEL.parent = {"header": header, "msg_id": parent_id, "msg_type": msg_type}
    buffers = [base64.b64decode(b) for b in msg.get("buffers") or [] if isinstance(b, str)]
    request = {
        "header": header,
        "parent_header": {},
        "metadata": msg.get("metadata") or {},
        "content": msg.get("content") or {},
        "buffers": [memoryview(b) for b in buffers],
    }
    manager = _get_comm_manager()
    if msg_type == "comm_open":
        manager.comm_open(None, None, request)  # type: ignore[arg-type]
    elif msg_type == "comm_msg":
        manager.comm_msg(None, None, request)  # type: ignore[arg-type]
    elif msg_type == "comm_close":
        manager.comm_close(None, None, request)  # type: ignore[arg-type]


def set_parent(parent_id: str, msg_type: str) -> None:
    """The request a cell runs for (an Output widget captures its outputs)."""
    header = {"msg_id": parent_id, "msg_type": msg_type}
    KERNEL.parent = {"header": header, "msg_id": parent_id, "msg_type": msg_type} if parent_id else {}
