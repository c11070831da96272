"""The agent tools over the real engine (bwrap): notebook, sessions, shell, export."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from kernel_helpers import shell_output

from sandbox_kernel.tools import (
    CellState,
    SessionRegistry,
    ToolFatalError,
    ToolRetryError,
    ToolsConfig,
    WorkspacePathError,
    repl_clear_notebook,
    repl_delete_cell,
    repl_execute_cell,
    repl_export_ipynb,
    repl_rerun_cell,
    repl_show_cell,
    repl_show_notebook,
    resolve_agent_path,
    sandbox_execute,
)
from sandbox_kernel.tools.notebook import Notebook

pytestmark = pytest.mark.asyncio


#: a cell leaving a daemon in its sandbox that writes the sandbox's
#: interfaces to /workspace/ifaces every 20 ms
IFACE_RECORDER = (
    "import subprocess, sys\n"
    "d = subprocess.Popen([sys.executable, '-c', '''\n"
    "import os, socket, time\n"
    "while True:\n"
    "    open('/workspace/if.tmp', 'w').write(repr(sorted(n for _, n in socket.if_nameindex())))\n"
    "    os.replace('/workspace/if.tmp', '/workspace/ifaces')\n"
    "    time.sleep(0.02)\n"
    "'''], start_new_session=True)"
)


def ids(reg: SessionRegistry, session: str = "s1", user: str = "alice") -> dict:
    return {"user_id": user, "session_id": session, "registry": reg}


async def notebook(reg: SessionRegistry, session: str = "s1", user: str = "alice"):
    return (await reg.get(user, session)).notebook


async def test_state_outputs_and_persistence(registry: SessionRegistry, data_dir: Path) -> None:
    kw = ids(registry)
    r = await repl_execute_cell("x = 41\nprint('line1\\nline2')\nx + 1", **kw)
    assert "line1\nline2" in r.text and "42" in r.text and "COMPLETED" in r.text
    r = await repl_execute_cell("def f(a):\n    return a * x\nf(2)", **kw)
    assert "82" in r.text
    r = await repl_execute_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()", **kw)
    assert r.images and r.images[0][0] == "image/png" and "[image #1: image/png]" in r.text
    assert "iVBOR" not in r.text  # no base64 in the text
    r = await repl_execute_cell("from IPython.display import display, HTML\ndisplay(HTML('<b>bold</b>'))\n1/0", **kw)
    assert "ZeroDivisionError" in r.text and "ERROR" in r.text and "\x1b[" not in r.text
    nb = await notebook(registry)
    assert [c.state for c in nb.cells] == [CellState.COMPLETED] * 3 + [CellState.ERROR]
    assert [c.execution_count for c in nb.cells] == [1, 2, 3, 4]
    c0, c3 = nb.cells[0], nb.cells[3]
    assert c0.stdout == "line1\nline2\n" and c0.result == {"text/plain": "42"}
    assert c0.duration is not None and c0.started_at is not None
    assert c3.error.ename == "ZeroDivisionError" and c3.error.traceback
    assert any(o.output_type.value == "display_data" and "text/html" in (o.data or {}) for o in c3.outputs)
    saved = json.loads((data_dir / "sessions/alice/s1/notebook.json").read_text())
    assert saved["cells"][0]["code"].startswith("x = 41") and len(saved["cells"]) == 4
    # workspace layout
    assert (data_dir / "workspaces/alice/s1").is_dir()


async def test_a_second_process_on_the_same_session_is_refused(registry: SessionRegistry, data_dir: Path) -> None:
    """A review: two tool processes on one session (two MCP servers given the
    same ids) each rewrote the notebook whole and checkpointed into the same
    folder; one's cells and variables were lost. The first one holds the
    session now (a lock, as a kernel holds its state folder): the second gets
    a clear error, and the session once the first let it go. (A second
    registry in this process stands for the other process: the lock is one
    per open of the file.)"""
    await repl_execute_cell("kept = 'first'", **ids(registry))
    other = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600))
    try:
        with pytest.raises(ToolFatalError, match="in use by another process of the agent tools"):
            await repl_execute_cell("lost = True", **ids(other))
        await registry.aclose()
        r = await repl_execute_cell("print(kept)", **ids(other))
        assert "first" in r.text, r.text
        nb = await notebook(other)
        assert [c.code for c in nb.cells] == ["kept = 'first'", "print(kept)"]
    finally:
        await other.aclose()


async def test_a_call_cancelled_while_its_session_is_built_leaves_it_free(
    registry: SessionRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the thread building a session went on after its call was
    cancelled (an MCP client's cancel, a timeout), and the session it built
    held the session's lock, never registered: every later call on those
    ids was refused as "in use by another process"."""
    from sandbox_kernel.tools import notebook as notebook_module

    real_load = notebook_module.Notebook.load.__func__  # type: ignore[attr-defined]

    def slow_load(cls: type, *args: object, **kwargs: object) -> object:
        time.sleep(0.5)  # (a slow disk, a large notebook)
        return real_load(cls, *args, **kwargs)

    with monkeypatch.context() as slow:
        slow.setattr(notebook_module.Notebook, "load", classmethod(slow_load))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(registry.get("alice", "slow"), timeout=0.1)
        await asyncio.sleep(1.0)  # (the thread ended meanwhile)
    r = await repl_execute_cell("print('served')", **ids(registry, "slow"))
    assert "served" in r.text, r.text


