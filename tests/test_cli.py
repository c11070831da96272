"""The command line: its own help listing every command, and ``doctor``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).parent / "sandbox-kernel")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, env=env)


def test_help_lists_every_command() -> None:
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    for command in ("install", "mcp", "gc", "doctor", "export", "trust", "store-init", "-f CONNECTION_FILE"):
        assert command in out.stdout, out.stdout
    assert "IPython" not in out.stdout and "enhanced interactive Python shell" not in out.stdout
    assert _run().stdout == out.stdout  # no arguments: the same help, not a kernel waiting for a connection file


def test_doctor_reports_each_check_and_succeeds_here() -> None:
    out = _run("doctor", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    for name in (
        "bubblewrap",
        "seccomp filter",
        "whole-sandbox caps (cgroups)",
        "kernelspec",
        "ratchet store",
        "other ratchet stores",
        "Docker backend",
    ):
        assert name in checks, checks.keys()
    assert checks["bubblewrap"]["status"] == "ok", checks["bubblewrap"]
    assert checks["kernelspec"]["status"] == "ok", checks["kernelspec"]
    assert checks["completion cache"]["status"] == "ok", checks["completion cache"]  # made by `install`
    text = _run("doctor")
    assert "can start sandboxes here" in text.stdout, text.stdout


def test_doctor_fails_and_names_the_fix_without_bwrap(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no /usr/bin: no bwrap, no pasta
    out = _run("doctor", env=env)
    assert out.returncode == 1, out.stdout
    assert "[FAIL] bubblewrap: bwrap is not installed" in out.stdout, out.stdout
    assert "apt-get install bubblewrap" in out.stdout
    assert "apt-get install passt" in out.stdout
    assert "CANNOT start sandboxes here" in out.stdout


def test_doctor_lists_the_stores_outside_the_data_dir(tmp_path: Path) -> None:
    """Every store the sandboxes hide besides the data dir, those that are gone,
    and a bad registry entry with the folder to fix it in."""
    data = tmp_path / "data"
    env = {**os.environ, "SANDBOX_KERNEL_DATA_DIR": str(data)}
    code = (
        "import sys; from sandbox_kernel.privacy import PrivacyStore; "
        "[PrivacyStore(p).prepare('alice', 's1') for p in sys.argv[1:]]"
    )
    live, gone = tmp_path / "ws" / "a-store", tmp_path / "old" / "privacy"
    subprocess.run([sys.executable, "-c", code, str(live), str(gone)], env=env, check=True)
    subprocess.run(["rm", "-r", str(tmp_path / "old")], check=True)
    (data / "stores" / "bad").write_text("not/absolute\n")
    out = _run("doctor", "--json", env=env)
    check = {c["name"]: c for c in json.loads(out.stdout)}["other ratchet stores"]
    assert check["status"] == "warning", check
    assert f"hidden from every sandbox: {live}" in check["detail"], check
    assert f"1 gone (their entries are skipped): {gone}" in check["detail"], check
    assert str(data / "stores" / "bad") in check["detail"] and str(data / "stores") in check["fix"], check
