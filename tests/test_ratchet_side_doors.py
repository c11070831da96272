"""Side doors of the ratchet (issue: private data never reaches a sandbox with
network): a restart that forgets, and a slow or uncooperative sandbox that
keeps its network after a host-side rise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
from kernel_helpers import (
    RecordingHTTPServer,
    SandboxKernelHandle,
    configured_kernel,
    leaking_module,
    reply_to,
    require_bwrap,
    shared_data_kernel,
    status_of,
)
from test_forged_frames import FORGE

from sandbox_kernel.privacy import PrivacyStore, PrivateData

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


def _kernel(tmp_path: Path, name: str = "k", *extra: str) -> SandboxKernelHandle:
    require_bwrap()
    (tmp_path / f"{name}-ws").mkdir()
    (tmp_path / f"{name}-tmp").mkdir()
    return SandboxKernelHandle(
        tmp_path / f"{name}-ws",
        tmp_path / f"{name}-tmp",
        extra_args=["--SandboxKernel.backend=bwrap", "--SandboxKernel.network=full", *extra],
    )


#: a cell keeping the host's loop busy for about 14 s: two 19 MB HTML displays
#: built to be slow to clean (``BUSY_BUDGET`` lets both in)
BUSY_CELL = (
    "from IPython.display import HTML\nhtml = '<b>' * ((19 << 20) // 3)\nfor _ in range(2):\n    display(HTML(html))\n"
)
BUSY_BUDGET = f"--SandboxKernel.max_output_bytes={60 << 20}"


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
        # State whose checkpoint is slower than the 10 s the cut is given (the
        # old code checkpointed before it cut), and a daemon that reports its
        # interfaces every 20 ms.
        run = k.run(
            "import subprocess, sys, time\n"
            "class Slow:\n"
            "    def __reduce__(self):\n"
            "        time.sleep(12)\n"
            "        return (Slow, ())\n"
            "slow = Slow()\n" + IFACES_DAEMON
        )
        assert run.status == "ok", run.errors
        ifaces = _wait_for_network(k)
        # The cell is busy for a long time and does not cooperate (SIGINT ignored).
        msg_id = k.kc.execute(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)", stop_on_error=False
        )
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
        reply_to(k, msg_id)  # the busy cell's reply (it was stopped, its state carried)
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()


def test_a_sandbox_keeping_the_host_busy_is_cut_on_time(tmp_path: Path) -> None:
    """The poll runs on the kernel's event loop, and so does the cleaning of
    what a sandbox sends. A cell whose outputs are built to be slow to clean
    kept the loop busy for seconds, and a host-side rise made meanwhile cut its
    network only afterwards (5 s later, measured). The cut watchdog's thread
    must cut it while the host is still cleaning."""
    k = _kernel(tmp_path, "k", BUSY_BUDGET)
    try:
        run = k.run(IFACES_DAEMON)
        assert run.status == "ok", run.errors
        assert k.run("del daemon\nkept = 'state'").status == "ok"  # (a Popen is not checkpointed)
        time.sleep(1.0)  # the checkpoint at idle
        msg_id, raised, cut_after = _rise_while_busy(k, BUSY_CELL)
        assert cut_after is not None, "the sandbox still had its network 60 s after the host-side rise"
        reply_to(k, msg_id)
        replied_after = time.monotonic() - raised
        print(f"network cut {cut_after * 1000:.0f} ms after the rise, the reply {replied_after:.1f} s after it")
        assert cut_after < 2.0, f"the network was cut {cut_after:.1f} s after the rise (the poll interval is 0.25 s)"
        # the attack held the loop: the reply was still being cleaned well after the cut
        assert replied_after > cut_after + 0.5, (cut_after, replied_after)
        # the loop's poll did the rest: the cell stopped, a sandbox without
        # network, the state of earlier cells carried over
        assert k.run(IFACES).stdout.strip() == "['lo']"
        assert k.run("print(kept)").stdout == "state\n"
    finally:
        k.shutdown()


def test_frames_that_hold_the_hosts_gil_do_not_delay_the_cut(tmp_path: Path) -> None:
    """The cut watchdog is a thread: it needs the GIL. Counting the values of a
    64 MB frame of short strings (before refusing to parse it) held the GIL
    5.4 s in one call, so a cell writing such frames on its channel kept its
    network seconds after a rise, watchdog or not. The count now goes a
    window at a time (tests/test_frame_value_count.py)."""
    k = _kernel(tmp_path)
    try:
        run = k.run(IFACES_DAEMON)
        assert run.status == "ok", run.errors
        assert k.run("del daemon\nkept = 'state'").status == "ok"  # (a Popen is not checkpointed)
        time.sleep(1.0)  # the checkpoint at idle
        msg_id, _, cut_after = _rise_while_busy(
            k,
            FORGE + "body = b'[\"' + b'a\",\"' * (16 * 1024 * 1024 - 1) + b'\"]'  # the largest frame\n"
            "for _ in range(6):\n"
            "    forge(None, raw=body)\n",
        )
        print(f"network cut {cut_after} s after the rise")
        assert cut_after is not None and cut_after < 2.0, f"the network was cut {cut_after} s after the rise"
        # Stopped in the middle of a frame, the cell's process left the host
        # waiting for the rest of it: the kernel hung for good. The sandbox
        # now goes when the kill is not answered, the state kept.
        reply_to(k, msg_id, timeout=60)
        assert k.run(IFACES).stdout.strip() == "['lo']"
        run = k.run("print(kept)")
        assert run.stdout == "state\n", (run.stderr, run.errors)
    finally:
        k.shutdown()


def _rise_while_busy(k: SandboxKernelHandle, code: str) -> tuple[str, float, float | None]:
    """Run ``code`` (a cell that keeps the host busy) in a kernel whose daemon
    of ``IFACES_DAEMON`` runs, raise the session from host Python 1.5 s into
    it, and wait for the daemon to see only ``lo``: the cell's msg_id, when
    the rise was made, and how long after it the cut came (None: not in 60 s)."""
    user_id, session_id = _identity(k)
    ifaces = _wait_for_network(k)
    msg_id = k.kc.execute("open('/workspace/flooding', 'w').close()\n" + code, stop_on_error=False)
    deadline = time.monotonic() + 30
    while not (k.workspace / "flooding").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(1.5)  # what the cell sent is being read and cleaned: the host is busy
    assert ifaces.read_text() != "['lo']", "the sandbox lost its network before the rise"
    PrivateData(user_id, session_id, PrivacyStore(k.data_dir / "privacy")).add_private_dataset(
        "crm", "SECRET", source="connector"
    )
    raised = time.monotonic()
    while time.monotonic() - raised < 60:
        if ifaces.read_text() == "['lo']":
            return msg_id, raised, time.monotonic() - raised
        time.sleep(0.02)
    return msg_id, raised, None


#: a daemon (its own session: it outlives its cell) writing the sandbox's interfaces every 20 ms
IFACES_DAEMON = (
    "import subprocess, sys\n"
    "daemon = subprocess.Popen([sys.executable, '-c', '''\n"
    "import os, socket, time\n"
    "while True:\n"
    "    names = sorted(n for _, n in socket.if_nameindex())\n"
    "    open('/workspace/ifaces.tmp', 'w').write(repr(names)); os.replace('/workspace/ifaces.tmp', '/workspace/ifaces')\n"
    "    time.sleep(0.02)\n"
    "'''], start_new_session=True)\n"
)


def _wait_for_network(k: SandboxKernelHandle) -> Path:
    """The file the daemon of ``IFACES_DAEMON`` writes, once it saw the network."""
    ifaces = k.workspace / "ifaces"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        ifaces.exists() and "lo" in ifaces.read_text() and ifaces.read_text() != "['lo']"
    ):
        time.sleep(0.05)
    assert ifaces.read_text() != "['lo']", "the daemon never saw the network"
    return ifaces


def _identity(k: SandboxKernelHandle) -> tuple[str, str]:
    state = status_of(k)
    return state["user_id"], state["session_id"]


# ---- rule 1: the level belongs to the folder too -----------------------------------------


def _kernel_in(workspace: Path, tmp: Path) -> SandboxKernelHandle:
    return shared_data_kernel(workspace, tmp, tmp.parent / "shared-data")


def _wait_for_lo(k: SandboxKernelHandle, timeout: float = 15) -> str | None:
    """The stderr seen up to the cut (its notices), or None if it never came."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        run = k.run(IFACES)
        seen += run.stderr
        if run.stdout.strip() == "['lo']":
            return seen
        time.sleep(0.2)
    return None


