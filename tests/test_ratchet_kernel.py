"""The private-data ratchet through a real kernel: every way up, no way down (guarantee 3)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from kernel_helpers import SandboxKernelHandle, require_bwrap

from sandbox_kernel.privacy import PrivacyStore, PrivateData

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def new_kernel(tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "k") -> SandboxKernelHandle:
    require_bwrap()
    (tmp_path / f"{name}-ws").mkdir(exist_ok=True)
    (tmp_path / f"{name}-tmp").mkdir(exist_ok=True)
    # FULL mode: these tests are about the replacement path (PROXIED: tests/test_proxied_kernel.py)
    return SandboxKernelHandle(
        tmp_path / f"{name}-ws", tmp_path / f"{name}-tmp", extra_args=["--SandboxKernel.network=full", *args], env=env
    )


def test_cell_raising_the_ratchet_is_stopped_there(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    assert k.run("kept = 'earlier state'").status == "ok"
    assert "eth0" in k.run(IFACES).stdout or len(eval(k.run(IFACES).stdout)) > 1
    run = k.run(
        "import sandbox_kernel.private as p\n"
        "p.add_dataset('patients', 'CONFIDENTIAL')\n"
        "open('/workspace/after-ratchet.txt', 'w').write('leaked while online')"
    )
    assert run.status == "error" and "stopped at that point" in run.reply["evalue"]
    assert "[SYSTEM] Network access has been restricted" in run.stderr
    assert not (k.workspace / "after-ratchet.txt").exists(), "statements after the ratchet ran with network"
    assert k.run(IFACES).stdout.strip() == "['lo']"
    assert k.run("kept").result["text/plain"] == "'earlier state'"
    # in a network-less sandbox the same call just records and returns
    run = k.run("import sandbox_kernel.private as p\nprint(p.add_dataset('more', 'SECRET'))\nprint('continued')")
    assert run.status == "ok" and "SECRET" in run.stdout and "continued" in run.stdout


def test_magic_and_no_way_down_from_cells(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    k.run("%private ledger INTERNAL")
    assert k.run(IFACES).stdout.strip() == "['lo']"
    run = k.run("import sandbox_kernel.private as p\np.add_dataset('other', 'PUBLIC')")
    assert run.status == "error" and "PUBLIC" in run.reply["evalue"]
    run = k.run("print(p.add_dataset('ledger', 'INTERNAL'), p.mark_private('CONFIDENTIAL'))")
    assert run.stdout.split() == ["INTERNAL", "CONFIDENTIAL"]
    run = k.run("p.add_dataset('', 'SECRET')")
    assert run.status == "error"
    # a cell cannot write the host store: it is not mounted anywhere
    run = k.run(
        "import os\nprint([p for p in ('/root/.local', '/privacy', os.environ.get('SANDBOX_KERNEL_DATA_DIR', '')) if p and os.path.exists(p)])"
    )
    assert run.stdout.strip() == "[]"


def _kernel_with_hr(tmp_path: Path) -> tuple[SandboxKernelHandle, Path]:
    """A kernel whose config names the SECRET dataset ``hr`` (``tmp_path/hr.csv``,
    outside its workspace), and that file."""
    data = tmp_path / "hr.csv"
    data.write_text("name,salary\nada,100\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "sandbox_kernel_config.py").write_text(
        f"c.SandboxKernel.private_datasets = {{'hr': {{'source': {str(data)!r}, 'sensitivity': 'SECRET'}}}}\n"
    )
    return new_kernel(tmp_path, env={"JUPYTER_CONFIG_DIR": str(config)}), data


def test_private_mount_only_after_the_ratchet(tmp_path: Path) -> None:
    k, data = _kernel_with_hr(tmp_path)
    try:
        run = k.run("import os\nprint(os.path.exists('/private/hr'), os.path.exists('/private'))")
        assert run.stdout.strip() == "False False"
        run = k.run("import sandbox_kernel.private as p\nf = p.open_dataset('hr')\nprint('read online:', f.read())")
        assert run.status == "error" and "read online" not in run.stdout
        run = k.run("import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read())")
        assert run.status == "ok" and "ada,100" in run.stdout
        run = k.run("open('/private/hr', 'a').write('x')")
        assert run.status == "error" and run.reply["ename"] in ("OSError", "PermissionError")
        run = k.run("p.open_dataset('unknown')")
        assert run.status == "error" and "configured: hr" in run.reply["evalue"]
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()
    assert data.read_text() == "name,salary\nada,100\n"


def test_a_dataset_saved_anew_on_the_host_is_mounted_anew(tmp_path: Path) -> None:
    """A bind mount holds the file it was made with: once a host program saves
    the source by renaming a new copy over it (an atomic save), the private
    sandbox read the old rows at /private/hr for the rest of its life. It is
    replaced by one mounting the new file at the next cell, with its state."""
    k, data = _kernel_with_hr(tmp_path)
    try:
        read = "import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read())"
        k.run(read)  # the rise: this cell is stopped (it had network)
        run = k.run("kept = 42\n" + read)
        assert run.status == "ok" and "ada,100" in run.stdout, (run.stdout, run.stderr)
        fresh = tmp_path / ".hr.csv.new"
        fresh.write_text("name,salary\nada,100\nbob,200\n")
        os.replace(fresh, data)
        run = k.run(read + "\nprint(kept)")
        assert run.status == "ok" and "bob,200" in run.stdout and "42" in run.stdout, (run.stdout, run.stderr)
        assert "changed on the host" in run.stderr and str(data) in run.stderr, run.stderr
        assert k.run(IFACES).stdout.strip() == "['lo']"
        run = k.run(read)  # the same file now: no new sandbox
        assert "bob,200" in run.stdout and "changed on the host" not in run.stderr, (run.stdout, run.stderr)
    finally:
        k.shutdown()


def test_host_api_raise_is_noticed_and_survives_restart_and_new_kernels(tmp_path: Path) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    args = [
        "--SandboxKernel.user_id=tester",
        f"--SandboxKernel.session_id={session}",
        "--SandboxKernel.privacy_poll_interval=0.2",
    ]
    k = new_kernel(tmp_path, *args)
    store = PrivacyStore(k.data_dir / "privacy")
    try:
        k.run("x = 1")
        assert k.run(IFACES).stdout.strip() != "['lo']"
        PrivateData("tester", session, store).add_private_dataset("crm-export", "CONFIDENTIAL", source="connector")
        time.sleep(1.0)
        run = k.run(IFACES)
        assert run.stdout.strip() == "['lo']"
        assert "[SYSTEM]" in run.stderr
        assert k.run("x").result["text/plain"] == "1"
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()
    # a brand-new kernel on the same session (same store) starts without network
    k2 = new_kernel(tmp_path, *args, env={"SANDBOX_KERNEL_DATA_DIR": str(k.data_dir)}, name="k2")
    try:
        assert k2.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k2.shutdown()


def test_corrupt_store_fails_closed(tmp_path: Path) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    data_dir = tmp_path / "data"
    store_file = data_dir / "privacy" / "tester" / f"{session}.json"
    store_file.parent.mkdir(parents=True)
    store_file.parent.chmod(0o700)
    store_file.write_text("{not json")
    store_file.chmod(0o600)
    k = new_kernel(
        tmp_path,
        "--SandboxKernel.user_id=tester",
        f"--SandboxKernel.session_id={session}",
        env={"SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
    )
    try:
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()


def test_private_outputs_lose_external_urls(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    code = "from IPython.display import HTML\nHTML('<p>hi</p><img src=\"https://tracker.example/p.png\">')"
    before = k.run(code).result["text/html"]
    assert "tracker.example" in before
    k.run("%private secret-doc")
    after = k.run(code).result["text/html"]
    assert "<p>hi</p>" in after and "tracker.example" not in after


# ---- the status comm, as the widget speaks it ---------------------------------------------
class CommClient:
    def __init__(self, k: SandboxKernelHandle) -> None:
        self.k = k
        self.comm_id = uuid.uuid4().hex

    def _send(self, msg_type: str, content: dict[str, Any]) -> None:
        msg = self.k.kc.session.msg(msg_type, content)
        self.k.kc.shell_channel.send(msg)

    def open(self) -> list[dict[str, Any]]:
        self._send(
            "comm_open",
            {"comm_id": self.comm_id, "target_name": "sandbox_kernel.status", "data": {"version": 1, "type": "hello"}},
        )
        return self.collect()

    def send(self, data: Any) -> list[dict[str, Any]]:
        self._send("comm_msg", {"comm_id": self.comm_id, "data": data})
        return self.collect()

    def collect(self, timeout: float = 10, want: int = 1) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.k.kc.get_iopub_msg(timeout=0.2)
            except Exception:
                if len(found) >= want:
                    break
                continue
            if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == self.comm_id:
                found.append(msg["content"]["data"])
        return found


def test_status_comm_reports_and_refuses_lowering(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    k.run("1")
    comm = CommClient(k)
    state = comm.open()[-1]
    assert state["type"] == "state" and state["state"]["network"] == "full" and state["state"]["backend"] == "bwrap"
    assert state["state"]["enforces_network"] is True  # the widget may say "Network cut" after a rise
    errors = comm.send({"version": 1, "type": "mark_private", "level": "PUBLIC"})
    assert errors[0]["type"] == "error"
    errors = comm.send({"version": 2, "type": "request_state"})
    assert errors[0]["type"] == "error" and "version" in errors[0]["message"]
    replies = comm.send({"version": 1, "type": "mark_private", "level": "CONFIDENTIAL", "reason": "test"})
    states = [r for r in replies if r["type"] == "state"]
    assert states and states[-1]["state"]["level"] == "CONFIDENTIAL" and states[-1]["state"]["network"] == "none"
    # the popup can say who made the session private, and why
    assert any(d["source"] == "widget" and "test" in d["name"] for d in states[-1]["state"]["datasets"])
    # The rise replaces the sandbox in the background, and its state pushes
    # (replacing, ready) may land among the next request's replies: look for the
    # error among them, and no state may say the level went down.
    replies = comm.send({"version": 1, "type": "mark_private", "level": "INTERNAL"})
    errors = [r for r in replies if r["type"] == "error"]
    assert errors and "lower" in errors[0]["message"], replies
    assert all(r["state"]["level"] == "CONFIDENTIAL" for r in replies if r["type"] == "state"), replies
    replies = comm.send({"version": 1, "type": "request_state"})
    assert replies[-1]["state"]["level"] == "CONFIDENTIAL"  # nothing went down; the comm still answers
    run = k.run(IFACES)
    assert run.stdout.strip() == "['lo']"
    assert "[SYSTEM]" in run.stderr


def test_status_comm_on_the_subprocess_backend_does_not_claim_a_cut(tmp_path: Path) -> None:
    """The development fallback isolates nothing: a rise cuts no network, the
    kernel refuses every later cell instead (e3b4765). The state the widget
    reads says so (``enforces_network`` false, ``network`` "none" because no
    code of the session runs any more), and so does every notice it gets."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    k = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=subprocess"])
    try:
        assert k.run("1 + 1").status == "ok"
        comm = CommClient(k)
        state = comm.open()[-1]["state"]
        assert (state["backend"], state["enforces_network"], state["network"]) == ("subprocess", False, "full")
        replies = comm.send({"version": 1, "type": "mark_private", "level": "CONFIDENTIAL"})
        replies += comm.collect(timeout=2, want=0)
        states = [r for r in replies if r["type"] == "state"]
        assert states and states[-1]["state"]["level"] == "CONFIDENTIAL", replies
        assert (states[-1]["state"]["network"], states[-1]["state"]["enforces_network"]) == ("none", False)
        notices = [r["notice"] for r in states if r.get("notice")]
        assert notices and all("NOT cut" in n for n in notices), notices
        assert not any("no network from now on" in n or "Outbound connections are blocked" in n for n in notices)
        run = k.run("print('still running')")
        assert run.status == "error" and "still running" not in run.stdout
    finally:
        k.shutdown()


