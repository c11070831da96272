"""Stores of OTHER host processes are out of every sandbox's reach.

A kernel (or the agent tools) may keep its ratchet store outside the default
data dir (``--SandboxKernel.privacy_dir``, ``data_dir``, ``ToolsConfig.data_dir``).
Another kernel, with the default configuration, whose workspace contains that
folder knew nothing of it: its cells could read the other session's records and
delete its high-water markers, and the other session came back PUBLIC (with
network) at its next start. Every host process now records the stores it uses
outside the default data dir in a registry there (hidden from every sandbox),
and every sandbox start hides each registered store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap, shared_data_kernel

from sandbox_kernel.privacy import PrivacyStore, Sensitivity

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"

#: B's cell: for each target folder, list it, read, delete and plant files in
#: it, and move it away (the way to put an empty store in its place)
ATTACK = """
import json, os
report = {{}}
for base in {targets!r}:
    got = report[base] = {{"read": [], "deleted": [], "listing": None, "wrote": None, "moved": None}}
    try:
        got["listing"] = sorted(os.listdir(base))
    except OSError as exc:
        got["listing"] = type(exc).__name__
    for folder, dirs, files in os.walk(base, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as fh:
                    fh.read()
                got["read"].append(path)
            except OSError:
                pass
            try:
                os.unlink(path)
                got["deleted"].append(path)
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(folder, name))
                got["deleted"].append(os.path.join(folder, name))
            except OSError:
                pass
    try:
        os.makedirs(base + "/alice", exist_ok=True)
        open(base + "/alice/planted.json", "w").close()
        got["wrote"] = True
    except OSError as exc:
        got["wrote"] = type(exc).__name__
    try:
        os.rename(base, base + ".moved")
        got["moved"] = True
    except OSError as exc:
        got["moved"] = type(exc).__name__
print(json.dumps(report))
"""


#: B's sandbox with its kernel's file access. A kernel started by a user gives
#: its sandbox that user's access to the user's files (bwrap maps the uid);
#: started as root (these tests' CI), it would run as nobody, and the 0700
#: store folders alone would keep most of the attack out: sandbox_uid=0 puts
#: B where a normal user's kernel is.
AS_THE_USER = ("--SandboxKernel.sandbox_uid=0",) if os.geteuid() == 0 else ()


def _attack(kernel: SandboxKernelHandle, targets: list[str]) -> dict | str:
    """What B's cell could do to each target, or the error that kept B's cells
    from running at all (a workspace refused)."""
    run = kernel.run(ATTACK.format(targets=targets))
    if run.status != "ok":
        return f"{run.errors[0]['ename']}: {run.errors[0]['evalue']}"
    return json.loads(run.stdout)


def _files(folder: Path) -> dict[Path, bytes | None]:
    """Every path below ``folder``, with the content of the files."""
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def _assert_out_of_reach(report: dict | str, before: dict[Path, bytes | None], folder: Path) -> None:
    if isinstance(report, str):  # refused: nothing of B ran
        assert report.startswith("SandboxUnavailable: workspace refused"), report
    else:
        for base, got in report.items():
            assert got["listing"] in ([], "FileNotFoundError", "PermissionError"), (base, got)
            assert got["read"] == [] and got["deleted"] == [], (base, got)
            assert got["wrote"] is not True and got["moved"] is not True, (base, got)
    after = _files(folder)
    assert {p: after.get(p) for p in before} == before, "a file of the store changed on the host"
    assert not [p for p in after if p.name == "planted.json"]


@pytest.mark.parametrize("where", ["a-store", "team/a-store"])
def test_a_configured_privacy_dir_in_another_kernels_workspace(tmp_path: Path, where: str) -> None:
    """Kernel A keeps its store at ``where`` in kernel B's workspace. Directly in
    it, B's cells find the store's folders empty and can change nothing; one
    level deeper, B's workspace is refused (a sandbox could rename ``team`` and
    put an empty store in its place). Either way A, restarted, is still private."""
    shared = tmp_path / "shared-data"
    b_ws = tmp_path / "b-ws"
    store = b_ws / where
    a_args = (f"--SandboxKernel.privacy_dir={store}", "--SandboxKernel.user_id=alice", "--SandboxKernel.session_id=a1")
    a = shared_data_kernel(tmp_path / "a-ws", tmp_path / "a-tmp", shared, *a_args)
    try:
        run = a.run("%private payroll CONFIDENTIAL")
        assert a.run(IFACES).stdout.strip() == "['lo']", (run.stderr, run.errors)
    finally:
        a.shutdown()
    assert PrivacyStore(store).highwater("alice", "a1") == Sensitivity.CONFIDENTIAL
    before = _files(b_ws)

    b = shared_data_kernel(b_ws, tmp_path / "b-tmp", shared, "--SandboxKernel.session_id=b1", *AS_THE_USER)
    try:
        top = where.split("/")[0]
        names = ["a-store", "a-store-highwater", "a-store-enforced", "workspace-levels", "workspace-levels-highwater"]
        inside = "/workspace/" + where.rpartition("/")[0]
        targets = [f"{inside.rstrip('/')}/{name}" for name in names] + [f"/workspace/{top}"]
        report = _attack(b, list(dict.fromkeys(targets)))
    finally:
        b.shutdown()
    _assert_out_of_reach(report, before, b_ws)

    a = shared_data_kernel(tmp_path / "a-ws", tmp_path / "a-tmp", shared, *a_args)
    try:
        assert a.run(IFACES).stdout.strip() == "['lo']"
        run = a.run("import sandbox_kernel.private as p\nprint(p.mark_private('INTERNAL'))")
        assert run.stdout.strip() == "CONFIDENTIAL", (run.stdout, run.stderr, run.errors)
    finally:
        a.shutdown()


@pytest.mark.asyncio
async def test_the_agent_tools_data_dir_in_a_kernels_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent tools keep their data (store, notebooks, agent workspaces) in
    ``agents/`` of a kernel's workspace; the kernel's cells reach none of it, and
    the agent session read by a fresh process is still private."""
    from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell

    require_bwrap()
    shared = tmp_path / "shared-data"
    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(shared))
    b_ws = tmp_path / "b-ws"
    agents = b_ws / "agents"
    reg = SessionRegistry(ToolsConfig(backend="bwrap", data_dir=agents, idle_timeout=600))
    try:
        r = await repl_execute_cell(
            "import sandbox_kernel.private as p\np.mark_private('SECRET', 'test')",
            user_id="alice",
            session_id="agent1",
            registry=reg,
        )
        assert "SECRET" in r.text or "restricted" in r.text, r.text
    finally:
        await reg.aclose()
    before = _files(agents)
    assert any(p.name == "agent1@SECRET" for p in before)

    b = shared_data_kernel(b_ws, tmp_path / "b-tmp", shared, "--SandboxKernel.session_id=b1", *AS_THE_USER)
    try:
        report = _attack(b, ["/workspace/agents"])
    finally:
        b.shutdown()
    _assert_out_of_reach(report, before, agents)

    code = (
        "import sys; from sandbox_kernel.privacy import PrivacyStore; "
        "print(PrivacyStore(sys.argv[1]).read('alice', 'agent1').sensitivity.name)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(agents / "privacy")], capture_output=True, text=True)
    assert out.stdout.strip() == "SECRET", out.stderr
