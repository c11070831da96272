"""``exit``, ``quit()`` and ``IPython.Application.instance().kernel.do_shutdown(True)``
end the kernel as they end ipykernel: the cell's reply first, then the process,
which its manager (JupyterLab's, or any AsyncIOLoopKernelManager's) restarts.
Notebooks do this to restart after installing packages, so the stop is a clean
one: the new kernel starts afresh, where a crash would resume the checkpoint.
What a cell cannot do this way is lower its session's privacy level, or leave
its sandbox behind."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
import uuid
from pathlib import Path

import psutil
import pytest
from jupyter_client.ioloop import AsyncIOLoopKernelManager
from kernel_helpers import KERNEL_NAME, SandboxKernelHandle, require_bwrap, status_of
from test_widgets_kernel import comm_id_of, send
from traitlets.config import Config

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def _kernel(tmp_path: Path, session: str, *args: str) -> SandboxKernelHandle:
    require_bwrap()
    for sub in ("ws", "tmp"):
        (tmp_path / sub).mkdir(exist_ok=True)
    return SandboxKernelHandle(
        tmp_path / "ws",
        tmp_path / "tmp",
        extra_args=[
            "--SandboxKernel.backend=bwrap",
            "--SandboxKernel.user_id=tester",
            f"--SandboxKernel.session_id={session}",
            *args,
        ],
        env={"SANDBOX_KERNEL_DATA_DIR": str(tmp_path / "data")},
    )


def _wait_for_exit(k: SandboxKernelHandle, timeout: float = 30) -> int | None:
    """The kernel process's exit status once it ended on its own."""
    proc = k.km.provisioner.process  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the kernel did not end after the cell asked it to"
        time.sleep(0.05)
    return proc.returncode


def _checkpointed(state: Path) -> None:
    deadline = time.monotonic() + 30
    while not (state / "sandbox" / "checkpoint.json").exists():
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "code",
    [
        "exit",
        "quit()",
        "get_ipython().ask_exit()",
        "import IPython\napp = IPython.Application.instance()\napp.kernel.do_shutdown(True)",
        "get_ipython().kernel.do_shutdown(False)",
    ],
)
def test_a_cell_ends_its_kernel_cleanly_and_the_next_starts_afresh(tmp_path: Path, code: str) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    k = _kernel(tmp_path, session)
    state = tmp_path / "data" / "state" / "tester" / session
    try:
        assert k.run("x = 41").status == "ok"
        _checkpointed(state)  # what a crash would resume from
        sandboxes = k.sandboxes()
        assert sandboxes, "no sandbox to watch"
        run = k.run(code)
        assert run.status == "ok", (run.stderr, run.errors)
        assert _wait_for_exit(k) == 0
        for proc in sandboxes:
            assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, "the sandbox outlived its kernel"
        assert not state.exists(), "a clean end leaves no state to resume"
        # what a kernel manager's restarter does for a kernel that ended
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=60)
        run = k.run("x")
        assert run.status == "error" and run.reply["ename"] == "NameError"
        assert "stopped without shutting down" not in run.stderr
    finally:
        k.shutdown()


