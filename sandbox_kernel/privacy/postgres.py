"""The ratchet's levels in PostgreSQL, shared by kernels and tools on several hosts.

Two hosts serving the same notebook or agent session must agree on its level.
:class:`PostgresPrivacyStore` keeps everything the file store does on this
host (its records, high-water marks, the folders' levels and the enforcement
reports stay local) and also writes every rise to PostgreSQL, and every read
merges what the database holds: a rise made on another host counts here at
the next read (the kernel's poll: ``privacy_poll_interval``).

The database keeps the ratchet by itself (``SCHEMA``): a rise is an upsert
that keeps the greater level, and triggers refuse any UPDATE that lowers a
level or renames a row, any DELETE and any TRUNCATE, whoever sends them.

Triggers hold against every role but the tables' owner (and a superuser),
who may switch them off: kernels ran ``CREATE`` at every start, so their
role had to own the tables, and every hub user reads that role's URL (an
attack review: one user disabled the triggers, deleted another's rows and
enabled them again; the other's session came back PUBLIC on a new host).
So an admin makes the schema once, as its owner (``sandbox-kernel
store-init``, :func:`init_store`), and grants kernels' role SELECT, INSERT
and UPDATE only; a store whose role owns the tables or the trigger
functions, or is a superuser, is refused at every connection and fails
closed (:func:`role_problem`).

Fail closed: when the database cannot be reached or answers something that is
not a valid record, the session is treated as SECRET (no network) with the
reason in the log and the widget, and it stays so in this process: the
ratchet does not come down when the database comes back.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .records import Dataset, SessionMark
from .sensitivity import Sensitivity
from .state import PrivacyState, merge
from .store import PrivacyStore, PrivacyStoreError, _failure_state, _floors, _memory_lock

log = logging.getLogger("sandbox_kernel.privacy")

#: every name schema-qualified, and the functions' search path pinned: a role
#: with CREATE on a schema of the caller's search path made ``<`` and ``<>``
#: (or ``=`` for the readers) of its own, which the trigger used, and lowered
#: or moved any row (a review)
PINNED = "SET search_path = pg_catalog, pg_temp"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS public.sandbox_kernel_datasets (
    user_id text NOT NULL,
    session_id text NOT NULL,
    name text NOT NULL,
    level smallint NOT NULL CHECK (level BETWEEN 1 AND 3),
    source text NOT NULL,
    added_at text NOT NULL,
    PRIMARY KEY (user_id, session_id, name)
);
CREATE TABLE IF NOT EXISTS public.sandbox_kernel_marks (
    user_id text NOT NULL,
    session_id text NOT NULL,
    level smallint NOT NULL CHECK (level BETWEEN 1 AND 3),
    source text NOT NULL,
    reason text NOT NULL,
    added_at text NOT NULL,
    PRIMARY KEY (user_id, session_id)
);
CREATE OR REPLACE FUNCTION public.sandbox_kernel_only_up() RETURNS trigger LANGUAGE plpgsql
    {PINNED} AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'the private-data ratchet never goes down: % on % refused', TG_OP, TG_TABLE_NAME;
    END IF;
    IF NEW.level < OLD.level OR NEW.user_id <> OLD.user_id OR NEW.session_id <> OLD.session_id THEN
        RAISE EXCEPTION 'the private-data ratchet never goes down: lowering or moving a level on % refused',
            TG_TABLE_NAME;
    END IF;
    IF TG_TABLE_NAME = 'sandbox_kernel_datasets' THEN  -- nested: PL/pgSQL does not short-circuit AND
        IF to_jsonb(NEW) ->> 'name' <> to_jsonb(OLD) ->> 'name' THEN
            RAISE EXCEPTION 'the private-data ratchet never goes down: renaming a dataset refused';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER sandbox_kernel_datasets_only_up BEFORE UPDATE OR DELETE ON public.sandbox_kernel_datasets
    FOR EACH ROW EXECUTE FUNCTION public.sandbox_kernel_only_up();
CREATE OR REPLACE TRIGGER sandbox_kernel_marks_only_up BEFORE UPDATE OR DELETE ON public.sandbox_kernel_marks
    FOR EACH ROW EXECUTE FUNCTION public.sandbox_kernel_only_up();
CREATE OR REPLACE TRIGGER sandbox_kernel_datasets_no_truncate BEFORE TRUNCATE ON public.sandbox_kernel_datasets
    FOR EACH STATEMENT EXECUTE FUNCTION public.sandbox_kernel_only_up();
CREATE OR REPLACE TRIGGER sandbox_kernel_marks_no_truncate BEFORE TRUNCATE ON public.sandbox_kernel_marks
    FOR EACH STATEMENT EXECUTE FUNCTION public.sandbox_kernel_only_up();
CREATE OR REPLACE FUNCTION public.sandbox_kernel_notify() RETURNS trigger LANGUAGE plpgsql
    {PINNED} AS $$
BEGIN
    PERFORM pg_notify('sandbox_kernel_rise', NEW.user_id || '/' || NEW.session_id);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER sandbox_kernel_datasets_notify AFTER INSERT OR UPDATE ON public.sandbox_kernel_datasets
    FOR EACH ROW EXECUTE FUNCTION public.sandbox_kernel_notify();
CREATE OR REPLACE TRIGGER sandbox_kernel_marks_notify AFTER INSERT OR UPDATE ON public.sandbox_kernel_marks
    FOR EACH ROW EXECUTE FUNCTION public.sandbox_kernel_notify();
"""
#: the channel every rise is announced on (``<user>/<session>``)
CHANNEL = "sandbox_kernel_rise"

