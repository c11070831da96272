"""JupyterHub for real (issue 14, part 4): DockerSpawner, two users, the shared store.

A real JupyterHub (PyPI ``jupyterhub``, its proxy from npm, ``dockerspawner``)
spawns one container per user (tests/docker/hub/jupyterhub_config.py). The
containers are on the host's network, so everything meets on 127.0.0.1, and
they get the narrow settings of docs/deploy/container.md. Each user runs a
notebook on ``sandbox-python`` through the server's REST and websocket APIs,
behind the hub's proxy:

- the cells are bwrap-sandboxed inside the unprivileged container;
- alice's private session reaches the PostgreSQL store that every kernel
  shares, under her hub name (not the containers' common OS user);
- bob's session of a notebook with the same path stays public;
- neither user reaches the other's server, files or sessions.

It runs twice: on the offline test image with this checkout mounted
read-only, and on the single-user image (tests/docker/test_single_user_image.py
builds it, or reuses the one built from the same inputs).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_helpers import free_port
from narrow_container import this_checkout_mounts
from pg_helpers import PostgresServer
from test_single_user_image import single_user_image

from sandbox_kernel.privacy import PrivateData, Sensitivity, session_id_for_notebook
from sandbox_kernel.privacy.postgres import open_store

REPO = Path(__file__).resolve().parents[2]
HUB_CONFIG = Path(__file__).with_name("hub") / "jupyterhub_config.py"
CHP = REPO / ".venv" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
USERS = ("alice", "bob")
#: the server's root is ~/work (docker-stacks' layout): a notebook in the home
#: folder itself would get the home-folder rule (nothing created at its top level)
WORK = "/home/jovyan/work"

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("dockerspawner")


class Hub:
    """A JupyterHub process of this test's, and its REST API."""

    #: which image its servers run ("offline" or "single-user", see IMAGES)
    kind = ""

    def __init__(self, root: Path, image: str, cmd: list[str], ro_mounts: dict[str, str], pg: PostgresServer) -> None:
        self.root = root
        self.token = secrets.token_hex(16)
        # three distinct ports: a port just closed can be handed out again (CI
        # run B: the hub and the proxy's API got the same one, and the hub exited)
        ports: list[int] = []
        while len(ports) < 3:
            port = free_port()
            if port not in ports:
                ports.append(port)
        self.proxy_port, self.hub_port, proxy_api_port = ports
        kernel_config = root / "sandbox_kernel_config.py"
        kernel_config.write_text(f"c.SandboxKernel.shared_store_url = {pg.url!r}\n")
        for user in USERS:
            home = root / "homes" / user
            (home / "work").mkdir(parents=True)
            os.chown(home, 1000, 1000)
            os.chown(home / "work", 1000, 1000)
        env = {
            **os.environ,
            "SK_HUB_ID": uuid.uuid4().hex[:8],
            "SK_HUB_DIR": str(root),
            "SK_HUB_PORT": str(self.hub_port),
            "SK_HUB_PROXY_PORT": str(self.proxy_port),
            "SK_HUB_PROXY_API_PORT": str(proxy_api_port),
            "SK_HUB_CHP": str(CHP),
            "SK_HUB_USERS": ",".join(USERS),
            "SK_HUB_PASSWORD": secrets.token_hex(8),
            "SK_HUB_TOKEN": self.token,
            "SK_HUB_IMAGE": image,
            "SK_HUB_CMD": json.dumps(cmd),
            "SK_HUB_RO_MOUNTS": json.dumps(ro_mounts),
            "SK_HUB_ENV": json.dumps({"SANDBOX_KERNEL_DATA_DIR": "/home/jovyan/.sandbox-kernel"}),
            "SK_HUB_PG_DIR": str(pg.root),
            "SK_HUB_KERNEL_CONFIG": str(kernel_config),
            "SK_HUB_SECCOMP": str(REPO / "docker" / "seccomp-bwrap.json"),
            "SK_HUB_OWNER_PID": str(os.getpid()),
        }
        self.log_path = root / "jupyterhub.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - open for the hub's life, closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(HUB_CONFIG)],
            cwd=root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait(lambda: self.api("GET", "/hub/api/")[0] == 200, "the hub's API", 90)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait(self, check: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyterhub exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{what} not ready in {timeout} s:\n{self.log_tail()}")

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """A request through the proxy (as a browser's would go)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.proxy_port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {token or self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def start_server(self, user: str) -> str:
        """Start ``user``'s server; a token of the user's own."""
        assert self.api("POST", f"/hub/api/users/{user}", {})[0] in (201, 409), self.log_tail()
        status, answer = self.api("POST", f"/hub/api/users/{user}/server")
        assert status in (201, 202), f"{status} {answer}\n{self.log_tail()}"

        def ready() -> bool:
            status, info = self.api("GET", f"/hub/api/users/{user}")
            return status == 200 and bool(info["servers"].get("", {}).get("ready"))

        self.wait(ready, f"{user}'s server", 180)
        status, made = self.api("POST", f"/hub/api/users/{user}/tokens", {"note": "test", "expires_in": 3600})
        assert status in (200, 201), made
        return str(made["token"])

    def stop(self) -> None:
        for user in USERS:
            try:
                self.api("DELETE", f"/hub/api/users/{user}/server")
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


async def run_cells(hub: Hub, user: str, token: str, kernel_id: str, cells: list[str]) -> list[tuple[str, str]]:
    """Each cell's stdout and its other output (stderr, errors, results), over the
    server's kernel websocket."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{hub.proxy_port}/user/{user}/api/kernels/{kernel_id}/channels"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    session = uuid.uuid4().hex
    texts = []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "username": user,
                "session": session,
                "date": "2026-01-01T00:00:00Z",
                "version": "5.3",
            }
            content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
            await ws.write_message(
                json.dumps(
                    {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
                )
            )
            text, other = "", ""
            while True:
                raw = await asyncio.wait_for(ws.read_message(), 120)
                assert raw is not None, "the kernel websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, body = msg["msg_type"], msg["content"]
                if kind == "stream" and body["name"] == "stdout":
                    text += body["text"]
                elif kind == "stream":
                    other += body["text"]
                elif kind == "error":
                    other += f"{body['ename']}: {body['evalue']}"
                elif kind == "execute_result":
                    other += body["data"].get("text/plain", "")
                elif kind == "status" and body["execution_state"] == "idle":
                    break
            texts.append((text, other))
    finally:
        ws.close()
    return texts


def rows(pg: PostgresServer) -> list[tuple[Any, ...]]:
    """What the shared store holds (for a failure's message)."""
    import psycopg

    with psycopg.connect(pg.url) as conn:
        return list(conn.execute("SELECT * FROM sandbox_kernel_datasets"))


def offline_image_setup() -> tuple[list[str], dict[str, str]]:
    return [str(Path(sys.prefix) / "bin" / "jupyterhub-singleuser")], this_checkout_mounts()


IMAGES = ["offline", "single-user"]


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    os.chmod(server.root, 0o755)  # uid 1000 in the containers reaches the socket
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(params=IMAGES)
def hub(request: pytest.FixtureRequest, docker_client: Any, test_image: str, pg: PostgresServer) -> Iterator[Hub]:
    if not CHP.exists():
        pytest.fail(f"{CHP} is missing: scripts/setup.sh --test installs configurable-http-proxy")
    root = Path(f"/tmp/skhub-{uuid.uuid4().hex[:8]}")  # short: JupyterHub's and PostgreSQL's paths
    root.mkdir(mode=0o755)
    if request.param == "offline":
        cmd, mounts = offline_image_setup()
        image = test_image
    else:
        cmd, mounts, image = [], {}, single_user_image(docker_client)
    hub = Hub(root, image, cmd, mounts, pg)
    hub.kind = request.param
    try:
        yield hub
    finally:
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_two_users_on_a_hub_each_in_their_own_sandboxed_server(
    hub: Hub, pg: PostgresServer, docker_client: Any
) -> None:
    tokens = {user: hub.start_server(user) for user in USERS}
    # a notebook name of this hub's own: the store outlives a hub (one server per module)
    name = f"analysis-{hub.root.name}.ipynb"
    session = session_id_for_notebook(f"{WORK}/{name}")
    observer = open_store(hub.root / "observer", pg.url)
    assert PrivateData("alice", session, observer).sensitivity == Sensitivity.PUBLIC
    # a container per user, with the narrow settings and nothing more
    found = docker_client.api.containers(filters={"label": f"sandbox_kernel.owner_pid={os.getpid()}"})
    names = sorted(c["Names"][0].rsplit("-", 1)[-1] for c in found)
    assert names == sorted(USERS), found
    for info in found:
        config = docker_client.api.inspect_container(info["Id"])
        host = config["HostConfig"]
        assert config["Config"]["User"] == "1000:1000" and host["Privileged"] is False and not host["CapAdd"]
        assert host["CapDrop"] == ["ALL"] and host["NetworkMode"] == "host" and host["ReadonlyRootfs"] is True
        assert host["MaskedPaths"] == [] and "no-new-privileges" in host["SecurityOpt"]
    kernels = {}
    for user in USERS:
        body = {"path": name, "type": "notebook", "name": name, "kernel": {"name": "sandbox-python"}}  # as Lab does
        status, made = hub.api("POST", f"/user/{user}/api/sessions", body, token=tokens[user])
        assert status == 201, made
        kernels[user] = made["kernel"]["id"]

    alice = asyncio.run(
        run_cells(
            hub,
            "alice",
            tokens["alice"],
            kernels["alice"],
            [
                "import os; print(os.getpid(), os.path.exists('/.dockerenv'), os.getcwd())",
                "open('alice-only.txt', 'w').write('x'); print(sorted(os.listdir('.')))",
                "import sandbox_kernel.private as p; p.add_dataset('payroll', 'CONFIDENTIAL')",
            ],
        )
    )
    pid, dockerenv, cwd = alice[0][0].split()
    assert int(pid) < 20 and dockerenv == "False", alice  # bwrap's namespaces inside the hub's container
    assert "alice-only.txt" in alice[1][0], alice
    assert "[SYSTEM] Network access has been restricted" in alice[2][1], alice
    assert (hub.root / "homes" / "alice" / "work" / "alice-only.txt").exists()

    bob = asyncio.run(
        run_cells(hub, "bob", tokens["bob"], kernels["bob"], ["import os; print(sorted(os.listdir('.')))"])
    )
    assert (
        "alice-only.txt" not in bob[0][0] and not (hub.root / "homes" / "bob" / "work" / "alice-only.txt").exists()
    ), bob

    # the ratchet went to the shared store under the hub's user names
    assert PrivateData("alice", session, observer).sensitivity == Sensitivity.CONFIDENTIAL, rows(pg)
    assert PrivateData("bob", session, observer).sensitivity == Sensitivity.PUBLIC

    # neither reaches the other's server: sessions, files, kernels
    for path in ("/user/bob/api/sessions", "/user/bob/api/contents", f"/user/bob/api/kernels/{kernels['bob']}"):
        status, _ = hub.api("GET", path, token=tokens["alice"])
        assert status == 403, (path, status)
    status, listed = hub.api("GET", "/user/bob/api/sessions", token=tokens["bob"])
    assert status == 200 and [s["kernel"]["id"] for s in listed] == [kernels["bob"]]

    # the single-user image's server fetches nothing from another origin into its
    # pages (sandbox_kernel/lab_content_policy.py, put into /etc/jupyter by
    # scripts/build-image.sh; the offline image runs the host's jupyterhub-singleuser)
    request = urllib.request.Request(
        f"http://127.0.0.1:{hub.proxy_port}/user/alice/api/status",
        headers={"Authorization": f"token {tokens['alice']}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        policy = response.headers.get("Content-Security-Policy", "")
    if hub.kind == "single-user":
        assert "img-src 'self' data: blob:" in policy and "connect-src 'self'" in policy, policy
    else:
        assert "img-src" not in policy, policy  # the check above can tell the two apart