async def test_rerun_delete_clear_show(registry: SessionRegistry, data_dir: Path) -> None:
    kw = ids(registry)
    await repl_execute_cell("n = 0", **kw)
    await repl_execute_cell("n += 1\nn", **kw)
    r = await repl_rerun_cell(1, **kw)
    assert "2" in r.text.splitlines()[-1]
    nb = await notebook(registry)
    assert nb.cells[1].execution_count == 3
    shown = await repl_show_notebook(**kw)
    assert "[0] (1) COMPLETED" in shown.text and "[1] (3) COMPLETED" in shown.text
    r = await repl_show_cell(1, **kw)
    assert "n += 1" in r.text
    r = await repl_delete_cell(0, **kw)
    assert "1 cell(s) left" in r.text
    assert len(json.loads((data_dir / "sessions/alice/s1/notebook.json").read_text())["cells"]) == 1
    r = await repl_clear_notebook(**kw)
    assert "1 cell(s) removed" in r.text
    assert "empty" in (await repl_show_notebook(**kw)).text
    r = await repl_execute_cell("n", **kw)  # variables survive clearing the notebook
    assert r.text.splitlines()[-1] == "2"


async def test_long_output_truncated_full_kept(registry: SessionRegistry) -> None:
    kw = ids(registry)
    r = await repl_execute_cell("print('\\n'.join(str(i) for i in range(20000)))", **kw)
    assert "characters truncated" in r.text and "repl_show_cell(0, full=True)" in r.text
    assert len(r.text) < 6000
    full = await repl_show_cell(0, full=True, **kw)
    assert "\n10000\n" in full.text and "19999" in full.text


async def test_timeout_keeps_state(registry: SessionRegistry) -> None:
    kw = ids(registry)
    await repl_execute_cell("keep = 'yes'", **kw)
    r = await repl_execute_cell("import time\nkeep = 'no'\ntime.sleep(30)", timeout=1, **kw)
    assert "TIMEOUT" in r.text and "timed out" in r.text
    assert (await notebook(registry)).cells[1].state == CellState.TIMEOUT
    r = await repl_execute_cell("keep", **kw)
    assert "'yes'" in r.text


async def test_max_cells(data_dir: Path) -> None:
    reg = SessionRegistry(ToolsConfig(backend="bwrap", max_cells=2))
    try:
        kw = ids(reg)
        await repl_execute_cell("1", **kw)
        await repl_execute_cell("2", **kw)
        with pytest.raises(ToolRetryError, match=r"notebook is full .2 cells"):
            await repl_execute_cell("3", **kw)
        assert len((await notebook(reg)).cells) == 2
    finally:
        await reg.aclose()


