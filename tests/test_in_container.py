"""The container hints: which runtime, and what to set for bwrap's failures there.
(tests/docker/test_bwrap_in_container.py runs the kernel in real containers.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.sandbox.in_container import bwrap_hint, container_runtime
from sandbox_kernel.sandbox.seccomp import BWRAP_HOST_NEEDS, RULES, container_profile, docker_profile

NO_NS = "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged"
NO_PROC = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"


def fake(tmp_path: Path, cgroup: str = "0::/\n", marker: str | None = None) -> tuple[Path, Path]:
    root, proc = tmp_path / "root", tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cgroup").write_text(cgroup)
    (root / "run").mkdir(parents=True)
    if marker:
        (root / marker).write_text("")
    return root, proc


@pytest.mark.parametrize(
    ("cgroup", "marker", "runtime"),
    [
        ("0::/\n", ".dockerenv", "docker"),
        ("0::/\n", "run/.containerenv", "podman"),
        ("11:memory:/kubepods/besteffort/pod1/abc\n", None, "kubernetes"),
        ("12:pids:/docker/0123abcd\n", None, "docker"),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", None, None),
    ],
)
def test_container_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cgroup: str, marker: str | None, runtime: str | None
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    root, proc = fake(tmp_path, cgroup, marker)
    assert container_runtime(proc=proc, root=root) == runtime


def test_hints_name_the_settings_only_in_a_container() -> None:
    assert bwrap_hint(NO_NS, runtime=None) is None is bwrap_hint(NO_PROC, runtime=None)
    assert bwrap_hint("bwrap: execvp python3: No such file or directory", runtime="docker") is None
    seccomp = bwrap_hint(NO_NS, runtime="docker")
    assert seccomp and "container-profile" in seccomp and "systempaths=unconfined" in seccomp
    proc = bwrap_hint(NO_PROC, runtime="kubernetes")
    assert proc and "procMount: Unmasked" in proc and "(kubernetes)" in proc


def test_container_profile_lets_through_only_what_bwrap_needs() -> None:
    sandbox = {name for entry in docker_profile()["syscalls"] for name in entry["names"]}
    container = {name for entry in container_profile()["syscalls"] for name in entry["names"]}
    assert sandbox - container == BWRAP_HOST_NEEDS & {rule.syscall for rule in RULES}
    assert {"ptrace", "keyctl", "bpf", "io_uring_setup", "kexec_load", "open_by_handle_at", "chroot"} <= container
    assert container_profile()["defaultAction"] == "SCMP_ACT_ALLOW"