_UPSERT_DATASET = """
INSERT INTO public.sandbox_kernel_datasets AS d (user_id, session_id, name, level, source, added_at)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (user_id, session_id, name) DO UPDATE SET level = GREATEST(d.level, EXCLUDED.level)
"""
_UPSERT_MARK = """
INSERT INTO public.sandbox_kernel_marks AS m (user_id, session_id, level, source, reason, added_at)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (user_id, session_id) DO UPDATE SET
    level = GREATEST(m.level, EXCLUDED.level),
    source = CASE WHEN EXCLUDED.level > m.level THEN EXCLUDED.source ELSE m.source END,
    reason = CASE WHEN EXCLUDED.level > m.level THEN EXCLUDED.reason ELSE m.reason END,
    added_at = CASE WHEN EXCLUDED.level > m.level THEN EXCLUDED.added_at ELSE m.added_at END
"""
_SELECT_DATASETS = (
    "SELECT name, level, source, added_at FROM public.sandbox_kernel_datasets "
    "WHERE user_id = %s AND session_id = %s ORDER BY added_at, name LIMIT 10001"
)
_SELECT_MARK = (
    "SELECT level, source, reason, added_at FROM public.sandbox_kernel_marks WHERE user_id = %s AND session_id = %s"
)


#: what makes a role able to switch the triggers off: a superuser, or a member
#: of the role owning a table or a trigger function (owners' rights are
#: inherited by their members)
_ROLE_CHECK = """
SELECT
    (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'
        AND tablename IN ('sandbox_kernel_datasets', 'sandbox_kernel_marks')),
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'
        AND tablename IN ('sandbox_kernel_datasets', 'sandbox_kernel_marks')
        AND pg_catalog.pg_has_role(current_user, tableowner, 'MEMBER')),
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
        WHERE p.proname IN ('sandbox_kernel_only_up', 'sandbox_kernel_notify')
        AND p.pronamespace = 'public'::pg_catalog.regnamespace
        AND pg_catalog.pg_has_role(current_user, r.rolname, 'MEMBER')),
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p
        WHERE p.proname IN ('sandbox_kernel_only_up', 'sandbox_kernel_notify')
        AND p.pronamespace = 'public'::pg_catalog.regnamespace
        AND 'search_path=pg_catalog, pg_temp' = ANY (COALESCE(p.proconfig, '{}'::pg_catalog.text[]))),
    current_user
"""
#: where a deployment is told how to set the store up
_SETUP = "an admin creates it once with `sandbox-kernel store-init ADMIN_URL --grant ROLE` (docs/privacy.md, 3b)"


def role_problem(conn: Any) -> str | None:
    """Why the role ``conn`` connected as must not hold the ratchet, if it must not."""
    superuser, tables, owned, functions, pinned, role = conn.execute(_ROLE_CHECK).fetchone()
    if superuser:
        return f"its role {role} is a superuser, which may switch off the triggers that keep the ratchet; {_SETUP}"
    if tables < 2:
        return f"it has no ratchet tables; {_SETUP}"
    if pinned < 2:
        return f"its trigger functions are from an earlier version, with no pinned search path; {_SETUP} (again)"
    if owned or functions:
        return (
            f"its role {role} owns the ratchet's tables or trigger functions, so it may switch the triggers off "
            f"and lower any session's level; kernels must connect as a role with SELECT, INSERT and UPDATE only: "
            f"{_SETUP}"
        )
    return None