def test_a_private_notebook_raises_every_notebook_sharing_its_folder(tmp_path: Path) -> None:
    """Notebook A (private) copies rows into its folder; notebook B in the same
    folder, public with network, must not read them with network; nor a
    notebook beside A's folder once a notebook in the folder holding both is
    private (its cells can copy the rows there)."""
    # (the kernels' temporary folders beside the parent's workspace: a workspace
    # holding a kernel's TMPDIR is refused, see tests/test_workspace_dos.py)
    root, tmps = tmp_path / "root", tmp_path / "tmps"
    folder = root / "project"
    a = _kernel_in(folder, tmps / "a-tmp")
    b = _kernel_in(folder, tmps / "b-tmp")
    parent = _kernel_in(root, tmps / "p-tmp")  # its workspace contains the folder
    sibling = _kernel_in(root / "other", tmps / "s-tmp")
    try:
        for k in (a, b, parent, sibling):
            assert len(eval(k.run(IFACES).stdout)) > 1
        a.run("%private patients CONFIDENTIAL")  # stops that cell; the next runs network-less
        run = a.run("open('/workspace/rows.csv', 'w').write('ada,42\\n')")
        assert (folder / "rows.csv").exists(), (run.stdout, run.stderr, run.errors)
        notices = _wait_for_lo(b)
        assert notices is not None, "B still has network while A's private rows sit in the shared folder"
        # B's user is told why: another session sharing the folder became private
        assert "[SYSTEM]" in notices and "with this folder" in notices and "project" in notices, notices
        assert _wait_for_lo(parent) is not None, "a notebook whose folder contains A's folder kept its network"
        # The parent's cells reach both folders: they copy A's rows beside the
        # sibling, so the sibling rises too (an attack review: it kept its
        # network and could send them). A sandbox worked in the folder holding
        # both (the parent's, since before the rise: what it left there, a
        # link, may already tie them), so the sibling rose with A
        # (tests/test_reached_folders.py). Without a sandbox ever in a folder
        # holding both, a sibling keeps its network:
        # test_a_private_folder_renamed_by_a_host_shell_stays_private.
        run = parent.run("import shutil\nshutil.copy('/workspace/project/rows.csv', '/workspace/other/rows.csv')")
        assert run.status == "ok", (run.stderr, run.errors)
        notices = _wait_for_lo(sibling)
        assert notices is not None, "a sibling with network beside the rows the parent's session copied there"
        assert "a sandbox worked in" in notices and "which holds that folder" in notices, notices
        # B's own cells say why, and the level never comes back down
        run = b.run("import sandbox_kernel.private as p\nprint(p.mark_private('INTERNAL'))")
        assert run.stdout.strip() == "CONFIDENTIAL", (run.stdout, run.stderr, run.errors)
        source, reason = _mark_of(b)
        assert source == "workspace" and "project" in reason, (source, reason)
        b.km.restart_kernel(now=True)
        b.kc.wait_for_ready(timeout=60)
        assert b.run(IFACES).stdout.strip() == "['lo']"
    finally:
        for k in (a, b, parent, sibling):
            k.shutdown()


