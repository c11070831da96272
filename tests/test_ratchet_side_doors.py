"""Side doors of the ratchet (issue: private data never reaches a sandbox with
network): a restart that forgets, and a slow or uncooperative sandbox that
keeps its network after a host-side rise."""

from __future__ import annotations

import time
from pathlib import Path

from kernel_helpers import SandboxKernelHandle, require_bwrap
from sandbox_kernel.privacy import PrivacyStore, PrivateData

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def _kernel(tmp_path: Path, name: str = "k") -> SandboxKernelHandle:
    require_bwrap()
    (tmp_path / f"{name}-ws").mkdir()
    (tmp_path / f"{name}-tmp").mkdir()
    return SandboxKernelHandle(tmp_path / f"{name}-ws", tmp_path / f"{name}-tmp", extra_args=["--SandboxKernel.backend=bwrap"])


def test_restart_without_notebook_path_keeps_the_session(tmp_path: Path) -> None:
    """nbclient/papermill/a bare KernelManager: no JPY_SESSION_NAME. A restart by
    the manager (same connection file) came back PUBLIC with network."""
    k = _kernel(tmp_path)
    try:
        assert len(eval(k.run(IFACES).stdout)) > 1  # public: has network
        run = k.run("%private payroll CONFIDENTIAL")
        assert k.run(IFACES).stdout.strip() == "['lo']", run.stderr
        for _ in range(2):  # a restart, and another one
            k.km.restart_kernel(now=True)
            k.kc.wait_for_ready(timeout=60)
            assert k.run(IFACES).stdout.strip() == "['lo']"
            run = k.run("import sandbox_kernel.private as p\nprint(p.mark_private('INTERNAL'))")
            assert run.stdout.strip() == "CONFIDENTIAL", (run.stdout, run.stderr, run.errors)
    finally:
        k.shutdown()


def test_different_kernels_without_notebook_path_stay_independent(tmp_path: Path) -> None:
    """The restart rule must not merge unrelated runs: a second kernel (its own
    connection file) is a new session, public with network."""
    a = _kernel(tmp_path, "a")
    b = _kernel(tmp_path, "b")
    try:
        a.run("%private payroll CONFIDENTIAL")
        assert a.run(IFACES).stdout.strip() == "['lo']"
        assert len(eval(b.run(IFACES).stdout)) > 1
    finally:
        a.shutdown()
        b.shutdown()


def test_host_rise_cuts_a_busy_uncooperative_sandbox_at_once(tmp_path: Path) -> None:
    """A connector raises the level from host Python while a cell is busy (in a
    long C call that ignores signals) and a daemonised child of the cell holds a
    connection open. The sandbox's network must be gone within the poll interval,
    without the sandbox's help: the daemon, polling its interfaces, sees only lo."""
    k = _kernel(tmp_path)
    try:
        # State whose checkpoint is slow (the old code checkpointed before it
        # cut), and a daemon that reports its interfaces every 20 ms.
        run = k.run(
            "import subprocess, sys, time\n"
            "class Slow:\n"
            "    def __reduce__(self):\n"
            "        time.sleep(25)\n"
            "        return (Slow, ())\n"
            "slow = Slow()\n"
            "daemon = subprocess.Popen([sys.executable, '-c', '''\n"
            "import os, socket, time\n"

            "while True:\n"
            "    names = sorted(n for _, n in socket.if_nameindex())\n"
            "    open('/workspace/ifaces.tmp', 'w').write(repr(names)); os.replace('/workspace/ifaces.tmp', '/workspace/ifaces')\n"
            "    time.sleep(0.02)\n"
            "'''], start_new_session=True)\n"
            "print(daemon.pid)"
        )
        assert run.status == "ok", run.errors
        ifaces = k.workspace / "ifaces"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (ifaces.exists() and "lo" in ifaces.read_text() and ifaces.read_text() != "['lo']"):
            time.sleep(0.05)
        assert ifaces.read_text() != "['lo']", "the daemon never saw the network"
        # The cell is busy for a long time and does not cooperate (SIGINT ignored).
        msg_id = k.kc.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)")
        time.sleep(1.0)
        store = PrivacyStore(k.data_dir / "privacy")
        user_id, session_id = _identity(k)
        PrivateData(user_id, session_id, store).add_private_dataset("crm", "SECRET", source="connector")
        raised = time.monotonic()
        cut_after = None
        while time.monotonic() - raised < 10:
            if ifaces.read_text() == "['lo']":
                cut_after = time.monotonic() - raised
                break
            time.sleep(0.02)
        assert cut_after is not None, "the sandbox still had its network 10 s after the host-side rise"
        print(f"network cut {cut_after * 1000:.0f} ms after the host-side rise")
        # the kernel goes on serving once the busy cell is dealt with
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = k.kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()


def _identity(k: SandboxKernelHandle) -> tuple[str, str]:
    """user_id and session_id of the kernel's ratchet, from its status comm."""
    comm_id = "side-doors-status"
    k.kc.session.send(
        k.kc.shell_channel.socket, "comm_open",
        {"comm_id": comm_id, "target_name": "sandbox_kernel.status", "data": {"version": 1}},
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if msg["msg_type"] == "comm_msg" and msg["content"].get("comm_id") == comm_id:
            data = msg["content"]["data"]
            state = data.get("state", data)
            if "session_id" in state:
                return state["user_id"], state["session_id"]
    raise AssertionError("no status from the kernel's comm")
