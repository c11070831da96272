"""bwrap sandboxes inside an unprivileged container (issue 14, part 3).

A kernel that a JupyterHub spawner starts in a container: uid 1000, every
capability dropped, not privileged, no new privileges, a read-only root, no
network. With the shipped seccomp profile
(docker/seccomp-bwrap.json) and ``systempaths=unconfined`` a notebook's cells
run bwrap-sandboxed, ratchet included; with the runtime's defaults the kernel
refuses to run cells and says what to set (never a silent fallback). The
profile itself is attacked from the container's own process: what Docker's
default refuses stays refused, only namespaces and mounts are let through.

The container is the offline test image with the host's /usr, this checkout and
its Python mounted read-only (plus the loader cache and ldconfig, which the
image lacks and ctypes.util needs to find libseccomp).
"""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from narrow_container import driver_result, narrow_container, run_to_end, this_checkout_mounts

from sandbox_kernel.sandbox.seccomp import container_profile

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("in_container_driver.py")
PROFILE = REPO / "docker" / "seccomp-bwrap.json"

pytestmark = pytest.mark.timeout(300)

CELLS = [
    "import os, socket; print(os.getpid(), os.path.exists('/.dockerenv'), [n for _, n in socket.if_nameindex()])",
    # what the container's process may do, a cell may not: make a user namespace
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.unshare(0x10000000), ctypes.get_errno())",
    "import sandbox_kernel.private as p; p.add_dataset('patients', 'CONFIDENTIAL')",
    "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')])",
]


def run_in_container(docker_client: Any, image: str, args: list[str], security_opt: list[str]) -> dict[str, Any]:
    """Run the driver in a fresh container; ``systempaths=unconfined`` in
    ``security_opt`` is what ``docker run`` turns it into: no masked or read-only
    /proc paths."""
    binds = {**this_checkout_mounts(), str(DRIVER): "/driver.py"}
    api = docker_client.api
    with narrow_container(
        api,
        image,
        [sys.executable, "-I", "/driver.py", *args],
        binds=[f"{source}:{target}:ro" for source, target in binds.items()],
        security_opt=[o for o in security_opt if o != "systempaths=unconfined"],
        unmask_proc="systempaths=unconfined" in security_opt,
    ) as container_id:
        inspect = api.inspect_container(container_id)["HostConfig"]
        assert inspect["Privileged"] is False and not inspect["CapAdd"] and inspect["CapDrop"] == ["ALL"]
        return driver_result(*run_to_end(api, container_id))


def text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def stdout_of(outputs: list[dict[str, Any]]) -> str:
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout")


def test_shipped_profile_is_the_generated_one() -> None:
    assert json.loads(PROFILE.read_text()) == container_profile(), "regenerate: sandbox-kernel container-profile"


def test_notebook_cells_are_bwrap_sandboxed_in_an_unprivileged_container(docker_client: Any, test_image: str) -> None:
    got = run_in_container(
        docker_client,
        test_image,
        ["notebook", json.dumps(CELLS)],
        [f"seccomp={PROFILE.read_text()}", "systempaths=unconfined", "no-new-privileges"],
    )
    outputs = got["outputs"]
    pid, dockerenv, ifaces = stdout_of(outputs[0]).split(" ", 2)
    # a pid namespace of its own, a root that is not the container's, only loopback
    assert int(pid) < 20 and dockerenv == "False" and ifaces.strip() == "['lo']", text_of(outputs[0])
    # the container's process may make a user namespace (the profile), a cell may not
    assert stdout_of(outputs[1]).split() == ["-1", str(errno.EPERM)], text_of(outputs[1])
    # the ratchet rises and cuts the sandbox's network, in the container as on a host
    assert "[SYSTEM] Network access has been restricted" in text_of(outputs[2]), text_of(outputs[2])
    assert "CONFIDENTIAL" in text_of(outputs[2])
    assert "Seccomp:\\t2" in stdout_of(outputs[3]), text_of(outputs[3])


@pytest.mark.parametrize(
    ("security_opt", "must_say"),
    [
        ([], ["seccomp profile refuses the user namespaces", "container-profile", "systempaths=unconfined"]),
        (["seccomp=PROFILE"], ["masks paths under /proc", "systempaths=unconfined"]),
    ],
    ids=["runtime-defaults", "profile-without-systempaths"],
)
def test_without_the_settings_cells_are_refused_with_what_to_set(
    docker_client: Any, test_image: str, security_opt: list[str], must_say: list[str]
) -> None:
    opts = [f"seccomp={PROFILE.read_text()}" if o == "seccomp=PROFILE" else o for o in security_opt]
    got = run_in_container(docker_client, test_image, ["notebook", json.dumps(CELLS[:2])], opts)
    for outputs in got["outputs"]:
        assert [o["output_type"] for o in outputs] == ["error"], outputs  # nothing ran, sandboxed or not
        message = outputs[0]["evalue"]
        assert outputs[0]["ename"] == "SandboxUnavailable"
        for words in must_say:
            assert words in message, message


PROBES = ["ptrace", "process_vm_readv", "keyctl", "name_to_handle_at", "io_uring_setup"]


def test_the_profile_refuses_what_the_default_refuses_and_lets_bwrap_through(
    docker_client: Any, test_image: str
) -> None:
    """From the container's own process, outside bwrap. The control run without a
    profile proves each probe can succeed or fail otherwise than EPERM."""
    unconfined = run_in_container(docker_client, test_image, ["syscalls", *PROBES, "unshare"], ["seccomp=unconfined"])
    assert all(code != errno.EPERM for code in unconfined["errno"].values()), unconfined
    default = run_in_container(docker_client, test_image, ["syscalls", "unshare"], [])
    assert default["errno"] == {"unshare": errno.EPERM}  # why bwrap fails under the runtime's default
    shipped = run_in_container(
        docker_client, test_image, ["syscalls", *PROBES, "unshare"], [f"seccomp={PROFILE.read_text()}"]
    )
    assert shipped["errno"] == {**dict.fromkeys(PROBES, errno.EPERM), "unshare": 0}


def test_doctor_in_the_container_says_what_to_set(docker_client: Any, test_image: str) -> None:
    refused = run_in_container(docker_client, test_image, ["doctor"], [])
    assert refused["code"] != 0
    line = next(line for line in refused["report"].splitlines() if "bubblewrap" in line)
    assert line.startswith("[FAIL]"), refused["report"]
    assert "container-profile" in refused["report"] and "systempaths=unconfined" in refused["report"]
    allowed = run_in_container(
        docker_client, test_image, ["doctor"], [f"seccomp={PROFILE.read_text()}", "systempaths=unconfined"]
    )
    line = next(line for line in allowed["report"].splitlines() if "bubblewrap" in line)
    assert line.startswith("[ ok ]"), allowed["report"]