def test_a_notebook_whose_folder_moves_into_a_private_one_follows_it(tmp_path: Path) -> None:
    """A host shell moves a live notebook's folder into a private folder. The
    sandbox's mount follows the folder, so its cells now work inside the
    private folder, beside the rows its private session writes: the session
    must read its level where the folder is now, not where it was."""
    secret, public = tmp_path / "secret", tmp_path / "public"
    private = _kernel_in(secret, tmp_path / "s-tmp")
    live = _kernel_in(public, tmp_path / "p-tmp")
    try:
        private.run("%private patients CONFIDENTIAL")
        assert private.run(IFACES).stdout.strip() == "['lo']"
        assert len(eval(live.run(IFACES).stdout)) > 1
        os.rename(public, secret / "public")  # as `mv public secret/` in a host shell
        private.run("open('/workspace/public/rows.csv', 'w').write('ada,42\\n')")
        notices = _wait_for_lo(live)
        assert notices is not None, "the moved notebook keeps its network inside the private folder"
        assert live.run("print(open('/workspace/rows.csv').read())").stdout.strip() == "ada,42"
        source, reason = _mark_of(live)
        assert source == "workspace" and "secret" in reason, (source, reason)
        # where other hosts' raisers and the Lab server look for it: its new place
        holders = [json.loads(p.read_text()) for p in (tmp_path / "shared-data" / "privacy-enforced").rglob("*.json")]
        assert {h["workspace"] for h in holders if h["pid"] == live.pid} == {str(secret / "public")}, holders
    finally:
        for k in (private, live):
            k.shutdown()


