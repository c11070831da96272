"""The seccomp profile on the Docker backends (real daemon): the kernel's
containers (``--SandboxKernel.backend=docker``) and the Docker shell
(``SandboxManager``) refuse what the bwrap filter refuses, because both get
their rules from ``sandbox_kernel.sandbox.seccomp``. Attacks run from inside:
a cell, or a shell command. No network traffic: sockets are only opened.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_docker_kernel import DockerKernel

from sandbox_kernel.sandbox import seccomp

pyseccomp = pytest.importorskip("pyseccomp")


def nr(name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


CELL = f"""
import ctypes, errno, json, os, socket, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(number, *args):
    ctypes.set_errno(0)
    res = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return [res, ctypes.get_errno()]
def attempt(fn):
    try:
        fn()
        return 'done'
    except OSError as exc:
        return errno.errorcode.get(exc.errno)
status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
out = {{
    'seccomp': status['Seccomp'].strip(),
    'vsock': attempt(lambda: socket.socket(40, socket.SOCK_STREAM)),
    'packet': attempt(lambda: socket.socket(17, socket.SOCK_RAW)),
    'raw_vsock_high': sc({nr("socket")}, 0x100000028, 1, 0),
    'symlink': attempt(lambda: os.symlink('/etc/passwd', '/workspace/plant-link')),
    'raw_symlinkat': sc({nr("symlinkat")}, b'/etc/passwd', -100, b'/workspace/plant-raw'),
    'mkfifo': attempt(lambda: os.mkfifo('/workspace/plant-fifo')),
    'mknod': attempt(lambda: os.mknod('/workspace/plant-node', 0o600 | stat.S_IFSOCK)),
    'raw_mknodat': sc({nr("mknodat")}, -100, b'/workspace/plant-raw-fifo', stat.S_IFIFO | 0o600, 0),
    'unshare_user': sc({nr("unshare")}, 0x10000000),
    'clone_newuser': sc({nr("clone")}, 0x10000000 | 17, 0, 0, 0, 0),
    'clone3': sc({nr("clone3")}, 0, 0),
    'ptrace': sc({nr("ptrace")}, 0, 0, 0, 0),
    'keyctl': sc({nr("keyctl")}, 0, -3, 1),
    'io_uring_setup': sc({nr("io_uring_setup")}, 4, ctypes.create_string_buffer(120)),
    'personality_no_aslr': sc({nr("personality")}, 0x0040000),
    'personality_query': sc({nr("personality")}, 0xFFFFFFFF),
    'listing': sorted(n for n in os.listdir('/workspace') if n.startswith('plant')),
}}
import multiprocessing as mp, threading
with mp.Pool(2) as pool:
    out['pool'] = pool.map(abs, [-1, -2])
print('OUT=' + json.dumps(out))
"""


def check_cell_output(out: dict[str, Any]) -> None:
    assert out["seccomp"] == "2"
    for name in ("vsock", "packet", "symlink", "mkfifo", "mknod"):
        assert out[name] == "EPERM", (name, out)
    for name in (
        "raw_vsock_high",
        "raw_symlinkat",
        "raw_mknodat",
        "unshare_user",
        "clone_newuser",
        "ptrace",
        "keyctl",
        "io_uring_setup",
        "personality_no_aslr",
    ):
        assert out[name] == [-1, errno.EPERM], (name, out)
    assert out["clone3"] == [-1, errno.ENOSYS], out
    assert out["personality_query"] == [0, 0], out
    assert out["listing"] == [] and out["pool"] == [1, 2], out


@pytest.fixture(scope="module")
def dk(docker_client: Any, test_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerKernel]:
    kernel = DockerKernel(tmp_path_factory.mktemp("docker-seccomp"), docker_client, test_image)
    yield kernel
    kernel.shutdown()


def test_kernel_container_carries_the_profile(dk: DockerKernel) -> None:
    assert dk.run("1").status == "ok"
    options = dk.container()["HostConfig"]["SecurityOpt"] or []
    profiles = [opt for opt in options if opt.startswith("seccomp=")]
    assert len(profiles) == 1 and "no-new-privileges" in options
    assert json.loads(profiles[0][len("seccomp=") :]) == seccomp.docker_profile()


def test_kernel_cells_are_refused_what_bwrap_cells_are(dk: DockerKernel) -> None:
    run = dk.run(CELL, timeout=120)
    assert run.status == "ok", (run.reply, run.stderr)
    lines = [line for line in run.stdout.splitlines() if line.startswith("OUT=")]
    assert lines, run.stdout
    check_cell_output(json.loads(lines[-1][4:]))
    assert not [p for p in dk.handle.workspace.iterdir() if p.name.startswith("plant")]


def test_docker_shell_is_refused_the_same(manager: Any, ids: tuple[str, str]) -> None:
    script = (
        "grep '^Seccomp:' /proc/self/status; "
        "ln -s /etc/passwd /workspace/plant-link; echo ln=$?; "
        "mkfifo /workspace/plant-fifo; echo mkfifo=$?; "
        "mknod /workspace/plant-node p; echo mknod=$?; "
        "unshare -U true; echo unshare=$?; "
        "python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)' 2>&1 | tail -n 1; "
        "ls -A /workspace"
    )
    code, out = manager.execute_command(*ids, script)
    assert "Seccomp:\t2" in out, out
    for name in ("ln", "mkfifo", "mknod", "unshare"):
        assert f"{name}=0" not in out and f"{name}=" in out, out
    assert out.count("Operation not permitted") >= 5, out
    assert "PermissionError" in out, out
    assert "plant" not in out.split("unshare=")[-1].split("PermissionError")[-1], out
    workspace: Path = manager.workspace_for(*ids)
    assert not [p for p in workspace.iterdir() if p.name.startswith("plant")]
