"""The seccomp profile on the Docker backends (real daemon): the kernel's
containers (``--SandboxKernel.backend=docker``) and the Docker shell
(``SandboxManager``) refuse what the bwrap filter refuses, because both get
their rules from ``sandbox_kernel.sandbox.seccomp``. Attacks run from inside:
a cell, or a shell command. No network traffic: sockets are only opened.
"""

from __future__ import annotations

import errno
import json
import os
import stat
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
# a whiteout (char device 0:0) left by renameat2(RENAME_WHITEOUT), unprivileged since 5.8
open('/workspace/wo-src', 'w').close()
out['renameat2_whiteout'] = sc({nr("renameat2")}, -100, b'/workspace/wo-src', -100, b'/workspace/wo-dst', 4)
for name in ('wo-src', 'wo-dst'):
    path = '/workspace/' + name
    if os.path.lexists(path) and not stat.S_ISCHR(os.lstat(path).st_mode):
        os.unlink(path)  # a node, if one was left, stays for the host-side check
out['renameat2_noreplace'] = sc({nr("renameat2")}, -100, b'/workspace/wo-dst', -100, b'/workspace/wo-moved', 1)
# set-uid and set-gid files in the workspace: the host would run them as the container's uid
import shutil
shutil.copy('/usr/bin/id', '/workspace/setid-id')
out['chmod_suid'] = attempt(lambda: os.chmod('/workspace/setid-id', 0o4755))
out['raw_fchmodat_sgid'] = sc({nr("fchmodat")}, -100, b'/workspace/setid-id', 0o2755, 0)
out['raw_openat_creat_suid'] = sc({nr("openat")}, -100, b'/workspace/setid-raw', os.O_CREAT | os.O_WRONLY, 0o4755)
out['mkdir_sgid'] = attempt(lambda: os.mkdir('/workspace/setid-dir', 0o2777))
out['openat2'] = sc({nr("openat2")}, -100, b'/workspace/setid-openat2', (ctypes.c_uint64 * 3)(0o101, 0o4755, 0), 24)
out['chmod_plain'] = attempt(lambda: os.chmod('/workspace/setid-id', 0o755))
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
    for name in ("chmod_suid", "mkdir_sgid"):
        assert out[name] == "EPERM", (name, out)
    for name in ("renameat2_whiteout", "raw_fchmodat_sgid", "raw_openat_creat_suid"):
        assert out[name] == [-1, errno.EPERM], (name, out)
    assert out["openat2"] == [-1, errno.ENOSYS], out
    assert out["renameat2_noreplace"] == [-1, errno.ENOENT] and out["chmod_plain"] == "done", out


def check_host_view(workspace: Path) -> None:
    """What the host sees after the cell: no device node, no set-id entry."""
    for path in workspace.rglob("*"):
        mode = os.lstat(path).st_mode
        assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), path
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(mode))


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
    check_host_view(dk.handle.workspace)


def test_docker_shell_is_refused_the_same(manager: Any, ids: tuple[str, str]) -> None:
    script = (
        "grep '^Seccomp:' /proc/self/status; "
        "ln -s /etc/passwd /workspace/plant-link; echo ln=$?; "
        "mkfifo /workspace/plant-fifo; echo mkfifo=$?; "
        "mknod /workspace/plant-node p; echo mknod=$?; "
        "unshare -U true; echo unshare=$?; "
        "cp /bin/sh /workspace/setid-sh; chmod u+s /workspace/setid-sh; echo chmod=$?; "
        "python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)' 2>&1 | tail -n 1; "
        "ls -A /workspace"
    )
    code, out = manager.execute_command(*ids, script)
    assert "Seccomp:\t2" in out, out
    for name in ("ln", "mkfifo", "mknod", "unshare", "chmod"):
        assert f"{name}=0" not in out and f"{name}=" in out, out
    assert out.count("Operation not permitted") >= 6, out
    assert "PermissionError" in out, out
    assert "plant" not in out.split("unshare=")[-1].split("PermissionError")[-1], out
    workspace: Path = manager.workspace_for(*ids)
    assert not [p for p in workspace.iterdir() if p.name.startswith("plant")]
    check_host_view(workspace)