def test_a_cell_raising_the_level_on_the_subprocess_backend_is_told_nothing_was_cut(tmp_path: Path) -> None:
    """The cell that makes a session private on the development fallback is
    stopped there, as on a sandbox with network; what it is told must not speak
    of a sandbox whose network was cut (there is neither)."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    k = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", extra_args=["--SandboxKernel.backend=subprocess"])
    try:
        run = k.run("import sandbox_kernel.private as p\np.add_dataset('payroll', 'CONFIDENTIAL')\nprint('went on')")
        said = run.stdout + run.stderr + " ".join(str(e) for e in run.errors)
        assert run.status == "error" and "went on" not in run.stdout, said
        assert "NOT sandboxed" in said and "cannot be cut" in said, said
        assert "while its sandbox had network" not in said, said
    finally:
        k.shutdown()


def test_a_second_open_of_the_live_status_comm_leaves_it_working(fresh_kernel: SandboxKernelHandle) -> None:
    """A frontend that opens the same comm id twice (found by an audit):
    ipykernel replaced the live comm, the replaced object's ``__del__`` told
    the frontend the comm was closed, and the widget stopped hearing about
    rises while it still showed "network on". The second open is refused;
    the comm goes on and the rise reaches it."""
    k = fresh_kernel
    k.run("1")
    comm = CommClient(k)
    assert comm.open()[-1]["type"] == "state"
    comm._send(
        "comm_open",
        {"comm_id": comm.comm_id, "target_name": "sandbox_kernel.status", "data": {"version": 1, "type": "hello"}},
    )
    # the kernel's collector frees the replaced comm (a cycle) once enough is
    # allocated: a large message from the frontend does that
    comm._send("comm_msg", {"comm_id": "no-such-comm", "data": {"junk": [{} for _ in range(300_000)]}})
    deadline = time.monotonic() + 5
    closed = []
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.2)
        except Exception:
            continue
        if msg["msg_type"] == "comm_close" and msg["content"].get("comm_id") == comm.comm_id:
            closed.append(msg)
    assert not closed, closed
    k.run("%private patients CONFIDENTIAL")
    states = [r for r in comm.send({"version": 1, "type": "request_state"}) if r["type"] == "state"]
    assert states and states[-1]["state"]["level"] == "CONFIDENTIAL", states


def test_a_cell_naming_many_datasets_keeps_the_store_small(tmp_path: Path) -> None:
    """Each dataset record lengthens every later write of the session's file,
    and a cell's requests are answered on the host's event loop: a cell adding
    2,000 datasets took 154 s of it. Past MAX_CELL_DATASETS (100) a cell's new
    dataset raises the level as a mark, unlisted, said once; the ratchet still
    only goes up."""
    session = f"s-{uuid.uuid4().hex[:8]}"
    k = new_kernel(tmp_path, "--SandboxKernel.user_id=tester", f"--SandboxKernel.session_id={session}")
    store = PrivacyStore(k.data_dir / "privacy")
    try:
        k.run(
            "import sandbox_kernel.private as p\np.add_dataset('first', 'CONFIDENTIAL')"
        )  # (the rise replaces the sandbox)
        # a mark's fast path does not swallow the datasets named after it
        k.run("import sandbox_kernel.private as p\np.mark_private('CONFIDENTIAL')\np.add_dataset('after-mark')")
        assert "after-mark" in {d.name for d in store.read("tester", session).datasets}
        run = k.run(
            "import sandbox_kernel.private as p\n"
            "for i in range(150):\n"
            "    p.add_dataset(f'd{i}', 'CONFIDENTIAL')\n"
            "print('added')",
            timeout=300,
        )
        assert run.stdout == "added\n" and run.stderr.count("are not listed") == 1, run.stderr
        state = store.read("tester", session)
        assert len(state.datasets) == 100 and state.sensitivity.name == "CONFIDENTIAL"
        assert k.run("p.add_dataset('d7', 'SECRET'); p.add_dataset('late', 'SECRET')").status == "ok"
        state = store.read("tester", session)
        assert state.sensitivity.name == "SECRET" and len(state.datasets) == 100
        assert next(d for d in state.datasets if d.name == "d7").sensitivity.name == "SECRET"  # a listed one rises
    finally:
        k.shutdown()