async def test_bad_inputs_of_every_tool(registry: SessionRegistry, data_dir: Path) -> None:
    kw = ids(registry)
    await repl_execute_cell("a = 1", **kw)
    await sandbox_execute("echo x > data.csv", **kw)
    cases = [
        (repl_execute_cell(123, **kw), "code must be a string"),
        # (Python's API takes a lone surrogate; the notebook then could not be saved again)
        (repl_execute_cell("x = 1  # \ud800", **kw), "code holds a lone surrogate .* at character 9"),
        (sandbox_execute("echo \udcff", **kw), "command holds a lone surrogate"),
        (repl_execute_cell("1", timeout=-1, **kw), "timeout must be between"),
        (repl_execute_cell("1", timeout="x", **kw), "timeout must be a number"),
        (repl_rerun_cell(5, **kw), "there is no cell 5"),
        (repl_rerun_cell("0", **kw), "cell number must be an integer"),
        (repl_show_cell(-1, **kw), "there is no cell -1"),
        (repl_delete_cell(7, **kw), "there is no cell 7"),
        (repl_export_ipynb("../../escape.ipynb", **kw), "climbs out of the workspace"),
        (repl_export_ipynb("/etc/x.ipynb", **kw), "outside the workspace"),
        (repl_export_ipynb("out.txt", **kw), "must end with .ipynb"),
        (repl_export_ipynb("", **kw), "path is empty"),
        (repl_export_ipynb("data.csv/out.ipynb", **kw), "path 'data.csv/out.ipynb' cannot be written: File exists"),
        (repl_export_ipynb("a" * 300 + ".ipynb", **kw), "cannot be written: File name too long"),
        # failed in the host's path resolution: an error naming no argument, giving the host path's length
        (repl_export_ipynb("\ud800.ipynb", **kw), r"path '\\ud800.ipynb' holds a lone surrogate .* at character 0"),
        # echoed in the success text (OSC 52: the transcript terminal's clipboard), and a host file named so
        (
            repl_export_ipynb("\x1b]52;c;cHduZWQ=\x07\x1b[2Jx.ipynb", **kw),
            r"holds the control character U\+001B \(ESCAPE\) at character 0",
        ),
        (
            repl_export_ipynb("invoice_\u202efdp.ipynb", **kw),
            r"holds the format character U\+202E \(RIGHT-TO-LEFT OVERRIDE\) at character 8",
        ),
        (sandbox_execute("", **kw), "command must be a non-empty string"),
        (sandbox_execute("ls", timeout=0, **kw), "timeout must be between"),
        (repl_show_notebook(user_id="../x", session_id="s1", registry=registry), "user_id '../x' is invalid"),
        (repl_clear_notebook(user_id="alice", session_id="a/b", registry=registry), "session_id 'a/b' is invalid"),
    ]
    for coro, message in cases:
        with pytest.raises(ToolRetryError, match=message):
            await coro
    # nothing stored was lost, and the notebook is still saved
    nb = await notebook(registry)
    assert len(nb.cells) == 1 and nb.cells[0].code == "a = 1"
    assert "2" in (await repl_execute_cell("print(a + 1)", **kw)).text
    # a long name that fits is written (its temporary name no longer repeats it)
    assert "Saved 2 cell(s)" in (await repl_export_ipynb("a" * 240 + ".ipynb", **kw)).text
    assert not (data_dir / "escape.ipynb").exists()
    assert sorted(p.name for p in (data_dir / "workspaces/alice/s1").iterdir()) == ["a" * 240 + ".ipynb", "data.csv"]


async def test_path_confinement(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside)
    (ws / "sub" / "up").symlink_to("../..")
    assert resolve_agent_path(ws, "/workspace/sub/a.ipynb") == (ws / "sub" / "a.ipynb").resolve()
    assert resolve_agent_path(ws, "./sub/../b.ipynb") == (ws / "b.ipynb").resolve()
    for bad, msg in [
        ("link/x.ipynb", "symlink"),
        ("sub/up/x", "symlink"),
        ("../x", "climbs out"),
        ("/tmp/x", "outside the workspace"),
        ("/workspace/../etc/passwd", "climbs out"),
        ("a\x00b", "NUL"),
        ("\udcff/x.ipynb", r"path '\\udcff/x.ipynb' holds a lone surrogate"),
        ("x\u2066.ipynb", r"format character U\+2066 \(LEFT-TO-RIGHT ISOLATE\) at character 1"),
        ("a\nb.ipynb", r"control character U\+000A \(LINE FEED\)"),
        ("a\x85b", r"control character U\+0085 at character 1"),
        ("a\u2028b", r"line separator character U\+2028"),
    ]:
        with pytest.raises(WorkspacePathError, match=msg):
            resolve_agent_path(ws, bad)


async def test_corrupt_notebook_reported_not_replaced(registry: SessionRegistry, data_dir: Path) -> None:
    path = data_dir / "sessions/alice/broken/notebook.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ToolFatalError, match=r"^\[FATAL\].*notebook file .* is corrupt"):
        await repl_execute_cell("1", **ids(registry, "broken"))
    with pytest.raises(ToolFatalError, match="corrupt"):
        await repl_show_notebook(**ids(registry, "broken"))
    assert path.read_text() == "{not json"