def init_store(admin_url: str, grant: list[str]) -> None:
    """Make the ratchet's tables and triggers as the role of ``admin_url``
    (their owner), and grant each role of ``grant`` SELECT, INSERT and
    UPDATE on them, nothing more: the role kernels and agent tools connect
    as. Idempotent."""
    import psycopg
    from psycopg import sql

    for role in grant:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$-]{0,62}", role):
            raise ValueError(f"--grant {role!r} is not a role name")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(PINNED)
        conn.execute(SCHEMA)
        for role in grant:
            for table in ("sandbox_kernel_datasets", "sandbox_kernel_marks"):
                conn.execute(
                    sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(
                        sql.Identifier("public", table), sql.Identifier(role)
                    )
                )


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


class PostgresPrivacyStore(PrivacyStore):
    """The file store of this host plus the levels shared in PostgreSQL (see the module's text)."""

    __slots__ = ("_conn", "_connect_timeout", "_lock", "_said", "_url")
    _url: str
    _connect_timeout: float
    _conn: Any
    _lock: threading.Lock
    _said: set[tuple[str, str, str]]

    def __init__(self, root: Path | str, url: str, connect_timeout: float = 5.0) -> None:
        super().__init__(root)
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"the shared ratchet store must be a postgresql:// URL, not {redact(str(url))[:200]!r}")
        object.__setattr__(self, "_url", url)
        object.__setattr__(self, "_connect_timeout", connect_timeout)
        object.__setattr__(self, "_conn", None)  # one connection per store, reused (the poll reads often)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_said", set())  # failures already logged

    def __repr__(self) -> str:
        return f"PostgresPrivacyStore({str(self.root)!r}, {redact(self._url)!r})"

    @property
    def url(self) -> str:
        return redact(self._url)

    # ---- the database -----------------------------------------------------------------
    def _connect(self) -> Any:
        """A connection, refused (PrivacyStoreError: reads fail closed) when
        its role could switch the ratchet's triggers off (:func:`role_problem`)."""
        import psycopg

        conn = psycopg.connect(self._url, connect_timeout=max(1, int(self._connect_timeout)), autocommit=True)
        try:
            # before anything is read: the role's own default search path
            # (ALTER ROLE ... SET) put its operators and functions first, and
            # made the role check pass for an owner (a review)
            conn.execute(PINNED)
            problem = role_problem(conn)
        except BaseException:
            conn.close()
            raise
        if problem is not None:
            conn.close()
            raise PrivacyStoreError(f"the shared ratchet store {self.url} is refused: {problem}")
        return conn

    def _run(self, work: Any) -> Any:
        """``work(conn)`` on the store's connection; a broken connection is
        dropped and the work tried once more on a new one."""
        with self._lock:
            for attempt in (1, 2):
                conn = self._conn
                if conn is None or conn.closed:
                    conn = self._connect()
                    object.__setattr__(self, "_conn", conn)
                try:
                    return work(conn)
                except Exception:
                    object.__setattr__(self, "_conn", None)
                    try:
                        conn.close()
                    except Exception:
                        pass
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                object.__setattr__(self, "_conn", None)

    def listen(self, on_rise: Callable[[str, str], None]) -> Callable[[], None]:
        """Call ``on_rise(user_id, session_id)`` (from a thread of its own) as
        soon as any host records a rise, so a kernel acts on it before its next
        poll; returns the function that stops listening. The poll stays the
        fallback: a lost connection is retried, and nothing is decided here."""
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                try:
                    with self._connect() as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        while not stop.is_set():
                            for note in conn.notifies(timeout=1.0):
                                user, _, session = note.payload.partition("/")
                                on_rise(user, session)
                except Exception as exc:  # the database went away: the poll fails closed meanwhile
                    log.debug("shared ratchet store listener: %s", exc)
                    stop.wait(1.0)

        threading.Thread(target=run, name="sandbox-kernel-rise-listener", daemon=True).start()
        return stop.set

    def _db_read(self, user_id: str, session_id: str) -> PrivacyState:
        def fetch(conn: Any) -> tuple[list[Any], Any]:
            rows = conn.execute(_SELECT_DATASETS, (user_id, session_id)).fetchall()
            return rows, conn.execute(_SELECT_MARK, (user_id, session_id)).fetchone()

        rows, mark_row = self._run(fetch)
        datasets = [
            Dataset(name=name, sensitivity=Sensitivity(level), added_at=added_at, source=source)
            for name, level, source, added_at in rows[:10000]
        ]
        mark = None
        if mark_row is not None:
            level, source, reason, added_at = mark_row
            mark = SessionMark(sensitivity=Sensitivity(level), source=source, reason=reason, added_at=added_at)
        return PrivacyState.build(datasets=datasets, mark=mark, omitted_datasets=max(0, len(rows) - 10000))

    def _db_write(self, user_id: str, session_id: str, addition: PrivacyState) -> None:
        def write(conn: Any) -> None:
            with conn.transaction():
                for d in addition.datasets:
                    conn.execute(
                        _UPSERT_DATASET, (user_id, session_id, d.name, int(d.sensitivity), d.source, d.added_at)
                    )
                m = addition.mark
                if m is not None:
                    conn.execute(
                        _UPSERT_MARK, (user_id, session_id, int(m.sensitivity), m.source, m.reason, m.added_at)
                    )

        self._run(write)

    def _fail_closed(self, user_id: str, session_id: str, what: str, exc: BaseException) -> PrivacyState:
        message = (
            f"the shared ratchet store {self.url} could not be {what} ({type(exc).__name__}: {str(exc)[:300]}); "
            "the session is treated as private at SECRET"
        )
        if (user_id, session_id, what) not in self._said:  # once, not at every poll
            self._said.add((user_id, session_id, what))
            log.error("%s", message)
        failed = _failure_state(message)
        key = (self._resolved, user_id, session_id)
        with _memory_lock:  # kept by this process: the level does not come down when the database is back
            _floors[key] = merge(_floors.get(key, PrivacyState.public()), failed)
        return failed

    # ---- the store's interface ---------------------------------------------------------
    def read(self, user_id: str, session_id: str) -> PrivacyState:
        local = super().read(user_id, session_id)
        try:
            shared = self._db_read(user_id, session_id)
        except Exception as exc:  # unreachable, refused, or a row that is not a valid record
            return merge(local, self._fail_closed(user_id, session_id, "read", exc))
        return merge(local, shared)

    def _update(self, user_id: str, session_id: str, addition: PrivacyState) -> PrivacyState:
        try:
            local = super()._update(user_id, session_id, addition)
        except PrivacyStoreError:
            self._try_db_write(user_id, session_id, addition)
            raise
        self._try_db_write(user_id, session_id, addition)
        return self.read(user_id, session_id) if local.error is None else local

    def _try_db_write(self, user_id: str, session_id: str, addition: PrivacyState) -> None:
        try:
            self._db_write(user_id, session_id, addition)
        except Exception as exc:
            self._fail_closed(user_id, session_id, "written", exc)
            raise PrivacyStoreError(
                f"could not record the privacy change in the shared ratchet store {self.url}: {exc}; "
                "this process keeps it (at SECRET), other hosts may not see it"
            ) from exc


