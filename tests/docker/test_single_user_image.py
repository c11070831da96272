"""The single-user image that scripts/build-image.sh builds (issue 14, part 2).

The image is built from this checkout, from Debian's archive and PyPI, unless
an image built from the same inputs (the tracked files the build reads) is
already in the daemon: its tag is ``sandbox-kernel-singleuser:test-<hash of the
inputs>``. It is kept as a cache, and images of older inputs that this test
tagged are removed, by id. ``SANDBOX_KERNEL_IMAGE`` names an image to test
instead. The container gets the narrow settings of docs/deploy/container.md:
uid 1000, every capability dropped, no new privileges, the shipped seccomp
profile, unmasked /proc paths and no network. Nothing of the host is mounted
in, except the small driver script.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from narrow_container import driver_result, narrow_container, run_to_end
from test_bwrap_in_container import CELLS, DRIVER, PROFILE, stdout_of, text_of

REPO = Path(__file__).resolve().parents[2]
REPOSITORY = "sandbox-kernel-singleuser"
PYTHON = "/opt/sandbox-kernel/bin/python"
#: what the build reads: a change to any of these makes a new image
BUILD_INPUTS = ["sandbox_kernel", "kernelspec", "labextension/install.json", "pyproject.toml", "scripts/build-image.sh"]
BUILD_INPUTS += ["docker/seccomp-bwrap.json"]

pytestmark = pytest.mark.timeout(1800)


def inputs_tag() -> str:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--", *BUILD_INPUTS], capture_output=True, check=True
    ).stdout.split(b"\0")
    digest = hashlib.sha256()
    for name in sorted(n for n in listed if n):
        digest.update(name + b"\0" + (REPO / name.decode()).read_bytes())
    return f"{REPOSITORY}:test-{digest.hexdigest()[:16]}"


def single_user_image(docker_client: Any) -> str:
    """The image to test: built when no image of these inputs exists yet."""
    import docker

    if os.environ.get("SANDBOX_KERNEL_IMAGE"):
        return os.environ["SANDBOX_KERNEL_IMAGE"]
    tag = inputs_tag()
    # one build at a time: two test workers may ask for it together
    with open(Path(tempfile.gettempdir()) / "sandbox-kernel-image-build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            docker_client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), tag], check=True, timeout=1700)
        for old in docker_client.images.list(name=REPOSITORY):
            if tag not in old.tags and any(t.startswith(f"{REPOSITORY}:test-") for t in old.tags):
                docker_client.images.remove(old.id, force=True)
        return tag


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    return single_user_image(docker_client)


def run(docker_client: Any, image: str, command: list[str], security_opt: list[str]) -> str:
    """``command`` in a fresh container of ``image``, unmasked /proc; its log."""
    api = docker_client.api
    with narrow_container(
        api, image, command, binds=[f"{DRIVER}:/driver.py:ro"], security_opt=["no-new-privileges", *security_opt]
    ) as container_id:
        code, logs = run_to_end(api, container_id, timeout=300)
    assert code == 0, logs[-4000:]
    return logs


def test_the_image_holds_what_it_promises(docker_client: Any, image: str) -> None:
    info = docker_client.api.inspect_image(image)["Config"]
    assert info["User"] == "1000" and info["Cmd"] == ["jupyterhub-singleuser"]
    logs = run(
        docker_client,
        image,
        [
            PYTHON,
            "-c",
            "import sandbox_kernel, jupyterlab, jupyterhub, ipywidgets, pandas, matplotlib, psycopg, shutil;"
            "print(shutil.which('bwrap'), shutil.which('pasta'), shutil.which('jupyterhub-singleuser'))",
        ],
        [f"seccomp={PROFILE.read_text()}"],
    )
    assert logs.split() == ["/usr/bin/bwrap", "/usr/bin/pasta", "/opt/sandbox-kernel/bin/jupyterhub-singleuser"]
    specs = run(docker_client, image, [PYTHON, "-m", "jupyter", "kernelspec", "list", "--json"], [])
    assert "sandbox-python" in json.loads(specs)["kernelspecs"]


def test_a_notebook_in_the_image_is_bwrap_sandboxed(docker_client: Any, image: str) -> None:
    logs = run(
        docker_client,
        image,
        [PYTHON, "-I", "/driver.py", "notebook", json.dumps(CELLS)],
        [f"seccomp={PROFILE.read_text()}"],
    )
    result = driver_result(0, logs)
    outputs = result["outputs"]
    pid, dockerenv, ifaces = stdout_of(outputs[0]).split(" ", 2)
    assert int(pid) < 20 and dockerenv == "False" and ifaces.strip() == "['lo']", text_of(outputs[0])
    assert "[SYSTEM] Network access has been restricted" in text_of(outputs[2])


def answers(url: str, logs: Callable[[], str], timeout: float = 60) -> None:
    """Wait until an HTTP server answers ``url`` (any status): docker's port proxy
    accepts connections before the server in the container listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing answered {url} in {timeout} s; container log:\n{logs()[-3000:]}")


@pytest.mark.asyncio
async def test_the_image_serves_the_agent_tools_over_http(docker_client: Any, image: str) -> None:
    """`sandbox-kernel mcp` in the same image, published on 127.0.0.1 only, as
    docs/deploy/container.md says: 0.0.0.0 needs a token, and the published port
    (not the server's 8000) is an allowed Host."""
    import httpx2
    from kernel_helpers import free_port
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    token = "image-test-token-0123456789"
    api = docker_client.api
    command = ["sandbox-kernel", "mcp", "--transport", "streamable-http", "--host", "0.0.0.0", "--port", "8000"]
    command += ["--token", token, "--allowed-host", f"127.0.0.1:{port}"]
    with narrow_container(
        api,
        image,
        [*command, "--user-id", "agent", "--session-id", "web", "--backend", "bwrap"],
        security_opt=["no-new-privileges", f"seccomp={PROFILE.read_text()}"],
        network_mode="bridge",  # published on 127.0.0.1 only
        port_bindings={8000: ("127.0.0.1", port)},
    ) as container_id:
        api.start(container_id)
        answers(f"http://127.0.0.1:{port}/mcp", lambda: api.logs(container_id).decode(errors="replace"))
        url = f"http://127.0.0.1:{port}/mcp"
        with httpx2.Client(timeout=30) as http:
            assert http.post(url, json={}).status_code == 401  # no token
        http_client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        async with Client(streamable_http_client(url, http_client=http_client)) as client:
            first = await client.call_tool("repl_execute_cell", {"code": "import os; x = 6 * 7; os.getpid()"})
            again = await client.call_tool("repl_execute_cell", {"code": "x"})
    texts = ["\n".join(b.text for b in r.content if b.type == "text") for r in (first, again)]
    assert not first.is_error and int(texts[0].split()[-1]) < 20, texts  # a pid namespace of its own
    assert "42" in texts[1], texts
