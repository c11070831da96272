"""The kernel on the docker backend (``--SandboxKernel.backend=docker``), real daemon.

Every cell runs in a hardened container made from the offline test image, which
borrows the host's /usr read-only; the kernel's own interpreter (venv and base
prefix) is mounted read-only at the same paths. Network checks only list
interfaces: no test sends traffic anywhere.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kernel_helpers import SandboxKernelHandle, reply_to, status_of
from test_ratchet_side_doors import BUSY_BUDGET, BUSY_CELL

from sandbox_kernel.docker.hardening import ICC_OPTION, SANDBOX_NETWORK
from sandbox_kernel.docker.names import LABEL_KIND, LABEL_MANAGED, LABEL_OWNER_PID
from sandbox_kernel.privacy import PrivacyStore, PrivateData

MEMORY = "256m"
PIDS = 64
IFACES = "import os\nprint(sorted(os.listdir('/sys/class/net')))"


def docker_args(image: str, *extra: str) -> list[str]:
    # FULL mode (a bridge network, disconnected by the ratchet) unless a test says
    # otherwise: PROXIED containers are tested in test_docker_proxied.py
    network = [] if any(a.startswith("--SandboxKernel.network=") for a in extra) else ["--SandboxKernel.network=full"]
    defaults = [
        "--SandboxKernel.backend=docker",
        *network,
        f"--DockerSandbox.image={image}",
        '--DockerSandbox.read_only_mounts={"/usr": "/usr"}',
        f"--DockerSandbox.memory_limit={MEMORY}",
        f"--DockerSandbox.pids_limit={PIDS}",
        "--DockerSandbox.cpu_limit=1.0",
        "--DockerSandbox.tmpfs_size=16m",
    ]
    # a setting the test gives replaces the default (traitlets refuses one given twice)
    given = {a.split("=", 1)[0] for a in extra}
    return [a for a in defaults if a.split("=", 1)[0] not in given] + list(extra)


def containers_of(client: Any, kernel_pid: int) -> list[dict[str, Any]]:
    """The sandbox containers (running or not) a kernel process owns."""
    return client.api.containers(
        all=True,
        filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}=kernel", f"{LABEL_OWNER_PID}={kernel_pid}"]},
    )


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def remove_all(client: Any, kernel_pid: int) -> None:
    for info in containers_of(client, kernel_pid):
        try:
            client.api.remove_container(info["Id"], force=True, v=True)
        except Exception:
            pass


class DockerKernel:
    """A kernel handle plus the Docker client, with container look-ups."""

    def __init__(self, root: Path, client: Any, image: str, *extra: str) -> None:
        (root / "ws").mkdir(exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        if os.geteuid() == 0:
            # the kernel never chowns a workspace: like a user would, give it to the container user
            os.chown(root / "ws", 65534, 65534)
        self.client = client
        self.handle = SandboxKernelHandle(root / "ws", root / "tmp", extra_args=docker_args(image, *extra))
        self.pid = self.handle.pid

    def run(self, code: str, **kwargs: Any) -> Any:
        return self.handle.run(code, **kwargs)

    def containers(self) -> list[dict[str, Any]]:
        return containers_of(self.client, self.pid)

    def container(self) -> dict[str, Any]:
        """docker inspect of the one running container (after a cell ran)."""
        running = [c for c in self.containers() if c["State"] == "running"]
        assert len(running) == 1, running
        return self.client.api.inspect_container(running[0]["Id"])

    def shutdown(self) -> None:
        try:
            self.handle.shutdown()
        finally:
            remove_all(self.client, self.pid)


@pytest.fixture(scope="module")
def dk(docker_client: Any, test_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerKernel]:
    kernel = DockerKernel(tmp_path_factory.mktemp("docker-kernel"), docker_client, test_image)
    yield kernel
    kernel.shutdown()


@pytest.fixture
def fresh_dk(docker_client: Any, test_image: str, tmp_path: Path) -> Iterator[DockerKernel]:
    kernel = DockerKernel(tmp_path, docker_client, test_image)
    yield kernel
    kernel.shutdown()


# ---- the core behaviours, on containers ------------------------------------------------


def test_state_persists_across_cells(dk: DockerKernel) -> None:
    assert dk.run("import math\nx = 20\ndef double(v):\n    return 2 * v\nclass Box:\n    size = 3").status == "ok"
    run = dk.run("double(x) + Box.size + math.floor(1.5)")
    assert run.status == "ok", run.reply
    assert run.result["text/plain"] == "44"
    assert dk.run("import os\nprint(os.environ['SANDBOX_KERNEL_BACKEND'])").stdout.strip() == "docker"


def test_print_streams_while_the_cell_runs(dk: DockerKernel) -> None:
    arrivals, _ = dk.handle.stream_arrivals(
        "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.5)"
    )
    assert "".join(t for _, t in arrivals) == "tick 0\ntick 1\ntick 2\n"
    assert len(arrivals) >= 2 and arrivals[-1][0] - arrivals[0][0] > 0.7


def test_exception_keeps_side_effects(dk: DockerKernel) -> None:
    run = dk.run("partial = 'kept'\nraise ValueError('boom')")
    assert run.status == "error" and run.reply["ename"] == "ValueError"
    assert dk.run("partial").result["text/plain"] == "'kept'"


def test_os_exit_discards_only_that_cell(dk: DockerKernel) -> None:
    dk.run("survivor = [1, 2, 3]")
    run = dk.run("survivor.append(4)\nimport os\nos._exit(7)")
    assert run.status == "error" and run.reply["ename"] == "CellDied"
    assert "exited with code 7" in run.reply["evalue"]
    assert dk.run("survivor").result["text/plain"] == "[1, 2, 3]"


def test_interrupt_raises_keyboardinterrupt_and_keeps_state(dk: DockerKernel) -> None:
    dk.run("counter = 0")
    msg_id = dk.handle.kc.execute("import time\ncounter = 1\nwhile True:\n    time.sleep(0.05)")
    time.sleep(1.0)
    dk.handle.km.interrupt_kernel()
    reply = dk.handle.kc.get_shell_msg(timeout=20)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert dk.run("counter").result["text/plain"] == "1"


def test_threads_of_a_cell_work_in_later_cells_and_a_death_beside_them_keeps_the_state(
    fresh_dk: DockerKernel,
) -> None:
    """In a container too (its seccomp profiles, docker-init as the namespace's
    init): an executor made in one cell works in the next, the cell beside its
    thread runs in the holder, and the holder's death leaves the backup
    serving with the state, the cause and the lost thread named."""
    dk = fresh_dk
    start = dk.run(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import os, signal, time\n"
        "executor = ThreadPoolExecutor(1, thread_name_prefix='in-container')\n"
        "kept = executor.submit(abs, -3).result()"
    )
    assert start.status == "ok", start.reply
    for i in range(5):
        assert dk.run(f"print(executor.submit(abs, -{i}).result())", timeout=30).stdout.strip() == str(i)
    msg_id = dk.handle.kc.execute("kept = 4\ntime.sleep(60)")
    time.sleep(1.0)
    dk.handle.km.interrupt_kernel()
    reply = dk.handle.kc.get_shell_msg(timeout=20)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    assert dk.run("print(kept, executor.submit(abs, -5).result())").stdout.strip() == "4 5"
    died = dk.run("kept = 6\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert died.reply["ename"] == "CellDied", died.reply
    assert "SIGSEGV" in died.reply["evalue"] and "in-container_0" in died.reply["evalue"], died.reply
    assert dk.run("print(kept)").stdout.strip() == "4"


def test_input_without_stdin_is_refused(dk: DockerKernel) -> None:
    run = dk.run("input('x')", allow_stdin=False)
    assert run.status == "error" and run.reply["ename"] == "StdinNotImplementedError"
    run = dk.run("name = input('who? ')\nprint('hi', name)", allow_stdin=True, stdin_answers=["ada"])
    assert run.status == "ok" and "hi ada" in run.stdout


# ---- hardening ---------------------------------------------------------------------


def test_docker_inspect_shows_the_hardening(dk: DockerKernel) -> None:
    assert dk.run("1").status == "ok"
    info = dk.container()
    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges" in (host["SecurityOpt"] or [])
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    assert host["Init"] is False  # the worker's anchor is PID 1 and reaps (SandboxSpec.own_init)
    assert host["IpcMode"] == "private"
    assert host["AutoRemove"] is True
    assert host["PidsLimit"] == PIDS
    assert host["Memory"] == 256 * 1024 * 1024 and host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 1_000_000_000
    assert "size=16777216" in host["Tmpfs"]["/tmp"] and "nosuid" in host["Tmpfs"]["/tmp"]
    # a public session: full network on the sandboxes' own bridge, never "host" nor Docker's default
    assert host["NetworkMode"] == SANDBOX_NETWORK
    assert dk.client.networks.get(SANDBOX_NETWORK).attrs["Options"][ICC_OPTION] == "false"
    uid, _, gid = info["Config"]["User"].partition(":")
    assert int(uid) != 0 and int(gid) != 0
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/workspace"]["RW"] is True
    assert mounts["/.sandbox_kernel/state"]["RW"] is True
    assert mounts["/.sandbox_kernel/packages"]["RW"] is True  # %pip's layer
    assert mounts["/.sandbox_kernel/lib/sandbox_kernel_worker"]["RW"] is False
    assert mounts["/usr"]["RW"] is False
    writable = ("/workspace", "/.sandbox_kernel/state", "/.sandbox_kernel/packages")
    assert all(not m["RW"] for dest, m in mounts.items() if dest not in writable)
    assert not any(
        "docker.sock" in m["Source"] or m["Source"].startswith(("/run", "/var/run")) for m in mounts.values()
    )
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["SANDBOX_KERNEL_BACKEND"] == "docker"
    assert not {k for k in env if k.startswith(("DOCKER_", "JPY_", "SANDBOX_KERNEL_DATA"))}


def test_nothing_a_cell_sends_is_logged_by_the_daemon(dk: DockerKernel) -> None:
    """The worker's stdout is the channel to the host: every cell's source,
    output and state went through the daemon's log driver too, a private
    session's rows written under /var/lib/docker (readable with ``docker
    logs``), and every byte a cell printed cost the daemon a JSON encoding
    and a write. The channel is attached, not logged."""
    secret = "PAYROLL-" + os.urandom(8).hex()
    run = dk.run(f"import sys\nprint({secret!r})\nsys.stderr.write({secret!r})\nprint('x' * 200_000)")
    assert run.status == "ok" and secret in run.stdout, run.reply
    info = dk.container()
    log_path = info.get("LogPath") or ""
    if log_path and os.path.exists(log_path):
        assert secret not in Path(log_path).read_text(errors="replace"), f"the daemon logged the channel in {log_path}"
    assert info["HostConfig"]["LogConfig"]["Type"] == "none", info["HostConfig"]["LogConfig"]


def test_inside_no_capabilities_no_new_privileges_non_root(dk: DockerKernel) -> None:
    run = dk.run(
        "import os\n"
        "status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)\n"
        "print(status['CapEff'].strip(), status['CapBnd'].strip(), status['NoNewPrivs'].strip(), os.getuid(), os.getgid())"
    )
    cap_eff, cap_bnd, nnp, uid, gid = run.stdout.split()
    assert int(cap_eff, 16) == 0 and int(cap_bnd, 16) == 0
    assert nnp == "1"
    assert uid != "0" and gid != "0"
    # the root filesystem is read-only; the workspace and /tmp are writable
    run = dk.run(
        "import os\n"
        "for path in ('/etc/planted', '/usr/planted', '/.sandbox_kernel/lib/sandbox_kernel_worker/x'):\n"
        "    try:\n        open(path, 'w')\n        print('WROTE', path)\n"
        "    except OSError as e:\n        print('refused', e.errno)\n"
        "open('/workspace/ok.txt', 'w').write('ok'); open('/tmp/ok.txt', 'w').write('ok')\n"
        "print(sorted(os.listdir('/')))"
    )
    assert run.status == "ok", run.reply
    assert "WROTE" not in run.stdout
    assert (dk.handle.workspace / "ok.txt").read_text() == "ok"
    # the kernel's data dir and the host's /root are not there
    visible = dk.run(
        f"import os\nprint(os.path.exists({str(dk.handle.data_dir)!r}), os.path.exists('/root/.bash_history'))"
    )
    assert visible.stdout.split() == ["False", "False"]


# ---- limits and failures -----------------------------------------------------------


def test_memory_hog_dies_alone(dk: DockerKernel) -> None:
    dk.run("small = list(range(10))")
    run = dk.run("big = b'x' * (400 << 20)", timeout=60)
    assert run.status == "error" and run.reply["ename"] == "CellDied", run.reply
    # the same words as the bwrap backend: which cap was reached
    assert "memory cap" in run.reply["evalue"] or "memory cap" in run.stderr, (run.reply, run.stderr)
    assert dk.run("len(small)").result["text/plain"] == "10"
    assert len([c for c in dk.containers() if c["State"] == "running"]) == 1


def test_long_lines_a_cell_writes_to_the_containers_stderr_do_not_grow_the_host_kernel(dk: DockerKernel) -> None:
    """docker-init runs as the container's user, so a cell can open its
    stderr, which the host reads (the last lines say why a start failed). An
    attack review wrote 40 lines of 15 MiB there: the host kernel kept them
    all, 1.2 GiB for the sandbox's life, with the container capped at 256 MiB.
    The host keeps only the start of each line."""
    kernel = psutil.Process(dk.pid)
    assert dk.run("print('warm')").stdout == "warm\n"
    before = kernel.memory_info().rss
    run = dk.run(
        "import os\n"
        "fd = os.open('/proc/1/fd/2', os.O_WRONLY)\n"
        "line = memoryview(b'\\xff' * (4 << 20) + b'\\n')\n"
        "for _ in range(40):\n"
        "    view = line\n"
        "    while view:\n"
        "        view = view[os.write(fd, view):]\n"
        "print('written')",
        timeout=120,
    )
    assert run.status == "ok" and run.stdout == "written\n", (run.reply, run.stderr)
    assert dk.run("print('still here')").stdout == "still here\n"  # all of it was read by now
    grown = (kernel.memory_info().rss - before) >> 20
    # 40 lines of 4 MiB of U+FFFD kept whole would be 320 MiB of text
    assert grown < 64, f"the host kernel grew by {grown} MiB"


def test_pids_limit_holds(fresh_dk: DockerKernel) -> None:
    k = fresh_dk
    assert k.run("kept = 'state'").status == "ok"
    time.sleep(1.5)  # the background checkpoint lands
    run = k.run(
        "import subprocess\nprocs = []\nwhile len(procs) < 1000:\n    procs.append(subprocess.Popen(['sleep', '3']))",
        timeout=60,
    )
    assert run.status == "error" and run.reply["ename"] == "BlockingIOError", run.reply
    assert "process cap" in run.stderr, run.stderr  # named, as on bwrap
    # The limit held (the cell could not start 1000); earlier state survives
    # and the kernel keeps serving, possibly in a replaced sandbox.
    time.sleep(4)
    run = k.run("kept")
    if run.status != "ok":  # the sandbox died of the exhausted limit: reported once
        assert run.reply["ename"] == "CellDied", run.reply
        run = k.run("kept")
    assert run.status == "ok" and run.result["text/plain"] == "'state'", run.reply


def test_container_killed_from_outside_resumes_from_checkpoint(fresh_dk: DockerKernel) -> None:
    k = fresh_dk
    setup = (
        "data = {'rows': [1, 2, 3]}\n"
        "def total(d):\n    return sum(d['rows'])\n"
        "open('/workspace/notes.txt', 'w').write('written')\n"
    )
    assert k.run(setup).status == "ok"
    time.sleep(1.5)  # the background checkpoint lands
    first = k.container()["Id"]
    k.client.api.kill(first)
    assert wait_for(lambda: all(c["Id"] != first for c in k.containers()), 15), "killed container not removed"
    time.sleep(0.5)
    run = k.run("print(total(data), open('/workspace/notes.txt').read())")
    assert run.status == "ok", run.reply
    assert "6 written" in run.stdout
    assert "sandbox was replaced" in run.stderr
    assert k.container()["Id"] != first


def test_ratchet_replaces_the_container_by_one_without_network(fresh_dk: DockerKernel) -> None:
    k = fresh_dk
    assert k.run("kept = 'earlier'\nopen('/workspace/before.txt', 'w').write('public')").status == "ok"
    online = k.container()
    assert online["HostConfig"]["NetworkMode"] == SANDBOX_NETWORK
    assert eval(k.run(IFACES).stdout) != ["lo"]  # interfaces only: no traffic is sent
    run = k.run("%private ledger INTERNAL")  # the cell raising the ratchet is stopped there
    assert run.status == "error" and "stopped at that point" in run.reply["evalue"], run.reply
    run = k.run(IFACES)
    assert run.status == "ok" and run.stdout.strip() == "['lo']"
    offline = k.container()
    assert offline["Id"] != online["Id"]
    assert offline["HostConfig"]["NetworkMode"] == "none"
    assert offline["Config"]["Labels"]["sandbox_kernel.network"] == "none"
    assert wait_for(lambda: all(c["Id"] != online["Id"] for c in k.containers()), 15), "networked container left"
    run = k.run("print(kept, open('/workspace/before.txt').read())")
    assert run.stdout.split() == ["earlier", "public"]
    assert (k.handle.workspace / "before.txt").read_text() == "public"


def test_shutdown_leaves_no_container(docker_client: Any, test_image: str, tmp_path: Path) -> None:
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        k.run("import subprocess\nbg = subprocess.Popen(['sleep', '300'])")
        assert len(k.containers()) == 1
    finally:
        k.handle.shutdown()
    assert wait_for(lambda: not containers_of(docker_client, k.pid), 15), containers_of(docker_client, k.pid)
    remove_all(docker_client, k.pid)


def test_exit_in_a_cell_leaves_no_container(docker_client: Any, test_image: str, tmp_path: Path) -> None:
    """``exit`` ends the kernel as ipykernel's does (tests/test_exit_idioms.py):
    a clean stop, so its container goes with it (guarantee 6)."""
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        k.run("import subprocess\nbg = subprocess.Popen(['sleep', '300'])")
        assert len(k.containers()) == 1
        assert k.run("exit").status == "ok"
        process = k.handle.km.provisioner.process  # type: ignore[union-attr]
        assert wait_for(lambda: process.poll() is not None, 30), "the kernel did not end"
        assert process.returncode == 0
        assert wait_for(lambda: not containers_of(docker_client, k.pid), 15), containers_of(docker_client, k.pid)
    finally:
        k.handle.shutdown()
        remove_all(docker_client, k.pid)


@pytest.mark.parametrize("cli_too", [False, True], ids=["kernel", "kernel-and-cli"])
def test_kernel_killed_takes_its_container_with_it(
    docker_client: Any, test_image: str, tmp_path: Path, cli_too: bool
) -> None:
    """SIGKILL of the kernel ends its container although a cell left a process
    running in it. With ``cli_too`` the docker CLI dies with the kernel (an OOM
    kill of the group, say), so no signal is forwarded: the attach ends, the
    daemon closes the worker's channel (StdinOnce), and the worker ends the
    container."""
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        k.run("import subprocess\nbg = subprocess.Popen(['sleep', '300'])")
        (container,) = k.containers()
        if cli_too:
            assert docker_client.api.inspect_container(container["Id"])["Config"]["StdinOnce"] is True
        _kill_the_kernel_and_see_its_container_gone(k, docker_client, cli_too)
    finally:
        k.handle.kc.stop_channels()
        k.handle.km.cleanup_resources()
        remove_all(docker_client, k.pid)


def _kill_the_kernel_and_see_its_container_gone(
    k: DockerKernel, docker_client: Any, cli_too: bool, expect_gone: bool = True
) -> None:
    """SIGKILL the kernel (and first its attached Docker CLI when ``cli_too``):
    its container must be gone within 20 s (``expect_gone``; else 5 s are
    given for it to go)."""
    if cli_too:
        clis = [p for p in psutil.Process(k.pid).children(recursive=True) if p.name() == "docker"]
        assert len(clis) == 1, clis
        clis[0].kill()
    os.kill(k.pid, signal.SIGKILL)
    gone = wait_for(lambda: not containers_of(docker_client, k.pid), 20 if expect_gone else 5)
    if expect_gone:
        assert gone, [(c["State"], c["Status"]) for c in containers_of(docker_client, k.pid)]


#: a cell that keeps a write end of the worker's channel (reopened through
#: /proc/1/fd: the anchor's, PID 1) in a detached process, which writes the
#: interfaces it sees and the private rows, once they exist, into leak.txt
HOLD_THE_CHANNEL = (
    "import os, socket, time\n"
    "fd = next(int(n) for n in os.listdir('/proc/1/fd') if os.readlink(f'/proc/1/fd/{n}').startswith('pipe:')\n"
    "          and n != '0' and n != '1' and n != '2')\n"
    "held = os.open(f'/proc/1/fd/{fd}', os.O_WRONLY | os.O_NONBLOCK)\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        while not os.path.exists('/workspace/secret.csv'):\n"
    "            time.sleep(0.2)\n"
    "        names = sorted(n for _, n in socket.if_nameindex())\n"
    "        open('/workspace/leak.txt', 'w').write(repr((names, open('/workspace/secret.csv').read())))\n"
    "        while True:\n"
    "            time.sleep(1)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "print('held', fd)\n"
)


def test_a_rise_after_the_kernels_death_removes_the_container_a_cell_kept_alive(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """Review r66 (of the anchor's fix): a cell reopened a write end of the
    worker's channel through /proc/1/fd, so no hang-up came when the kernel
    and its CLI were killed; the container ran on, on its network, the dead
    kernel's holder record was dropped, a rise's wait=True returned at once
    and the container read the rows written after it. The kernel's holder
    record now names its containers: the rise has the daemon remove them."""
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        state = status_of(k.handle)
        held = k.run(HOLD_THE_CHANNEL)
        assert held.status == "ok" and held.stdout.startswith("held"), (held.stdout, held.stderr)
        _kill_the_kernel_and_see_its_container_gone(k, docker_client, cli_too=True, expect_gone=False)
        assert containers_of(docker_client, k.pid), "the container ended by itself: the attack did not hold"
        PrivateData(
            state["user_id"], state["session_id"], PrivacyStore(k.handle.data_dir / "privacy")
        ).add_private_dataset("crm", "SECRET", source="connector", wait=True)
        assert not containers_of(docker_client, k.pid), "the rise returned with the dead kernel's container running"
        (k.handle.workspace / "secret.csv").write_text("name,ssn\nalice,123-45-6789\n")
        time.sleep(2)
        assert not (k.handle.workspace / "leak.txt").exists(), (k.handle.workspace / "leak.txt").read_text()
    finally:
        k.handle.kc.stop_channels()
        k.handle.km.cleanup_resources()
        remove_all(docker_client, k.pid)


#: a cell that stops its holder (its parent: nobody reads the closed channel
#: then) and tries to stop and kill the container's PID 1, then stays
STOP_THE_READERS = (
    "import os, signal, time\n"
    "for sig in (signal.SIGSTOP, signal.SIGKILL):\n"
    "    os.kill(1, sig)  # the anchor, PID 1: dropped by the kernel (no handler)\n"
    "os.kill(os.getppid(), signal.SIGSTOP)\n"
    "while True:\n"
    "    time.sleep(1)"
)


@pytest.mark.parametrize("cli_too", [False, True], ids=["kernel", "kernel-and-cli"])
def test_kernel_killed_takes_its_container_with_it_though_a_cell_stopped_its_holder(
    docker_client: Any, test_image: str, tmp_path: Path, cli_too: bool
) -> None:
    """Review r66 (finding B, the kernel's death): the holder, which reads the
    closed channel, was SIGSTOPped by its cell, and with the CLI dead too no
    signal came: the container ran on, on its bridge network, after its
    kernel (2 of 2 runs of the review, and here, on old code). The worker's
    anchor is now the container's PID 1 (no docker-init), which no process
    inside can stop or kill, and it leaves when the channel hangs up."""
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        assert k.run("1").status == "ok"
        info = k.container()
        assert info["HostConfig"]["Init"] is False and info["Config"]["StdinOnce"] is True
        k.handle.kc.execute(STOP_THE_READERS, stop_on_error=False)
        time.sleep(2)
        (container,) = k.containers()
        assert container["State"] == "running"
        _kill_the_kernel_and_see_its_container_gone(k, docker_client, cli_too)
    finally:
        k.handle.kc.stop_channels()
        k.handle.km.cleanup_resources()
        remove_all(docker_client, k.pid)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        # old code: NanoCpus=0, a container with no CPU limit at all
        ("--DockerSandbox.cpu_limit=1e-12", "DockerSandbox.cpu_limit=1e-12 is too small (at least 0.01)"),
        # old code: an OCI runtime error at the start
        ("--DockerSandbox.cpu_limit=0.004", "DockerSandbox.cpu_limit=0.004 is too small (at least 0.01)"),
        # old code: an anonymous HTTP 500 from the daemon
        ("--DockerSandbox.pids_limit=9223372036854775808", "DockerSandbox.pids_limit=9223372036854775808 is too large"),
        # old code: "no Docker daemon answers"
        (
            "--DockerSandbox.start_timeout=nan",
            "DockerSandbox.start_timeout=nan must be a finite number greater than zero",
        ),
    ],
)
def test_a_bad_setting_is_named_in_the_cell_and_starts_nothing(
    docker_client: Any, test_image: str, tmp_path: Path, setting: str, named: str
) -> None:
    """Review r66 (low): values the daemon takes for something else, or
    refuses without saying which, are refused by the kernel, naming the
    setting as the user wrote it (guarantee 7)."""
    k = DockerKernel(tmp_path, docker_client, test_image, setting)
    try:
        run = k.run("1")
        assert run.status == "error" and run.reply["ename"] == "SandboxUnavailable", run.reply
        assert named in run.reply["evalue"], run.reply["evalue"]
        assert k.containers() == []
    finally:
        k.shutdown()


def test_missing_image_is_a_clear_error(docker_client: Any, tmp_path: Path) -> None:
    k = DockerKernel(tmp_path, docker_client, "sandbox-kernel-test:missing")
    try:
        run = k.run("1")
        assert run.status == "error" and run.reply["ename"] == "SandboxUnavailable", run.reply
        assert "sandbox-kernel-test:missing" in run.reply["evalue"] and "does not exist" in run.reply["evalue"]
        assert k.containers() == []
    finally:
        k.shutdown()


# ---- the ratchet's side doors (private data never reaches a container with network) ------
# A host-side rise cuts a busy container's network at once (the daemon
# disconnects it; the container is not asked), ``wait=True`` returns only after
# that, a notebook sharing a private notebook's folder rises with it, and a
# restart keeps the session. Checked through ``docker inspect`` and the
# interfaces a cell lists: no traffic is sent.


def _networked(k: DockerKernel) -> list[str]:
    """Running containers of the kernel still attached to a network."""
    attached = []
    for info in k.containers():
        if info["State"] != "running":
            continue
        nets = (k.client.api.inspect_container(info["Id"]).get("NetworkSettings") or {}).get("Networks") or {}
        if any(name != "none" for name in nets):
            attached.append(info["Id"][:12])
    return attached


def test_host_rise_with_wait_disconnects_a_busy_container(docker_client: Any, test_image: str, tmp_path: Path) -> None:
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        assert k.run("kept = 1").status == "ok"
        assert _networked(k), "a public docker sandbox has a network"
        state = status_of(k.handle)
        msg_id = k.handle.kc.execute(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(20)", stop_on_error=False
        )
        time.sleep(1.0)
        store = PrivacyStore(k.handle.data_dir / "privacy")
        started = time.monotonic()
        PrivateData(state["user_id"], state["session_id"], store).add_private_dataset(
            "crm", "SECRET", source="connector", wait=True
        )
        took = time.monotonic() - started
        assert not _networked(k), "wait=True returned while a container was still attached to a network"
        print(f"docker: wait=True returned {took * 1000:.0f} ms after the call")
        while True:
            reply = k.handle.kc.get_shell_msg(timeout=180)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        run = k.run(IFACES)
        assert run.stdout.strip() == "['lo']", (run.reply, run.stderr, run.errors)
        assert k.run("print(kept)").stdout.strip() == "1"
    finally:
        k.shutdown()


def test_a_container_keeping_the_host_busy_is_disconnected_on_time(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    """Outputs built to be slow to clean keep the kernel's loop busy for
    seconds; a host-side rise meanwhile must still disconnect the container
    within about the poll interval (the cut watchdog's thread disconnects it),
    not once the cleaning ends."""
    k = DockerKernel(tmp_path, docker_client, test_image, BUSY_BUDGET)
    try:
        assert k.run("kept = 1").status == "ok"
        assert _networked(k), "a public docker sandbox has a network"
        state = status_of(k.handle)
        time.sleep(1.0)  # the checkpoint at idle: the cell may be killed in the middle of an output
        msg_id = k.handle.kc.execute("open('/workspace/flooding', 'w').close()\n" + BUSY_CELL, stop_on_error=False)
        assert wait_for(lambda: (k.handle.workspace / "flooding").exists(), 30)
        time.sleep(1.5)  # the reply is being cleaned
        store = PrivacyStore(k.handle.data_dir / "privacy")
        PrivateData(state["user_id"], state["session_id"], store).add_private_dataset(
            "crm", "SECRET", source="connector"
        )
        raised = time.monotonic()
        assert wait_for(lambda: not _networked(k), 60, 0.05), "the container kept its network 60 s after the rise"
        cut_after = time.monotonic() - raised
        reply_to(k.handle, msg_id)
        replied_after = time.monotonic() - raised
        print(
            f"docker: disconnected {cut_after * 1000:.0f} ms after the rise, the reply {replied_after:.1f} s after it"
        )
        assert cut_after < 2.0, f"the container was disconnected {cut_after:.1f} s after the rise"
        assert replied_after > cut_after + 0.5, (cut_after, replied_after)  # the loop was held meanwhile
        run = k.run(IFACES)
        assert run.stdout.strip() == "['lo']", (run.reply, run.stderr, run.errors)
        assert k.run("print(kept)").stdout.strip() == "1"
    finally:
        k.shutdown()


def test_a_private_notebook_raises_a_docker_notebook_in_the_same_folder(
    docker_client: Any, test_image: str, tmp_path: Path
) -> None:
    shared = f"--SandboxKernel.privacy_dir={tmp_path / 'state' / 'privacy'}"  # one ratchet store, as on one host
    (tmp_path / "a").mkdir()
    a = DockerKernel(tmp_path / "a", docker_client, test_image, shared)
    (tmp_path / "b").mkdir()  # B mounts A's very folder
    b = DockerKernel(
        tmp_path / "b", docker_client, test_image, f"--SandboxKernel.workspace={a.handle.workspace}", shared
    )
    try:
        assert eval(a.run(IFACES).stdout) != ["lo"] and eval(b.run(IFACES).stdout) != ["lo"]
        a.run("%private patients CONFIDENTIAL")
        a.run("open('/workspace/rows.csv', 'w').write('ada,42')")
        assert wait_for(lambda: not _networked(b), 15), "B kept its network beside A's private rows"
        assert b.run(IFACES).stdout.strip() == "['lo']"
    finally:
        a.shutdown()
        b.shutdown()


def test_restart_keeps_the_docker_session(docker_client: Any, test_image: str, tmp_path: Path) -> None:
    k = DockerKernel(tmp_path, docker_client, test_image)
    try:
        k.run("%private payroll INTERNAL")
        assert k.run(IFACES).stdout.strip() == "['lo']"
        old_pid = k.pid
        k.handle.km.restart_kernel(now=True)
        k.handle.kc.wait_for_ready(timeout=60)
        k.pid = k.handle.pid
        assert k.run(IFACES).stdout.strip() == "['lo']"
        assert not _networked(k)
        # the killed kernel's container went with it
        assert wait_for(lambda: not containers_of(k.client, old_pid), 30), containers_of(k.client, old_pid)
    finally:
        k.shutdown()


def test_widgets_work_in_a_container(dk: DockerKernel) -> None:
    """The same widget path as bwrap: a slider's change from the frontend runs
    its observer in the container, and a widget from elsewhere is refused."""
    run = dk.run(
        "import ipywidgets as w\ns = w.IntSlider(value=2)\ns.observe(lambda ch: print('now', ch['new']), 'value')\ns"
    )
    assert run.status == "ok", (run.reply, run.stderr)
    slider = [c for c in run.of("comm_open") if c["data"]["state"].get("_model_name") == "IntSliderModel"]
    assert slider and run.result is not None and "application/vnd.jupyter.widget-view+json" in run.result
    kc = dk.handle.kc
    msg = kc.session.msg(
        "comm_msg", {"comm_id": slider[0]["comm_id"], "data": {"method": "update", "state": {"value": 5}}}
    )
    kc.shell_channel.send(msg)
    printed = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "now 5" not in printed:
        try:
            reply = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"] and reply["msg_type"] == "stream":
            printed += reply["content"]["text"]
    assert printed == "now 5\n"
    assert dk.run("print(s.value)").stdout == "5\n"
    evil = dk.run(
        "import traitlets as t\nclass E(w.DOMWidget):\n    _view_module = t.Unicode('evil').tag(sync=True)\nE()"
    )
    assert "is not installed in this Jupyter server" in evil.stderr
    assert [c for c in evil.of("comm_open") if "evil" in str(c)] == []  # its Layout (a standard model) is fine


def test_a_standby_near_the_containers_memory_cap_copies_no_pages(fresh_dk: DockerKernel) -> None:
    """The container's cgroup is in view (Docker mounts it; bwrap hides /sys):
    within a quarter of its memory cap (256 MiB here) an idle standby copies
    no pages in (worker/hot_pages.py), so the copies cannot meet the cap and
    have the kernel kill the holder."""
    copied = "import sys\nprint(sys.modules['sandbox_kernel_worker.hot_pages'].copied_in)"

    def spaced(code: str) -> str:
        return fresh_dk.handle.stdout_of(code, after_idle=0.3)

    spaced("import sys")
    assert max(int(spaced(copied)) for _ in range(3)) > 0  # far from the cap: copies
    spaced("held = bytearray(180 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1")
    assert [int(spaced(copied)) for _ in range(3)] == [0, 0, 0]
    spaced("del held")
    assert max(int(spaced(copied)) for _ in range(3)) > 0
