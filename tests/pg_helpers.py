"""A real PostgreSQL server for the shared-store tests, from Debian's package.

Started in a temporary directory by ``initdb`` and ``pg_ctl`` (as ``nobody``
when the tests run as root: the server refuses root), listening only on a
unix socket in that directory; stopped by ``pg_ctl`` and removed at the end.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle

IN_CI = os.environ.get("CI", "").lower() == "true"


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PostgresServer:
    def __init__(self) -> None:
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            message = "PostgreSQL is not installed (Debian: apt-get install postgresql)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        self.pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="skpg-", dir="/tmp"))  # short: the socket path is limited
        self.data = self.root / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            os.chown(self.root, 65534, 65534)
            self.as_user = ["runuser", "-u", "nobody", "--"]
        self._run([initdb, "-D", str(self.data), "-A", "trust", "-U", "sk", "--no-sync", "-E", "UTF8"])
        self.start()
        self._prepare()

    def _prepare(self) -> None:
        """As a deployment does: the admin (``sk``, the superuser here) makes
        the schema and grants the kernels' role (``skuser``) what it needs."""
        import psycopg

        from sandbox_kernel.privacy.postgres import init_store

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE ROLE skuser LOGIN")
        init_store(self.admin_url, ["skuser"])

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run([*self.as_user, *argv], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {proc.stdout[-1000:]}{proc.stderr[-1000:]}")

    @property
    def url(self) -> str:
        """What kernels and agent tools connect as (SELECT, INSERT, UPDATE only)."""
        return f"postgresql://skuser@/postgres?host={self.root}"

    @property
    def admin_url(self) -> str:
        """The superuser, who owns the store's tables."""
        return f"postgresql://sk@/postgres?host={self.root}"

    def start(self) -> None:
        options = f"-k {self.root} -c listen_addresses='' -c fsync=off"
        self._run([self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start"])

    def stop(self) -> None:
        self._run([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def remove(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


def shared_store_kernel(root: Path, url: str, session: str, *extra: str, user_id: str = "erin") -> SandboxKernelHandle:
    """A bwrap kernel with full network on the store at ``url``, as one "host":
    its workspace, temp and data dirs under ``root``."""
    (root / "ws").mkdir(parents=True)
    (root / "tmp").mkdir()
    return SandboxKernelHandle(
        root / "ws",
        root / "tmp",
        extra_args=[
            "--SandboxKernel.backend=bwrap",
            "--SandboxKernel.network=full",
            f"--SandboxKernel.shared_store_url={url}",
            f"--SandboxKernel.session_id={session}",
            f"--SandboxKernel.user_id={user_id}",
            *extra,
        ],
        env={"SANDBOX_KERNEL_DATA_DIR": str(root / "data")},
    )
