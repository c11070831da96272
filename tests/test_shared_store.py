"""The ratchet shared through PostgreSQL (issue 14, part 1), against a real server.

Two stores with different local roots stand for two hosts. The database keeps
the ratchet by itself (lowering, renaming, deleting and truncating are refused
by its triggers, whoever connects); concurrent writers lose nothing; a database
that goes away makes sessions SECRET, and they stay so when it comes back.
Kernels on two "hosts" (separate data dirs) share one session's level.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap, status_of
from pg_helpers import PostgresServer, shared_store_kernel

psycopg = pytest.importorskip("psycopg")

from sandbox_kernel.privacy import PrivateData, Sensitivity  # noqa: E402
from sandbox_kernel.privacy.postgres import PostgresPrivacyStore, redact  # noqa: E402

IFACES = "import socket; print([n for _, n in socket.if_nameindex()])"


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()


def store(tmp_path: Path, name: str, url: str) -> PostgresPrivacyStore:
    return PostgresPrivacyStore(tmp_path / name, url)


def test_a_rise_on_one_host_is_seen_on_another(pg: PostgresServer, tmp_path: Path) -> None:
    a, b = store(tmp_path, "host-a", pg.url), store(tmp_path, "host-b", pg.url)
    PrivateData("ann", "nb1", a).add_private_dataset("payroll", "SECRET")
    seen = PrivateData("ann", "nb1", b)
    assert seen.sensitivity == Sensitivity.SECRET and [d.name for d in seen.datasets] == ["payroll"]
    assert PrivateData("ann", "other", b).sensitivity == Sensitivity.PUBLIC  # sessions stay apart
    PrivateData("ann", "nb1", b).add_private_dataset("payroll", "INTERNAL")  # lower: the higher level stays
    assert PrivateData("ann", "nb1", a).sensitivity == Sensitivity.SECRET
    PrivateData("ann", "nb1", b).mark_private("SECRET", reason="by hand")
    assert PrivateData("ann", "nb1", a).state.mark is not None


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE sandbox_kernel_datasets SET level = 1",
        "UPDATE sandbox_kernel_datasets SET name = 'renamed'",
        "UPDATE sandbox_kernel_datasets SET session_id = 'elsewhere'",
        "DELETE FROM sandbox_kernel_datasets",
        "TRUNCATE sandbox_kernel_datasets",
        "UPDATE sandbox_kernel_marks SET level = 1",
        "DELETE FROM sandbox_kernel_marks",
        "TRUNCATE sandbox_kernel_marks",
    ],
)
def test_the_database_refuses_to_lower(pg: PostgresServer, tmp_path: Path, statement: str) -> None:
    s = store(tmp_path, "host", pg.url)
    PrivateData("bob", "nb-sql", s).add_private_dataset("rows", "CONFIDENTIAL")
    PrivateData("bob", "nb-sql", s).mark_private("CONFIDENTIAL", reason="r")
    # (the triggers refuse even the tables' owner, here a superuser, who
    # could also switch them off: kernels' role owns nothing, see below)
    with (
        psycopg.connect(pg.admin_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.RaiseException, match="never goes down"),
    ):
        conn.execute(statement)
    assert PrivateData("bob", "nb-sql", store(tmp_path, "other-host", pg.url)).sensitivity == Sensitivity.CONFIDENTIAL


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE sandbox_kernel_datasets DISABLE TRIGGER USER",
        "DROP TRIGGER sandbox_kernel_marks_only_up ON sandbox_kernel_marks",
        "CREATE OR REPLACE FUNCTION sandbox_kernel_only_up() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN RETURN NEW; END $$",
        "DELETE FROM sandbox_kernel_datasets",
        "TRUNCATE sandbox_kernel_marks",
    ],
)
def test_the_kernels_role_cannot_switch_the_ratchet_off(pg: PostgresServer, tmp_path: Path, statement: str) -> None:
    """An attack review: kernels made the schema at every start, so their role
    owned the tables, and a hub user (who reads its URL) disabled the
    triggers, deleted another user's rows and enabled them again. Now an
    admin makes it (``sandbox-kernel store-init``), and the kernels' role
    has SELECT, INSERT and UPDATE only."""
    s = store(tmp_path, "host", pg.url)
    PrivateData("alice", "nb-off", s).add_private_dataset("payroll", "SECRET")
    with psycopg.connect(pg.url, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)
    assert PrivateData("alice", "nb-off", store(tmp_path, "new-host", pg.url)).sensitivity == Sensitivity.SECRET


def test_a_store_whose_role_could_switch_the_ratchet_off_is_refused(pg: PostgresServer, tmp_path: Path) -> None:
    """Connected as the tables' owner (or a superuser), every session reads
    SECRET, and the reason says how to set the store up."""
    owner = store(tmp_path, "host", pg.admin_url)
    state = PrivateData("dave", "nb-owner", owner).state
    assert state.sensitivity == Sensitivity.SECRET
    assert "superuser" in str(state.error) and "sandbox-kernel store-init" in str(state.error), state.error
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE skowner LOGIN")
        conn.execute("ALTER TABLE sandbox_kernel_marks OWNER TO skowner")
    try:
        owned = store(tmp_path, "host2", pg.url.replace("skuser@", "skowner@"))
        state = PrivateData("dave", "nb-owner", owned).state
        assert state.sensitivity == Sensitivity.SECRET and "owns the ratchet's tables" in str(state.error)
    finally:
        with psycopg.connect(pg.admin_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE sandbox_kernel_marks OWNER TO sk")


def test_operators_or_a_search_path_of_the_kernels_role_change_nothing(pg: PostgresServer, tmp_path: Path) -> None:
    """A review: a kernels' role with CREATE on a schema of its search path
    (PostgreSQL 14's default on ``public``, or a role that owns the
    database) made ``<`` and ``<>`` of its own, which the unpinned trigger
    used, and lowered and moved another user's rows; with ``=`` of its own
    and ``ALTER ROLE ... SET search_path``, every kernel's read matched
    nothing. Now every name is schema-qualified, the functions' search path
    is pinned, and a connection pins its own before it reads."""
    s = store(tmp_path, "host-a", pg.url)
    PrivateData("alice", "nb-op", s).add_private_dataset("payroll", "SECRET")
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    try:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for op, kind in (("<", "smallint"), ("<>", "text"), ("=", "text")):
                name = {"<": "never_lt", "<>": "never_ne", "=": "never_eq"}[op]
                conn.execute(
                    f"CREATE FUNCTION public.{name}({kind}, {kind}) RETURNS boolean LANGUAGE sql AS 'SELECT false'"
                )
                conn.execute(
                    f"CREATE OPERATOR public.{op} (LEFTARG = {kind}, RIGHTARG = {kind}, FUNCTION = public.{name})"
                )
            conn.execute("ALTER ROLE CURRENT_USER SET search_path = public, pg_catalog")
            conn.execute("SET search_path = public, pg_catalog")
            for statement in (
                "UPDATE sandbox_kernel_datasets SET level = 1",  # (its own "=" would match no row)
                "UPDATE sandbox_kernel_datasets SET session_id = 'gone-' || session_id",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="never goes down"):
                    conn.execute(statement)
        fresh = PrivateData("alice", "nb-op", store(tmp_path, "host-b", pg.url))
        assert fresh.sensitivity == Sensitivity.SECRET and fresh.state.error is None, fresh.state.error
    finally:
        with psycopg.connect(pg.admin_url, autocommit=True) as conn:
            conn.execute("ALTER ROLE skuser RESET search_path")
            for name, kind in (("never_lt", "smallint"), ("never_ne", "text"), ("never_eq", "text")):
                op = {"never_lt": "<", "never_ne": "<>", "never_eq": "="}[name]
                conn.execute(f"DROP OPERATOR IF EXISTS public.{op} ({kind}, {kind})")
                conn.execute(f"DROP FUNCTION IF EXISTS public.{name}({kind}, {kind})")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


def test_an_owner_cannot_make_the_role_check_pass(pg: PostgresServer, tmp_path: Path) -> None:
    """A review: the check called ``pg_has_role`` unqualified under the
    role's own search path, and an owner with ``public.pg_has_role``
    returning false made it pass, then switched the triggers off."""
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE skowner2 LOGIN")
        conn.execute("ALTER TABLE sandbox_kernel_marks OWNER TO skowner2")
        conn.execute("GRANT CREATE ON SCHEMA public TO skowner2")
    owner_url = pg.url.replace("skuser@", "skowner2@")
    try:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION public.pg_has_role(name, name, text) RETURNS boolean LANGUAGE sql AS 'SELECT false'"
            )
            conn.execute("ALTER ROLE CURRENT_USER SET search_path = public, pg_catalog")
        state = PrivateData("dave", "nb-owner2", store(tmp_path, "host", owner_url)).state
        assert state.sensitivity == Sensitivity.SECRET and "owns the ratchet's tables" in str(state.error), state.error
    finally:
        with psycopg.connect(pg.admin_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE sandbox_kernel_marks OWNER TO sk")
            conn.execute("DROP FUNCTION IF EXISTS public.pg_has_role(name, name, text)")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM skowner2")


def _store_init(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "sandbox-kernel"), "store-init", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_store_init_makes_the_schema_and_grants_no_more(pg: PostgresServer, tmp_path: Path) -> None:
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE agents LOGIN")
    done = _store_init(pg.admin_url, "--grant", "agents")
    assert done.returncode == 0 and "granted to agents" in done.stdout, done.stderr
    agents = pg.url.replace("skuser@", "agents@")
    PrivateData("erin", "nb-init", store(tmp_path, "host", agents)).add_private_dataset("rows", "CONFIDENTIAL")
    assert PrivateData("erin", "nb-init", store(tmp_path, "host2", pg.url)).sensitivity == Sensitivity.CONFIDENTIAL
    with psycopg.connect(agents, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM sandbox_kernel_marks")
    done = _store_init(pg.admin_url, "--grant", "x; DROP TABLE y")
    assert done.returncode == 1 and "is not a role name" in done.stderr, done.stderr
    done = _store_init("mysql://x")
    assert done.returncode == 2 and "not a postgresql:// URL" in done.stderr, done.stderr


def _writer(url: str, root: str, worker: int) -> None:
    s = PostgresPrivacyStore(root, url)
    for i in range(25):
        PrivateData("carl", "busy", s).add_private_dataset(f"w{worker}-{i}", "INTERNAL")


def test_concurrent_writers_on_several_hosts_lose_nothing(pg: PostgresServer, tmp_path: Path) -> None:
    store(tmp_path, "prep", pg.url)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(pg.url, str(tmp_path / f"h{n}"), n)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    names = {d.name for d in PrivateData("carl", "busy", store(tmp_path, "reader", pg.url)).datasets}
    assert len(names) == 100


def test_database_gone_fails_closed_and_stays_closed(tmp_path: Path) -> None:
    server = PostgresServer()
    try:
        s = store(tmp_path, "host", server.url)
        assert PrivateData("dan", "nb-down", s).sensitivity == Sensitivity.PUBLIC
        server.stop()
        state = PrivateData("dan", "nb-down", s).state
        assert state.sensitivity == Sensitivity.SECRET
        assert state.error is not None and "shared ratchet store" in state.error and server.root.name in state.error
        server.start()
        assert PrivateData("dan", "nb-down", s).sensitivity == Sensitivity.SECRET  # not lowered when it is back
    finally:
        server.remove()


def test_bad_urls_and_passwords() -> None:
    with pytest.raises(ValueError, match="postgresql:// URL"):
        PostgresPrivacyStore("/tmp/x", "mysql://u:pw@h/db")
    assert redact("postgresql://u:s3cret@db.example/x") == "postgresql://u:***@db.example/x"
    assert "s3cret" not in repr(PostgresPrivacyStore("/tmp/x", "postgresql://u:s3cret@h/db"))


# ---- kernels on two hosts ------------------------------------------------------------------
def kernel(tmp_path: Path, host: str, url: str, session: str, *extra: str) -> SandboxKernelHandle:
    require_bwrap()
    return shared_store_kernel(tmp_path / host, url, session, *extra)


def test_two_kernels_on_two_hosts_share_the_sessions_level(pg: PostgresServer, tmp_path: Path) -> None:
    a = kernel(tmp_path, "host-a", pg.url, "shared-nb")
    b = kernel(tmp_path, "host-b", pg.url, "shared-nb")
    try:
        assert b.run(IFACES).stdout != "['lo']\n"  # public: an interface besides lo
        assert a.run("%private payroll SECRET").status in ("ok", "error")
        deadline = time.monotonic() + 20
        while status_of(b)["level"] != "SECRET" and time.monotonic() < deadline:
            time.sleep(0.25)
        assert status_of(b)["level"] == "SECRET"
        assert b.run(IFACES).stdout == "['lo']\n"  # the other host's sandbox lost its network
    finally:
        a.shutdown()
        b.shutdown()


def test_a_rise_on_another_host_is_acted_on_before_the_next_poll(pg: PostgresServer, tmp_path: Path) -> None:
    """LISTEN/NOTIFY: with the poll every 60 s, the cut comes from the notification."""
    k = kernel(tmp_path, "host-b", pg.url, "nb-notify", "--SandboxKernel.privacy_poll_interval=60")
    try:
        assert k.run("x = 1").status == "ok"
        watch = k.kc.execute(
            "import socket, time\nend = time.monotonic() + 30\n"
            "while len(socket.if_nameindex()) > 1 and time.monotonic() < end: time.sleep(0.01)\n"
            "print('cut' if len(socket.if_nameindex()) == 1 else 'still connected')"
        )
        time.sleep(1)
        PrivateData("erin", "nb-notify", store(tmp_path, "host-a", pg.url)).add_private_dataset("crm", "SECRET")
        out = ""
        deadline = time.monotonic() + 60
        while "\n" not in out and time.monotonic() < deadline:
            try:
                msg = k.kc.get_iopub_msg(timeout=1)
            except Exception:
                continue
            if msg["parent_header"].get("msg_id") == watch and msg["msg_type"] == "stream":
                out += msg["content"]["text"]
        assert out == "cut\n"
    finally:
        k.shutdown()


def test_kernel_with_its_database_gone_loses_the_network(tmp_path: Path) -> None:
    server = PostgresServer()
    k = kernel(tmp_path, "host", server.url, "nb-db-down")
    try:
        assert k.run(IFACES).stdout != "['lo']\n"
        server.stop()
        deadline = time.monotonic() + 20
        while status_of(k)["level"] != "SECRET" and time.monotonic() < deadline:
            time.sleep(0.25)
        state = status_of(k)
        assert state["level"] == "SECRET" and "shared ratchet store" in (state.get("error") or "")
        assert k.run(IFACES).stdout == "['lo']\n"
    finally:
        k.shutdown()
        server.remove()


def test_agent_tools_share_the_level_with_another_host(pg: PostgresServer, tmp_path: Path) -> None:
    """An agent session (the MCP server's engine) on one host, a rise on another."""
    import asyncio

    from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell

    require_bwrap()

    async def scenario() -> str:
        config = ToolsConfig(backend="bwrap", network="user", data_dir=tmp_path / "tools-host", shared_store_url=pg.url)
        reg = SessionRegistry(config)
        try:
            kw = {"user_id": "fay", "session_id": "agent-1", "registry": reg}
            before = (await repl_execute_cell(IFACES, **kw)).text
            assert "'lo'" in before and "['lo']" not in before, before
            PrivateData("fay", "agent-1", store(tmp_path, "kernel-host", pg.url)).add_private_dataset("crm", "SECRET")
            return (await repl_execute_cell(IFACES, **kw)).text
        finally:
            await reg.aclose()

    after = asyncio.run(scenario())
    assert "['lo']" in after and "Network access has been restricted" in after, after


def test_an_idle_agent_sandbox_is_cut_by_the_notification(pg: PostgresServer, tmp_path: Path) -> None:
    """The tools' watcher wakes on NOTIFY: with its poll at 60 s, an idle agent
    sandbox (no tool call after the rise) loses its network anyway."""
    import asyncio

    from sandbox_kernel.tools import SessionRegistry, ToolsConfig, repl_execute_cell
    from sandbox_kernel.tools.workspace import workspace_dir

    require_bwrap()
    tools_host = tmp_path / "tools-host"

    async def scenario() -> bool:
        config = ToolsConfig(
            backend="bwrap",
            network="user",
            data_dir=tools_host,
            shared_store_url=pg.url,
            privacy_poll_interval=60,
        )
        reg = SessionRegistry(config)
        try:
            # a thread left running in the sandbox notes when only lo is left
            started = await repl_execute_cell(
                "import socket, threading, time, pathlib\n"
                "def watch():\n"
                "    while len(socket.if_nameindex()) > 1: time.sleep(0.01)\n"
                "    pathlib.Path('/workspace/cut').write_text('cut')\n"
                "threading.Thread(target=watch, daemon=True).start()\n"
                "print(len(socket.if_nameindex()))",
                user_id="gus",
                session_id="agent-idle",
                registry=reg,
            )
            assert started.text.strip().endswith("2"), started.text
            PrivateData("gus", "agent-idle", store(tmp_path, "kernel-host", pg.url)).add_private_dataset(
                "crm", "SECRET"
            )
            marker = workspace_dir("gus", "agent-idle", tools_host) / "cut"
            deadline = time.monotonic() + 20
            while not marker.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            return marker.exists()
        finally:
            await reg.aclose()

    assert asyncio.run(scenario())


def test_a_pydantic_ai_toolset_is_routed_by_a_rise_on_another_host(
    pg: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PrivateDataMCPToolset(shared_store_url=...) reads the ratchet the kernels
    and MCP servers share: a rise on host A sends host B's agent to the
    isolated MCP instance."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.toolsets import FunctionToolset

    from sandbox_kernel.tools.pydantic_ai import PrivateDataMCPToolset

    monkeypatch.setenv("SANDBOX_KERNEL_DATA_DIR", str(tmp_path / "host-b"))
    normal, isolated = FunctionToolset(), FunctionToolset()
    routed = PrivateDataMCPToolset(
        normal, isolated=isolated, user_id="ann", session_id="agent1", shared_store_url=pg.url
    )
    assert not routed.private and routed.target() is normal
    PrivateData("ann", "agent1", store(tmp_path, "host-a", pg.url)).add_private_dataset("payroll", "SECRET")
    assert routed.private and routed.target() is isolated
    with pytest.raises(ValueError, match="not both"):
        PrivateDataMCPToolset(
            normal, isolated=isolated, store=store(tmp_path, "host-c", pg.url), shared_store_url=pg.url
        )