def test_a_private_folder_renamed_by_a_host_shell_stays_private(tmp_path: Path) -> None:
    """JupyterLab carries a folder's level when it renames it; a host shell's
    `mv` (a Lab terminal's too) does not ask the server. A private session
    works in "Untitled Folder" and is closed; the user renames the folder in
    a terminal and moves it into an archive. Notebooks opened in it, and in
    the archive that now holds it, must start without network."""
    home = tmp_path / "home"
    (home / "archive").mkdir(parents=True)
    untitled = home / "Untitled Folder"
    private = _kernel_in(untitled, tmp_path / "s-tmp")
    try:
        private.run("%private patients CONFIDENTIAL")
        private.run("open('/workspace/rows.csv', 'w').write('ada,42\\n')")
        assert (untitled / "rows.csv").exists()
    finally:
        private.shutdown()
    moved = home / "archive" / "analysis"
    subprocess.run(["mv", str(untitled), str(moved)], check=True)
    inside = _kernel_in(moved, tmp_path / "i-tmp")
    try:
        assert inside.run(IFACES).stdout.strip() == "['lo']", "a notebook in the renamed private folder has network"
        assert inside.run("print(open('/workspace/rows.csv').read())").stdout.strip() == "ada,42"
        source, reason = _mark_of(inside)
        assert source == "workspace" and "Untitled Folder" in reason, (source, reason)
    finally:
        inside.shutdown()
    around = _kernel_in(home / "archive", tmp_path / "a-tmp")  # it holds the private folder now
    sibling = _kernel_in(home / "other", tmp_path / "o-tmp")
    try:
        assert around.run(IFACES).stdout.strip() == "['lo']", "the folder now holding private rows has network"
        assert len(eval(sibling.run(IFACES).stdout)) > 1, "a folder beside it must keep its network"
    finally:
        for k in (around, sibling):
            k.shutdown()


def _mark_of(k: SandboxKernelHandle) -> tuple[str, str]:
    for entry in status_of(k).get("datasets", []):
        if entry.get("name", "").startswith("session marked private"):
            return entry["source"], entry["name"]
    return "", ""


# ---- rule 2: a host-side raiser can wait for the cut ---------------------------------------


def _sandbox_routes(k: SandboxKernelHandle) -> list[bool]:
    """Whether each process inside the kernel's sandboxes has a default route,
    read from the host (/proc/<pid>/net/route shows the process's namespace)."""
    found = []
    for bwrap in k.sandboxes():
        try:
            inside = bwrap.children(recursive=True)
        except psutil.NoSuchProcess:
            continue  # ended since it was listed (a rise replaces it): no route left in it
        for proc in inside:
            try:
                with open(f"/proc/{proc.pid}/net/route") as fh:
                    next(fh)
                    found.append(any(line.split()[1] == "00000000" for line in fh if line.strip()))
            except (OSError, StopIteration, IndexError):
                continue
    return found


