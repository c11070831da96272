"""``sandbox-kernel doctor``: what this machine has for sandboxing, and the exact
command that fixes what is missing.

Every check really tries the thing (starts a bwrap sandbox, compiles the
seccomp filter, makes and removes a cgroup, pings the Docker daemon) rather
than looking for files, because what matters is whether a sandbox can start
here, with this user, under this kernel's AppArmor and container settings.
The exit status is non-zero when the default backend cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from .sandbox.in_container import bwrap_hint

OK, WARN, FAIL = "ok", "warning", "missing"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = {"ok": "[ ok ]", "warning": "[warn]", "missing": "[FAIL]"}[self.status]
        text = f"{mark} {self.name}: {self.detail}"
        if self.fix and self.status != OK:
            text += f"\n       fix: {self.fix}"
        return text


def _apt(package: str) -> str:
    prefix = "" if os.geteuid() == 0 else "sudo "
    return f"{prefix}apt-get install {package}"


def check_bwrap() -> Check:
    if shutil.which("bwrap") is None:
        return Check("bubblewrap", FAIL, "bwrap is not installed", _apt("bubblewrap"))
    from .sandbox.bwrap import BubblewrapSandbox

    async def run() -> tuple[int, bytes]:
        result = await BubblewrapSandbox().run([sys.executable, "-I", "-c", "print('sandboxed')"], timeout=60)
        return result.exit_code, result.stderr

    try:
        code, err = asyncio.run(run())
    except Exception as exc:  # e.g. the seccomp filter or a cgroup could not be set up
        return Check("bubblewrap", FAIL, f"a sandbox could not be started: {exc}", "see the other checks")
    if code != 0:
        text = err.decode(errors="replace").strip()
        fix = bwrap_hint(text) or (
            "sysctl -w kernel.unprivileged_userns_clone=1 (Debian) / "
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 23.10+)"
        )
        return Check("bubblewrap", FAIL, f"bwrap is installed but cannot start a sandbox here: {text[-300:]}", fix)
    return Check("bubblewrap", OK, "a sandbox starts (user, pid, net, ipc, uts, cgroup namespaces)")


def check_pasta() -> Check:
    if shutil.which("pasta") is None:
        return Check(
            "user-mode network (pasta)", WARN, "pasta is not installed: public sessions get no network", _apt("passt")
        )
    return Check("user-mode network (pasta)", OK, shutil.which("pasta") or "")


def check_seccomp() -> Check:
    try:
        from .sandbox import seccomp

        fd = seccomp.bpf_fd()
        os.close(fd)
    except Exception as exc:
        return Check(
            "seccomp filter", FAIL, f"cannot be built: {exc}", "pip install pyseccomp, and " + _apt("libseccomp2")
        )
    return Check("seccomp filter", OK, "built (namespace-crossing syscalls, links, device nodes refused)")


def check_landlock() -> Check:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
    except Exception:
        abi = -1
    if abi > 0:
        return Check("Landlock", OK, f"ABI {abi} available (informational: the seccomp filter does the refusing)")
    return Check("Landlock", WARN, "not available (informational)")


def check_cgroups() -> Check:
    from .sandbox import cgroups

    group, problem = cgroups.create(cgroups.Caps(memory=1 << 30, pids=64))
    if group is None:
        return Check(
            "whole-sandbox caps (cgroups)",
            WARN,
            f"none: {problem}; memory and process limits are per process only",
            "run the kernel where it may create cgroups (root, or a delegated cgroup v2 subtree)",
        )
    group.remove(timeout=1)
    return Check(
        "whole-sandbox caps (cgroups)",
        OK,
        f"cgroup v{group.version}: total memory (no swap), total processes, CPU weight",
    )


def check_uid() -> Check:
    if os.geteuid() != 0:
        return Check("sandbox uid", OK, "the kernel is not root: sandboxes have this user's access")
    from .sandbox.host_ids import SANDBOX_UID

    return Check(
        "sandbox uid", OK, f"the kernel is root: sandboxes run as uid {SANDBOX_UID} (SandboxKernel.sandbox_uid)"
    )


def check_docker() -> Check:
    try:
        import docker
    except ImportError:
        return Check(
            "Docker backend", WARN, "the docker SDK is not installed (optional)", "pip install 'sandbox_kernel[docker]'"
        )
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:
        return Check(
            "Docker backend",
            WARN,
            f"no daemon answers ({type(exc).__name__}) (optional)",
            _apt("docker.io") + " and start dockerd",
        )
    from .docker.config import ContainerConfig

    image = ContainerConfig().image
    try:
        client.images.get(image)
    except Exception:
        return Check(
            "Docker backend",
            WARN,
            f"daemon up, image {image} not present",
            f"docker build -t {image} docker/ (see docs/docker.md)",
        )
    return Check("Docker backend", OK, f"daemon up, image {image} present")


def check_kernelspec() -> Check:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    from .install import KERNEL_NAME

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        return Check(
            "kernelspec",
            FAIL,
            f"{KERNEL_NAME} is not installed",
            f"{sys.executable} -I -m sandbox_kernel install --sys-prefix",
        )
    if "-I" not in spec.argv[1:2]:
        return Check(
            "kernelspec",
            FAIL,
            f"{KERNEL_NAME} starts python without -I (an old install: the notebook folder would be on the host's import path)",
            f"{sys.executable} -I -m sandbox_kernel install --sys-prefix",
        )
    return Check("kernelspec", OK, f"{KERNEL_NAME}: {' '.join(spec.argv[:4])} ...")


def check_completer_seed() -> Check:
    from .engine import completer_seed

    seed = completer_seed.find()
    if seed is None:
        return Check(
            "completion cache",
            WARN,
            "not made yet: a new sandbox's first Tab takes seconds and a session's first plot"
            " scans every font (made at the first completion)",
            f"{sys.executable} -I -m sandbox_kernel install --sys-prefix",
        )
    return Check("completion cache", OK, str(seed))


def check_labextension() -> Check:
    from jupyter_core.paths import jupyter_path

    for base in jupyter_path("labextensions"):
        if (Path(base) / "sandbox-kernel-status" / "package.json").is_file():
            return Check("JupyterLab extension", OK, str(Path(base) / "sandbox-kernel-status"))
    return Check(
        "JupyterLab extension",
        WARN,
        "not installed: no network status in JupyterLab",
        "pip install sandbox_kernel (the wheel ships it), or scripts/setup.sh in a checkout",
    )


def check_store() -> Check:
    from .privacy import default_store

    root = default_store().root
    parent = root if root.exists() else root.parent
    while not parent.exists():
        parent = parent.parent
    try:
        st = parent.stat()
    except OSError as exc:
        return Check("ratchet store", FAIL, f"{root}: {exc}", "set SANDBOX_KERNEL_DATA_DIR to a private directory")
    if root.exists() and (stat.S_IMODE(root.stat().st_mode) & 0o077 or root.stat().st_uid != os.geteuid()):
        return Check("ratchet store", FAIL, f"{root} is not private to this user", f"chmod 700 {root}")
    if not os.access(parent, os.W_OK):
        return Check(
            "ratchet store",
            FAIL,
            f"{parent} is not writable",
            "set SANDBOX_KERNEL_DATA_DIR to a writable private directory",
        )
    if not root.exists():  # made on first use, mode 700
        return Check(
            "ratchet store", OK, f"{root} (made private to uid {os.geteuid()} on first use; hidden from every sandbox)"
        )
    return Check("ratchet store", OK, f"{root} (private to uid {st.st_uid}; hidden from every sandbox)")


def check_other_stores() -> Check:
    """The stores kept outside the data dir that every sandbox start hides
    (privacy/store_registry.py): a wrong or unreadable entry is a store some
    sandbox may not hide."""
    from .privacy.store_registry import read_registry, registry_dir, store_exists

    stores, problems = read_registry()
    live = [s for s in stores if store_exists(s)]
    gone = [s for s in stores if s not in live]
    detail = (
        f"{len(live)} outside the data dir, hidden from every sandbox: {', '.join(map(str, live))}"
        if live
        else "none outside the data dir"
    )
    if gone:
        detail += f"; {len(gone)} gone (their entries are skipped): {', '.join(map(str, gone))}"
    if problems:
        return Check(
            "other ratchet stores",
            WARN,
            f"{detail}; " + "; ".join(problems),
            f"fix or remove the files named in {registry_dir()} (each holds one store's absolute path)",
        )
    return Check("other ratchet stores", OK, detail)


CHECKS = (
    check_bwrap,
    check_pasta,
    check_seccomp,
    check_landlock,
    check_cgroups,
    check_uid,
    check_docker,
    check_kernelspec,
    check_completer_seed,
    check_labextension,
    check_store,
    check_other_stores,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandbox-kernel doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    checks = []
    for check in CHECKS:
        try:
            checks.append(check())
        except Exception as exc:  # a check must never hide the others
            checks.append(Check(check.__name__.removeprefix("check_"), FAIL, f"the check itself failed: {exc!r}"))
    if args.json:
        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            print(c.line())
    default_ok = checks[0].status == OK and checks[2].status == OK  # bwrap starts, under its seccomp filter
    if not args.json:
        print(
            "\nThe default backend (bwrap) "
            + (
                "can start sandboxes here."
                if default_ok
                else "CANNOT start sandboxes here: fix the [FAIL] lines above."
            )
        )
    return 0 if default_ok else 1