_open: dict[tuple[str, str], PostgresPrivacyStore] = {}
_open_lock = threading.Lock()


def open_store(root: Path | str, shared_url: str = "") -> PrivacyStore:
    """The store for ``root``: the file store, or, with a ``shared_url``, one
    :class:`PostgresPrivacyStore` per (root, URL) in this process (its
    connection is reused). Its schema is an admin's (:func:`init_store`): a
    database without it, or whose role could lower levels, fails closed."""
    if not shared_url:
        return PrivacyStore(root)
    key = (str(root), shared_url)
    with _open_lock:
        store = _open.get(key)
        if store is None:
            store = _open[key] = PostgresPrivacyStore(root, shared_url)
        return store


def main(argv: list[str] | None = None) -> int:
    """``sandbox-kernel store-init``: make the shared store's schema as its owner."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="sandbox-kernel store-init",
        description="Create the shared ratchet store's tables and triggers in PostgreSQL, owned by the role of "
        "ADMIN_URL, and grant the role kernels and agent tools connect as SELECT, INSERT and UPDATE only "
        "(a role that owns the tables may switch the triggers off). Idempotent.",
    )
    parser.add_argument("admin_url", help="postgresql:// URL of the role that owns the store's tables")
    parser.add_argument(
        "--grant", action="append", default=[], metavar="ROLE", help="the role of shared_store_url (repeatable)"
    )
    args = parser.parse_args(argv)
    if not args.admin_url.startswith(("postgresql://", "postgres://")):
        print(
            f"sandbox-kernel store-init: {redact(args.admin_url)[:200]!r} is not a postgresql:// URL", file=sys.stderr
        )
        return 2
    try:
        init_store(args.admin_url, args.grant)
    except Exception as exc:  # psycopg's errors, a bad role name
        print(f"sandbox-kernel store-init: {redact(str(exc))[:500]}", file=sys.stderr)
        return 1
    granted = ", ".join(args.grant) or "no role (give --grant ROLE)"
    print(f"the ratchet store at {redact(args.admin_url)} is ready; SELECT, INSERT, UPDATE granted to {granted}")
    return 0