async def test_sandbox_execute_shares_workspace_and_is_confined(registry: SessionRegistry, data_dir: Path) -> None:
    kw = ids(registry)
    await repl_execute_cell("open('/workspace/from_cell.txt', 'w').write('hello')", **kw)
    r = await sandbox_execute("cat from_cell.txt; pwd; echo out >&2; exit 3", **kw)
    assert r.text.startswith("Exit code: 3") and "hello" in r.text and "/workspace" in r.text and "out" in r.text
    r = await sandbox_execute(f"ls {data_dir} 2>&1; ls /workspaces 2>&1; echo $HOME", **kw)
    assert "No such file" in r.text
    r = await sandbox_execute("sleep 20", timeout=1, **kw)
    assert "timed out" in r.text


async def test_concurrent_sessions_are_isolated(registry: SessionRegistry, data_dir: Path) -> None:
    a, b = ids(registry, "sa"), ids(registry, "sb")
    await asyncio.gather(
        repl_execute_cell("secret = 'A'\nopen('a.txt', 'w').write('A')", **a),
        repl_execute_cell("secret = 'B'\nopen('b.txt', 'w').write('B')", **b),
    )
    ra, rb = await asyncio.gather(repl_execute_cell("secret", **a), repl_execute_cell("secret", **b))
    assert "'A'" in ra.text and "'B'" in rb.text
    ra = await sandbox_execute("ls; cat ../sb/b.txt 2>&1", **a)
    assert "a.txt" in ra.text and "b.txt" not in ra.text.split("\n")[1]
    rb = await repl_execute_cell("import os\nsorted(os.listdir('/workspace'))", **b)
    assert "['b.txt']" in rb.text
    assert len((await notebook(registry, "sa")).cells) == 2 and len((await notebook(registry, "sb")).cells) == 3


async def test_event_loop_not_blocked(registry: SessionRegistry) -> None:
    kw = ids(registry)
    await repl_execute_cell("1", **kw)  # sandbox started
    lags: list[float] = []

    async def probe() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - t - 0.01)

    task = asyncio.create_task(probe())
    t0 = time.monotonic()
    shell = asyncio.create_task(sandbox_execute("sleep 2; echo shell-done", **ids(registry, "other")))
    r = await repl_execute_cell("import time\ntime.sleep(5)\nprint('done')", **kw)
    assert "done" in (await shell).text
    task.cancel()
    elapsed = time.monotonic() - t0
    assert "done" in r.text and elapsed >= 5
    assert len(lags) > 200, len(lags)
    assert max(lags) < 0.25, max(lags)


async def test_a_cancelled_cell_is_stopped_before_the_next_one_runs(registry: SessionRegistry) -> None:
    """An MCP client cancels a running repl_execute_cell (notifications/cancelled
    cancels the handler's task). The cell ran on in the sandbox: the next call
    got its output, hung until its own timeout, and the sandbox was replaced
    (state without a checkpoint lost). Found by an attack review."""
    kw = ids(registry, "cancel")
    # a file in the sandbox's own /tmp: gone if the sandbox is replaced
    await repl_execute_cell("a = 41\nopen('/tmp/same-sandbox', 'w').write('yes')", **kw)
    long = "import time\nfor i in range(60):\n    time.sleep(0.5)\nprint('the cancelled cell ended')"
    task = asyncio.create_task(repl_execute_cell(long, timeout=120, **kw))
    await asyncio.sleep(2.0)  # running in the sandbox
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await repl_execute_cell("print(a + 1, open('/tmp/same-sandbox').read())", timeout=20, **kw)
    assert "42 yes" in r.text and "cancelled cell ended" not in r.text, r.text
    assert "COMPLETED" in r.text.splitlines()[0], r.text


async def test_calls_on_one_session_are_serialised(registry: SessionRegistry) -> None:
    kw = ids(registry)
    await repl_execute_cell("log = []", **kw)
    await asyncio.gather(
        *(repl_execute_cell(f"import time\nlog.append({i}); time.sleep(0.2); log.append({i})", **kw) for i in range(3))
    )
    r = await repl_execute_cell("all(log[i] == log[i + 1] for i in range(0, len(log), 2)), len(log)", **kw)
    assert "(True, 6)" in r.text