def test_host_raiser_with_wait_returns_only_after_the_cut(tmp_path: Path) -> None:
    k = _kernel(tmp_path)
    try:
        user_id, session_id = _identity(k)
        assert any(_sandbox_routes(k)), "the public sandbox should have a default route"
        msg_id = k.kc.execute("import time\ntime.sleep(20)", stop_on_error=False)  # busy while the connector raises
        time.sleep(0.5)
        store = PrivacyStore(k.data_dir / "privacy")
        started = time.monotonic()
        PrivateData(user_id, session_id, store).add_private_dataset("crm", "SECRET", source="connector", wait=True)
        took = time.monotonic() - started
        routes = _sandbox_routes(k)
        assert not any(routes), f"add_private_dataset(wait=True) returned while a sandbox still had a route: {routes}"
        print(f"wait=True returned {took * 1000:.0f} ms after the call, no route left")
        reply_to(k, msg_id)
        assert k.run(IFACES).stdout.strip() == "['lo']"
    finally:
        k.shutdown()


def test_wait_times_out_naming_a_holder_that_keeps_its_network(tmp_path: Path) -> None:
    """A holder that does not confirm (here: a record claiming network, as a
    hung kernel would leave it) makes ``wait`` fail loudly instead of returning."""
    from sandbox_kernel.privacy import Sensitivity
    from sandbox_kernel.privacy.enforcement import EnforcementRecord

    store = PrivacyStore(tmp_path / "privacy")
    record = EnforcementRecord(store.root, "alice", "s1", workspace=tmp_path)
    record.report(Sensitivity.PUBLIC, True)
    try:
        started = time.monotonic()
        try:
            PrivateData("alice", "s1", store).add_private_dataset("crm", "SECRET", wait=0.5)
        except TimeoutError as exc:
            assert "did not confirm" in str(exc) and str(os.getpid()) in str(exc)
        else:
            raise AssertionError("wait returned although a holder still had network")
        assert time.monotonic() - started >= 0.5
        record.report(Sensitivity.SECRET, False)
        PrivateData("alice", "s1", store).add_private_dataset("crm2", "SECRET", wait=2)  # confirmed: returns
    finally:
        record.close()


# ---- rule 3: a lost or lowered record fails closed -----------------------------------------


def test_a_deleted_store_record_fails_closed_after_restart(tmp_path: Path) -> None:
    k = _kernel(tmp_path)
    try:
        k.run("%private payroll CONFIDENTIAL")
        assert k.run(IFACES).stdout.strip() == "['lo']"
        user_id, session_id = _identity(k)
        record = PrivacyStore(k.data_dir / "privacy").path_for(user_id, session_id)
        assert record.exists()
        shutil.rmtree(record.parent)  # the attack: the session's record (and its folder) vanish
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=60)
        assert k.run(IFACES).stdout.strip() == "['lo']", "a lost record made the session public again"
    finally:
        k.shutdown()