def test_a_widget_callback_that_restarts_the_kernel_ends_it(tmp_path: Path) -> None:
    """A "Restart" button in a notebook: its callback calls the restart idiom.
    ipykernel ends whenever ``exit_now`` is set, in a cell or in a comm
    handler; the widget message's end used to drop it, and the kernel ran on."""
    k = _kernel(tmp_path, f"s-{uuid.uuid4().hex[:8]}")
    try:
        run = k.run(
            "import ipywidgets as w, IPython\n"
            "b = w.Button(description='Restart')\n"
            "b.on_click(lambda _: IPython.Application.instance().kernel.do_shutdown(True))\n"
            "b"
        )
        assert run.status == "ok", run.stderr
        button = comm_id_of(run, "ButtonModel")
        assert k.run("1").status == "ok"
        time.sleep(0.5)
        assert k.km.is_alive(), "a cell after the button's display ended the kernel"
        sandboxes = k.sandboxes()
        assert sandboxes, "no sandbox to watch"
        send(k, "comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}})
        assert _wait_for_exit(k) == 0
        for proc in sandboxes:
            assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, "the sandbox outlived its kernel"
    finally:
        k.shutdown()


def test_exit_payload_is_ipykernels(tmp_path: Path) -> None:
    k = _kernel(tmp_path, f"s-{uuid.uuid4().hex[:8]}")
    try:
        run = k.run("exit")
        assert run.reply["payload"] == [{"source": "ask_exit", "keepkernel": False}]
        assert _wait_for_exit(k) == 0
    finally:
        k.shutdown()


def test_keep_kernel_keeps_it_and_its_state(tmp_path: Path) -> None:
    k = _kernel(tmp_path, f"s-{uuid.uuid4().hex[:8]}")
    try:
        assert k.run("x = 41").status == "ok"
        run = k.run("exit(keep_kernel=True)")
        assert run.reply["payload"] == [{"source": "ask_exit", "keepkernel": True}]
        time.sleep(1)
        assert k.km.is_alive()
        assert k.run("print(x + 1)").stdout == "42\n"
        # a plain exit after it ends the kernel: keep_kernel holds for its own call only
        k.run("exit")
        assert _wait_for_exit(k) == 0
    finally:
        k.shutdown()


def test_the_kernel_object_cells_see(tmp_path: Path) -> None:
    """What libraries use of ``get_ipython().kernel``: the shell, the comm
    manager (comm targets of older widget libraries), and the same object as
    the app's, as in ipykernel."""
    k = _kernel(tmp_path, f"s-{uuid.uuid4().hex[:8]}")
    try:
        run = k.run(
            "import IPython, comm\n"
            "kernel = get_ipython().kernel\n"
            "print(kernel is IPython.Application.instance().kernel, kernel.shell is get_ipython(),\n"
            "      kernel.comm_manager is comm.get_comm_manager())"
        )
        assert run.stdout == "True True True\n", (run.stdout, run.stderr)
        # %notebook writes the kernel's language_info into the notebook it saves, as with ipykernel
        assert k.run("%notebook saved.ipynb").status == "ok"
        saved = json.loads((k.workspace / "saved.ipynb").read_text())
        assert saved["metadata"]["language_info"]["name"] == "python"
        assert saved["metadata"]["language_info"]["version"] == platform.python_version()
    finally:
        k.shutdown()


def test_exit_does_not_lower_the_privacy_level(tmp_path: Path) -> None:
    """Guarantee 3: a private session's cell that ends its kernel (a clean
    stop, the state dropped) gets a kernel that is just as private."""
    k = _kernel(tmp_path, f"s-{uuid.uuid4().hex[:8]}", "--SandboxKernel.network=full")
    try:
        k.run("%private ledger CONFIDENTIAL")  # the cell stops there (an error), the session is private
        assert k.run(IFACES).stdout.strip() == "['lo']"
        k.run("exit")
        assert _wait_for_exit(k) == 0
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=60)
        assert k.run(IFACES).stdout.strip() == "['lo']"
        assert status_of(k)["level"] == "CONFIDENTIAL"
    finally:
        k.shutdown()


def test_the_managers_restarter_brings_a_fresh_kernel(tmp_path: Path) -> None:
    """The path JupyterLab takes: jupyter_server's kernel manager notices the
    ended kernel and restarts it by itself."""
    require_bwrap()
    for sub in ("ws", "tmp", "data"):
        (tmp_path / sub).mkdir()
    session = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        km = AsyncIOLoopKernelManager(
            kernel_name=KERNEL_NAME, config=Config({"KernelRestarter": {"time_to_dead": 0.5}})
        )
        env = {"TMPDIR": str(tmp_path / "tmp"), "SANDBOX_KERNEL_DATA_DIR": str(tmp_path / "data")}
        await km.start_kernel(
            cwd=str(tmp_path / "ws"),
            env={**os.environ, **env},
            extra_arguments=["--SandboxKernel.user_id=tester", f"--SandboxKernel.session_id={session}"],
        )
        restarted = asyncio.Event()
        km.add_restart_callback(restarted.set, "restart")
        km.start_restarter()
        try:
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            await kc.execute_interactive("x = 41", timeout=60)
            first_pid = km.provisioner.process.pid  # type: ignore[union-attr]
            reply = await kc.execute_interactive("quit()", timeout=60)
            assert reply["content"]["status"] == "ok"
            await asyncio.wait_for(restarted.wait(), 60)
            kc.stop_channels()
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            assert km.provisioner.process.pid != first_pid  # type: ignore[union-attr]
            reply = await kc.execute_interactive("x", timeout=60)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "NameError"
            kc.stop_channels()
        finally:
            km.stop_restarter()
            await km.shutdown_kernel(now=False)

    asyncio.run(scenario())