async def test_idle_expiry_and_resume(data_dir: Path) -> None:
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600))
    try:
        kw = ids(reg)
        await repl_execute_cell("import math\nvalue = 21\ndef double(v):\n    return 2 * v", **kw)
        engine = (await reg.get("alice", "s1")).engine
        expired = await reg.expire_idle(0)
        assert expired == [("alice", "s1")] and not reg.live()
        assert engine.worker is None
        r = await repl_execute_cell("double(value), math.floor(2.5)", **kw)
        assert "(42, 2)" in r.text and "restored" in r.text
        shown = await repl_show_notebook(**kw)
        assert "[1] (2) COMPLETED" in shown.text
    finally:
        await reg.aclose()
    # a brand-new registry (a new process) resumes the same session
    reg2 = SessionRegistry(ToolsConfig(backend="bwrap"))
    try:
        r = await repl_execute_cell("double(value)", **ids(reg2))
        assert "42" in r.text.splitlines()[-1]
        assert len((await notebook(reg2)).cells) == 3
    finally:
        await reg2.aclose()


async def test_resume_without_checkpoint_replays_definitions(data_dir: Path) -> None:
    """The process died before the session's first checkpoint: a new process
    still brings back imports and definitions (the notebook keeps the replay
    log) and says that variables were lost."""
    reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600))
    try:
        kw = ids(reg, "crash")
        await repl_execute_cell("import math\nvalue = 21\ndef double(v):\n    return 2 * v", **kw)
        session = await reg.get("alice", "crash")
        await session.engine.shutdown()  # no checkpoint taken, like a killed process
        session.engine = None
    finally:
        await reg.aclose()
    for leftover in (data_dir / "sessions/alice/crash/state").glob("checkpoint*"):
        leftover.unlink()
    reg2 = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600))
    try:
        r = await repl_execute_cell("double(math.floor(2.5))", **ids(reg2, "crash"))
        assert r.text.rstrip().endswith("4") and "COMPLETED" in r.text, r.text
        assert "imports and definitions were replayed, variables were not restored" in r.text
        r = await repl_execute_cell("value", **ids(reg2, "crash"))
        assert "NameError" in r.text
    finally:
        await reg2.aclose()


async def test_ratchet_rise_gives_system_notice_and_cuts_shell_network(
    registry: SessionRegistry, data_dir: Path
) -> None:
    kw = ids(registry, "priv")
    r = await sandbox_execute("cat /proc/net/dev | tail -n +3 | cut -d: -f1", **kw)
    public_ifaces = set(r.text.split()[3:])
    r = await repl_execute_cell("import sandbox_kernel.private as p\np.add_dataset('payroll', 'SECRET')", **kw)
    assert r.text.startswith("[SYSTEM] Network access has been restricted")
    r = await repl_execute_cell("x = 1", **kw)
    assert not r.text.startswith("[SYSTEM]")  # only on the call during which it rose
    r = await sandbox_execute("cat /proc/net/dev | tail -n +3 | cut -d: -f1", **kw)
    assert set(shell_output(r.text).split()) == {"lo"}, (public_ifaces, r.text)
    nb = await notebook(registry, "priv")
    assert nb.cells[0].privacy_raised == {"from": "PUBLIC", "to": "SECRET", "datasets": ["payroll"]}
    assert "privacy" in (await repl_show_cell(0, **kw)).text


def _ifaces(text: str) -> list[str]:
    return next(line.split()[1:] for line in text.splitlines() if line.startswith("IFACES"))