def test_store_read_in_a_fresh_process_fails_closed_when_the_record_vanished(tmp_path: Path) -> None:
    store = PrivacyStore(tmp_path / "privacy")
    PrivateData("alice", "s1", store).add_private_dataset("crm", "CONFIDENTIAL")
    store.path_for("alice", "s1").unlink()
    code = (
        "import sys; from sandbox_kernel.privacy import PrivacyStore\n"
        "s = PrivacyStore(sys.argv[1]).read('alice', 's1')\n"
        "print(s.sensitivity.name, bool(s.error))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store.root)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["SECRET", "True"], (out.stdout, out.stderr)
    # an untouched session is not affected
    out = subprocess.run(
        [sys.executable, "-c", code.replace("'s1'", "'s2'"), str(store.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["PUBLIC", "False"], (out.stdout, out.stderr)


def test_a_session_without_network_gets_private_datasets_only_once_private(tmp_path: Path) -> None:
    """``network="none"``: a public sandbox has no interface either, and used
    to get the private datasets mounted from its first cell. A plain ``open``
    then read them in a PUBLIC session: the ratchet never rose, so outputs
    kept live links, the folder's level stayed public (a networked notebook in
    it could read what the cell copied there) and the agent tools kept routing
    to networked tools. The datasets now come only once private: asking for
    one raises the ratchet, and a new sandbox mounts them."""
    data = tmp_path / "hr.csv"
    data.write_text("name,salary\nada,100\n")
    k = configured_kernel(
        tmp_path,
        f"c.SandboxKernel.private_datasets = {{'hr': {{'source': {str(data)!r}, 'sensitivity': 'SECRET'}}}}\n",
        "--SandboxKernel.network=none",
    )
    try:
        assert k.run(IFACES).stdout.strip() == "['lo']"
        k.run("kept = [1, 2, 3]")
        run = k.run("import os\nprint(os.path.exists('/private/hr'), os.listdir('/'))")
        assert run.stdout.startswith("False"), run.stdout  # nothing private in a public sandbox
        assert status_of(k)["private"] is False
        run = k.run("import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read())", stop_on_error=False)
        assert run.status == "error" and "never had network" in run.reply["evalue"]
        assert status_of(k)["private"] is True  # asking raised the ratchet first
        run = k.run("import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read(), kept)")
        assert run.status == "ok" and "ada,100" in run.stdout and "[1, 2, 3]" in run.stdout
        run = k.run("print('https:' + '//exfil.example/?d=ada')")
        assert "https://exfil.example" not in run.stdout  # outputs are those of a private session
    finally:
        k.shutdown()


def test_a_rise_while_a_sandbox_starts_is_not_reported_cut_before_it_is(tmp_path: Path) -> None:
    """While a new sandbox started (after a crash, a restart), the session had
    no live sandbox to cut: a host-side rise then found nothing to do, wrote
    "no network" into the enforcement record and ``wait=True`` returned, and
    the sandbox came up with its proxy uncut. The data the connector handed
    over then went out (found by an attack review). Now a starting sandbox
    counts as holding network, its proxy is cut at the rise, and it is
    replaced by one without network before it runs anything."""
    origin = RecordingHTTPServer()
    k = configured_kernel(
        tmp_path,
        "c.SandboxKernel.egress_allow = ['leak.test']\n"
        "c.SandboxKernel.egress_allow_addresses = ['127.0.0.1']\n"
        "c.SandboxKernel.egress_name_overrides = {'leak.test': ['127.0.0.1']}\n",
    )
    try:
        plant = leaking_module(origin.port)
        assert k.run(f"open('/workspace/sqlite3.py', 'w').write({plant!r})\nx = 41").status == "ok"
        state = status_of(k)
        assert state["network"] == "proxied"
        time.sleep(1.5)  # the idle checkpoint holds x
        k.kill_sandboxes()
        msg_id = k.kc.execute("print(x + 1)")
        time.sleep(0.3)  # the new sandbox is starting, held by the planted module
        PrivateData(state["user_id"], state["session_id"], PrivacyStore(k.data_dir / "privacy")).add_private_dataset(
            "crm", "SECRET", source="connector", wait=True
        )
        (k.workspace / "secret.txt").write_text("SSN 123-45-6789")  # handed over once wait=True returned
        reply_to(k, msg_id, timeout=90)
        time.sleep(0.5)
        assert not [path for path in origin.heard if "exfil" in path], origin.heard
        leak = k.workspace / "leak.txt"
        assert leak.exists(), "the planted module never saw the data: the test proves nothing"
        assert leak.read_text().splitlines()[0].endswith("403 Forbidden"), leak.read_text()  # the cut proxy's answer
        assert k.run(IFACES).stdout.strip() == "['lo']"
        last = k.run("print(x + 1)", stop_on_error=False)
        assert last.stdout.strip() == "42", (last.stdout, last.stderr, last.errors)  # the state carried over
    finally:
        k.shutdown()
        origin.close()