async def test_shell_network_follows_the_config_and_the_ratchet(data_dir: Path) -> None:
    """``ToolsConfig.network``: "user" (default) cannot reach a service on the
    host's 127.0.0.1, "host" (the explicit opt-in) can; once private, neither
    has any network."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    probe = (
        f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('reached')\"; "
        "echo; echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1)"
    )
    try:
        for network, reaches in (("user", False), ("host", True)):
            reg = SessionRegistry(ToolsConfig(backend="bwrap", idle_timeout=600, network=network))
            try:
                kw = ids(reg, f"net-{network}")
                r = await sandbox_execute(probe, **kw)
                assert ("reached" in r.text) is reaches, (network, r.text)
                assert set(_ifaces(r.text)) - {"lo"}, r.text  # an interface besides lo
                await repl_execute_cell(
                    "import sandbox_kernel.private as p\np.mark_private('CONFIDENTIAL', 'test')", **kw
                )
                r = await sandbox_execute(probe, **kw)
                assert "reached" not in r.text, (network, r.text)
                assert _ifaces(r.text) == ["lo"], r.text
            finally:
                await reg.aclose()
    finally:
        listener.close()


async def test_export_ipynb(registry: SessionRegistry, data_dir: Path) -> None:
    kw = ids(registry, "exp")
    await repl_execute_cell("print('a\\nb')\n'x\\ny'", **kw)
    await repl_execute_cell("import matplotlib.pyplot as plt\nplt.plot([1]); plt.show()", **kw)
    await repl_execute_cell("for i in range(2):\n    print(i)\nraise ValueError('bad')", **kw)
    await repl_execute_cell("import sandbox_kernel.private as p\np.add_dataset('hr', 'CONFIDENTIAL')", **kw)
    r = await repl_export_ipynb("/workspace/out/analysis.ipynb", **kw)
    assert "Saved 4 cell(s) to /workspace/out/analysis.ipynb" in r.text
    path = data_dir / "workspaces/alice/exp/out/analysis.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "sandbox-python"
    assert nb.metadata.language_info.name == "python" and nb.metadata.language_info.version.count(".") == 2
    assert nb.cells[2].source == "for i in range(2):\n    print(i)\nraise ValueError('bad')"
    assert nb.cells[0].outputs[0].output_type == "stream" and nb.cells[0].outputs[0].text == "a\nb\n"
    assert (
        nb.cells[0].outputs[1].output_type == "execute_result"
        and nb.cells[0].outputs[1].data["text/plain"] == "'x\\ny'"
    )
    assert nb.cells[1].outputs[0].output_type == "display_data" and "image/png" in nb.cells[1].outputs[0].data
    err = nb.cells[2].outputs[-1]
    assert err.output_type == "error" and err.ename == "ValueError" and err.evalue == "bad"
    privacy = nb.metadata.sandbox_kernel.privacy
    assert privacy["level"] == "CONFIDENTIAL" and [d["name"] for d in privacy["datasets"]] == ["hr"]
    assert privacy["raised_by"][0]["cell_id"] == nb.cells[3].id and privacy["raised_by"][0]["to"] == "CONFIDENTIAL"


async def test_idle_agent_session_is_cut_without_a_tool_call(registry: SessionRegistry, data_dir: Path) -> None:
    """A connector raises an agent session from host Python while the agent is
    idle: its sandbox (and a daemon it left running) loses the network within
    the poll interval, and ``wait=True`` returns only once that is done."""
    from sandbox_kernel.privacy import PrivacyStore, PrivateData

    registry.config.network = "user"  # FULL mode: the cut kills the user-mode network (PROXIED: test_proxied_kernel.py)
    kw = ids(registry, "idle")
    r = await repl_execute_cell(
        IFACE_RECORDER,
        **kw,
    )
    session = await registry.get("alice", "idle")
    ifaces = session.workspace / "ifaces"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ifaces.exists():
        await asyncio.sleep(0.05)
    assert ifaces.read_text() != "['lo']", r.text
    store = PrivacyStore(data_dir / "privacy")
    await asyncio.to_thread(PrivateData("alice", "idle", store).add_private_dataset, "crm", "SECRET", "connector", True)
    await asyncio.sleep(0.1)  # the daemon writes every 20 ms
    assert ifaces.read_text() == "['lo']", "wait=True returned while the idle agent sandbox had network"


@pytest.mark.parametrize("how", ["expiry", "close"])
async def test_a_session_being_suspended_is_still_cut(registry: SessionRegistry, data_dir: Path, how: str) -> None:
    """An idle session's expiry (and the registry's close) takes it out of
    the registry, then checkpoints it, for as long as a cell's ``__reduce__``
    makes that last (up to 120 s). The watcher looked only at the registry:
    a rise meanwhile left the sandbox, and a daemon in it, with network for
    all of that time (40 s in the review), and ``wait=True`` timed out."""
    from sandbox_kernel.privacy import PrivacyStore, PrivateData

    registry.config.network = "user"
    kw = ids(registry, how)
    r = await repl_execute_cell(
        IFACE_RECORDER + "\nimport time\n"
        "class Slow:\n"
        "    def __reduce__(self):\n"
        "        time.sleep(15)\n"
        "        return (int, ())\n"
        "slow = Slow()",
        **kw,
    )
    session = await registry.get("alice", how)
    ifaces = session.workspace / "ifaces"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ifaces.exists():
        await asyncio.sleep(0.05)
    assert ifaces.read_text() != "['lo']", r.text
    ending = asyncio.ensure_future(registry.expire_idle(0) if how == "expiry" else registry.aclose())
    while session.suspending is None:  # out of the registry, checkpointing
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    store = PrivacyStore(data_dir / "privacy")
    started = time.monotonic()
    await asyncio.to_thread(PrivateData("alice", how, store).add_private_dataset, "crm", "SECRET", "connector", 10.0)
    took = time.monotonic() - started
    await asyncio.sleep(0.1)  # the daemon writes every 20 ms
    assert ifaces.read_text() == "['lo']", "the sandbox being suspended kept its network"
    assert took < 5, took
    await ending


#: a cell whose object makes every checkpoint of its session last 4 s (a
#: cell's ``__reduce__`` decides how long a suspension takes)
SLOW_CHECKPOINT = (
    "import time\n"
    "class Slow:\n"
    "    def __reduce__(self):\n"
    "        time.sleep(4)\n"
    "        return (int, (7,))\n"
    "slow = Slow()\n"
    "b = [1, 2, 3]"
)


async def suspension_begun(session) -> None:
    """Wait until ``session`` is out of its registry, checkpointing its engine."""
    deadline = time.monotonic() + 30
    while session.suspending is None:
        assert time.monotonic() < deadline, "the session was never suspended"
        await asyncio.sleep(0.02)


async def test_a_call_during_an_idle_expiry_waits_for_it(registry: SessionRegistry) -> None:
    """An idle session's expiry took it out of the registry, then checkpointed
    it (4 s here: its ``slow`` pickles slowly). A call arriving meanwhile built
    a second session of the same ids, resumed from the checkpoint then on disk
    (one holding ``a`` alone: ``b``, ``c`` and ``slow`` were gone), and its
    next checkpoint superseded the one the expiry finished: lost for good
    (attack review, expiry_race.py). The call now waits for the suspension."""
    kw = ids(registry, "race")
    await repl_execute_cell("a = 1", **kw)
    await registry.expire_idle(0)  # the checkpoint on disk holds ``a`` alone
    await repl_execute_cell(SLOW_CHECKPOINT, **kw)
    await repl_execute_cell("c = 'kept'", **kw)
    session = await registry.get("alice", "race")
    expiring = asyncio.ensure_future(registry.expire_idle(0))
    await suspension_begun(session)
    r = await repl_execute_cell("print(a, b, c, slow)", **kw)
    assert "1 [1, 2, 3] kept 7" in r.text, r.text
    assert await expiring == [("alice", "race")]
    assert [s.key for s in registry.live()] == [("alice", "race")] and registry.live()[0] is not session
    # and it stays: suspended again, resumed again
    await registry.expire_idle(0)
    r = await repl_execute_cell("print(a, b, c, slow)", **kw)
    assert "1 [1, 2, 3] kept 7" in r.text, r.text


async def test_a_call_during_the_close_is_refused_and_loses_nothing(registry: SessionRegistry) -> None:
    """The registry's close empties it, then suspends every session: a call
    arriving meanwhile built a new session (resumed from an older checkpoint)
    that the close never stopped. It is now refused with a clear error, and
    the registry, closed, serves the whole state again."""
    kw = ids(registry, "closing")
    await repl_execute_cell("a = 1", **kw)
    await registry.expire_idle(0)
    await repl_execute_cell(SLOW_CHECKPOINT, **kw)
    await repl_execute_cell("c = 'kept'", **kw)
    session = await registry.get("alice", "closing")
    closing = asyncio.ensure_future(registry.aclose())
    await suspension_begun(session)
    with pytest.raises(ToolFatalError, match=r"shutting down .* on session alice/closing was not run"):
        await repl_execute_cell("lost = True", **kw)
    await closing
    assert not registry.live() and session.engine is None
    r = await repl_execute_cell("print(a, b, c, slow)", **kw)
    assert "1 [1, 2, 3] kept 7" in r.text, r.text
    assert "lost" not in (await repl_show_notebook(**kw)).text


async def test_an_export_of_a_private_session_is_cleaned_as_private(registry: SessionRegistry, data_dir: Path) -> None:
    """Outputs were cleaned as the session was when they came: a remote
    image a cell showed while public stayed in the export of the session
    made private, and a Lab without our page policy fetched it when the
    file was opened (an attack review). Exported once private, they are
    cleaned as private outputs are."""
    import json

    kw = ids(registry, "export")
    r = await repl_execute_cell(
        "from IPython.display import HTML, Markdown, display\n"
        "display(HTML('<img src=\"https://tracker.example/open.png\"> <b>kept</b>'))\n"
        "display(Markdown('![t](https://tracker.example/md.png) text'))\n"
        "print('see https://tracker.example/printed')",
        **kw,
    )
    public = (await repl_export_ipynb("public.ipynb", **kw)).text
    session = await registry.get("alice", "export")
    assert "tracker.example/open.png" in (session.workspace / "public.ipynb").read_text(), public  # public: kept
    await repl_execute_cell("import sandbox_kernel.private as p\np.add_dataset('crm', 'SECRET')", **kw)
    await repl_export_ipynb("private.ipynb", **kw)
    nb = json.loads((session.workspace / "private.ipynb").read_text())
    assert nb["metadata"]["sandbox_kernel"]["privacy"]["level"] == "SECRET"
    text = json.dumps([cell["outputs"] for cell in nb["cells"]])  # the code keeps its text, as written
    assert "tracker.example/open.png" not in text and "tracker.example/md.png" not in text, text[:2000]
    assert "https://tracker.example/printed" not in text  # text is defanged as a private session's is
    assert "<b>kept</b>" in text and "text" in text, r.text


async def test_a_flood_of_tiny_outputs_costs_the_agent_little(registry: SessionRegistry, data_dir: Path) -> None:
    """The budget counts bytes, and the agent's notebook keeps each output as
    an object, joins stream text by copying it, and looked through every
    output at each display update: 400,000 one-character outputs held 210 MiB
    and stalled the loop (the privacy watcher's too) at each later save
    (an attack review). A cell keeps at most MAX_OUTPUT_EVENTS outputs."""
    kw = ids(registry, "flood")
    r = await repl_execute_cell(
        "import sys\n"
        "from IPython.display import display, update_display\n"
        "for i in range(30_000):\n"
        "    display(i, display_id=f'd{i % 50}')\n"
        "    update_display(-i, display_id=f'd{i % 50}')\n"
        "    (sys.stdout if i % 2 else sys.stderr).write('x')\n"
        "    sys.stdout.flush(); sys.stderr.flush()",
        **kw,
    )
    cell = (await notebook(registry, "flood")).cells[-1]
    assert len(cell.outputs) <= 20_000 + 1, len(cell.outputs)  # tools/notebook.py: MAX_OUTPUT_EVENTS
    assert any("the rest of this cell's are dropped" in (o.text or "") for o in cell.outputs), r.text[-500:]
    updated = [o for o in cell.outputs if o.display_id == "d49"]
    assert updated and all(o.data and o.data.get("text/plain", "").startswith("-") for o in updated)
    assert "2" in (await repl_execute_cell("1 + 1", **kw)).text


def held_bytes(root: object) -> int:
    """The bytes of every object reachable from ``root`` (each counted once)."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


async def test_json_outputs_are_kept_as_text(registry: SessionRegistry, data_dir: Path) -> None:
    """A JSON output parsed is an object per value: a cell's ``[[], [], ...]``
    displays within the 10 MB output budget held some hundreds of MB of the
    agent's process (an attack review). The notebook keeps them as text, and
    gives them back whole to the notebook file, an export and ``result``."""
    kw = ids(registry, "json")
    r = await repl_execute_cell(
        "from IPython.display import display\n"
        "for i in range(5):\n"
        "    display({'application/json': [[]] * 300_000, 'text/plain': 'j'}, raw=True,\n"
        "            metadata={'application/json': {'sk_tag': [i]}})\n"
        "{'a': [1, {'b': None}]}",
        **kw,
    )
    nb = await notebook(registry, "json")
    cell = nb.cells[-1]
    shown = [o for o in cell.outputs if o.output_type.value == "display_data"]
    assert len(shown) == 5, r.text[-500:]
    held = held_bytes(cell.outputs) / (1 << 20)
    assert held < 30, f"the cell's outputs hold {held:.0f} MiB"  # 1.5 million values: about 100 MiB parsed
    assert cell.result == {"text/plain": "{'a': [1, {'b': None}]}"}
    # the notebook file and an export give the values back as JSON
    stored = json.loads(nb.path.read_text())["cells"][-1]["outputs"][0]
    assert json.loads(stored["data_json"]["application/json"]) == [[]] * 300_000
    await repl_export_ipynb("/workspace/json.ipynb", **kw)
    exported = nbformat.read(data_dir / "workspaces/alice/json/json.ipynb", as_version=4).cells[-1].outputs
    assert exported[4]["data"]["application/json"] == [[]] * 300_000
    assert exported[4]["metadata"] == {"application/json": {"sk_tag": [4]}}
    assert exported[5]["data"]["text/plain"] == "{'a': [1, {'b': None}]}"
    # and a tool server started again reads them back as text
    reloaded = Notebook.load("alice", "json", nb.path)
    assert held_bytes(reloaded.cells[-1].outputs) / (1 << 20) < 30
    assert reloaded.to_nbformat().cells[-1].outputs[0]["data"]["application/json"] == [[]] * 300_000
