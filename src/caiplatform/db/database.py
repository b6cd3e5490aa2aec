from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio.to_thread
from sqlalchemy import create_engine, event, make_url, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from caiplatform.db.read_threads import ReadThreads

T = TypeVar("T")


def normalize_url(url: str) -> str:
    """Accept plain `postgresql://` and `postgres://` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


# The advisory lock key of schema and bootstrap setup (an arbitrary constant).
_REVISION = re.compile(r"^revision(?:\s*:[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]\s*$", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision(?:\s*:[^=]+)?\s*=\s*(None|['\"]([^'\"]+)['\"])\s*$", re.MULTILINE)


@functools.cache
def migration_heads() -> frozenset[str] | None:
    """The head revisions of the package's migrations, read from the scripts' `revision` and `down_revision`
    lines (None when a script has another shape, such as a merge: Alembic then decides)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in (files("caiplatform.db") / "migrations" / "versions").iterdir():
        if not script.name.endswith(".py") or script.name.startswith("_"):
            continue
        source = script.read_text(encoding="utf-8")
        revision, down = _REVISION.findall(source), _DOWN_REVISION.findall(source)
        if len(revision) != 1 or len(down) != 1:
            return None
        revisions.add(revision[0])
        if down[0][0] != "None":
            parents.add(down[0][1])
    return frozenset(revisions - parents) if revisions else None


SETUP_LOCK_KEY = 0x636169736574757
# Pooled connections kept open: a request path that reads in a worker thread checks one out, and with
# more requests in flight than this the pool opened and closed a connection per request (SQLAlchemy's
# default keeps 5); opening one costs a PostgreSQL handshake or SQLite's pragmas.
POOL_SIZE = 16
POOL_OVERFLOW = 24
# Worker threads of the read path (`Database.read`), so many reads can wait on PostgreSQL at once.
READ_THREADS = 8
# On SQLite (WAL: a reader never waits for a writer) a read is CPU under the GIL, not a wait: one thread
# takes the next read without going to sleep in between, where eight each woke up for one read and
# fought the event loop for the GIL. Measured with `GET /v1/agents/{name}` over 8 connections on two
# cores: 470 -> 362 µs of server CPU per request, 1,768 -> 2,284 requests/s (docs/performance.md).
SQLITE_READ_THREADS = 1
SQLITE_READ_WAIT = 0.002  # how long the loop lends its turn to the SQLite read thread (read_threads.py)


class Database:
    #: How agents' secrets are sealed in this database (`caiplatform.secret_box.SecretBox`), set by the
    #: platform that opens it; `seal_secret` / `open_secret` refuse to work without one.
    secret_box: Any = None

    def seal_secret(self, value: str) -> str:
        if self.secret_box is None:
            raise RuntimeError("this database has no secret box: the platform that opened it sets one")
        return str(self.secret_box.seal(value))

    def open_secret(self, stored: str) -> str:
        if self.secret_box is None:
            raise RuntimeError("this database has no secret box: the platform that opened it sets one")
        return str(self.secret_box.open(stored))

    def __init__(self, url: str, *, echo: bool = False):
        self.url = normalize_url(url)
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        # An in-memory SQLite database is one connection shared by every thread: transactions from
        # concurrent worker threads would interleave on it, so they take turns.
        self._one_connection: threading.RLock | None = None
        on_sqlite = self.url.startswith("sqlite")
        if on_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if self.url in ("sqlite://", "sqlite:///:memory:"):
                kwargs["poolclass"] = StaticPool
                self._one_connection = threading.RLock()
        else:
            kwargs["pool_pre_ping"] = True
        if _queue_pooled(self.url):
            kwargs.update(pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
        # One connection serves its readers one at a time: more threads would only wait on its lock.
        readers = SQLITE_READ_THREADS if on_sqlite else READ_THREADS
        self._readers = ReadThreads(1 if self._one_connection is not None else readers, "cai-db-read",
                                    wait=SQLITE_READ_WAIT if on_sqlite else 0.0)
        if self._one_connection is not None and not echo:
            self.engine: Engine = _new_in_memory_engine()
        else:
            self.engine = create_engine(self.url, **kwargs)
            if self.dialect == "sqlite":
                event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # A SQLite file's read threads keep a connection each (`_read_held`); the in-memory database has
        # one connection for everyone, and PostgreSQL's pool pings a connection before handing it out.
        self._holds_reads = on_sqlite and self._one_connection is None
        self._held = threading.local()

    @classmethod
    def in_memory(cls) -> Database:
        return cls("sqlite://")

    @classmethod
    def sqlite_file(cls, path: Path) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{path}")

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: commit on success, roll back on any exception."""
        with self._turn(), self._sessions() as session, session.begin():
            yield session

    def run_sync(self, fn: Callable[[Session], T]) -> T:
        with self.session() as session:
            return fn(session)

    async def run(self, fn: Callable[[Session], T]) -> T:
        return await anyio.to_thread.run_sync(self.run_sync, fn)

    def read_sync(self, fn: Callable[[Connection], T]) -> T:
        """One read on a pooled connection, without an ORM session (nothing is committed: the pool rolls
        the connection back when it returns)."""
        with self._turn(), self.engine.connect() as connection:
            return fn(connection)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """`read_sync` off the event loop: the lean path of the reads made on every request (the
        credential's row), on threads of their own whose round trip costs a fifth of `anyio.to_thread`'s
        (`read_threads`); a cancelled caller leaves the read to finish in its thread."""
        return await self._readers.call(self._read_held if self._holds_reads else self.read_sync, fn)

    def _read_held(self, fn: Callable[[Connection], T]) -> T:
        """`read_sync` on the read thread's own connection to a SQLite file, kept between reads: taking one
        from the pool and giving it back cost more than a small read (10 to 24 µs). Each read still sees
        the newest commit: SQLite's reads outside a transaction take a fresh snapshot each, and a read
        that opened a transaction is rolled back before the next. A read that fails drops the connection."""
        connection = getattr(self._held, "connection", None)
        if connection is None:
            connection = self._held.connection = self.engine.connect()
        try:
            result = fn(connection)
            if connection.in_transaction():
                connection.rollback()
            if connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
                connection.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            return result
        except BaseException:
            self._held.connection = None
            with contextlib.suppress(Exception):
                connection.close()
            raise

    def read_session_sync(self, fn: Callable[[Session], T]) -> T:
        """A read through the ORM without a transaction of its own to commit (closing the session rolls
        its connection back): for read-only gates that reuse the ORM's access rules."""
        with self._turn(), self._sessions() as session:
            return fn(session)

    async def read_session(self, fn: Callable[[Session], T]) -> T:
        """`read_session_sync` off the event loop, on the read path's threads (see `read`)."""
        return await self._readers.call(self.read_session_sync, fn)

    def migrate(self, **attributes: Any) -> None:
        """Bring the schema to the newest Alembic revision. `attributes` reach the revisions through
        `context.config.attributes` (the secret box that seals existing agent secrets).

        A database already at the newest revisions (every restart but the first after an upgrade) is
        told by one read of `alembic_version` against the revisions the package holds, without Alembic:
        importing it and loading its scripts was about a fifth of a second before the server could start
        anything (docs/performance.md, "Restart"). Anything else goes through Alembic as before."""
        if self.schema_is_current():
            return
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(files("caiplatform.db") / "migrations"))
        with self.engine.begin() as connection:
            self.serialize_setup(connection)
            config.attributes.update(attributes)
            config.attributes["connection"] = connection
            command.upgrade(config, "heads")  # every branch, so unrelinked area revisions all apply

    def schema_is_current(self) -> bool:
        """Whether the database's Alembic revisions are exactly the heads of the package's migrations (False
        when either cannot be told: no version table yet, a script this does not read)."""
        heads = migration_heads()
        if heads is None:
            return False
        try:
            with self.engine.connect() as connection:
                stored = set(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())
        except Exception:  # noqa: BLE001 - no version table (a new database): Alembic creates it
            return False
        return stored == heads

    def serialize_setup(self, connection: Any) -> None:
        """Make this transaction the only one setting the database up (schema, bootstrap accounts) until
        it ends: replicas started at the same time then migrate and bootstrap once, one after the
        other. A PostgreSQL transaction-level advisory lock; nothing to do on SQLite (one writer)."""
        if self.dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SETUP_LOCK_KEY})

    def create_all(self) -> None:
        """Create the schema straight from the models, without migrations: for throwaway in-memory
        databases only (every durable database goes through `migrate`, which the persistence
        conformance suite covers). An in-memory SQLite database gets a copy of a schema created once
        per process (SQLite's backup API), which costs a small fraction of creating 30-odd tables."""
        if self._one_connection is None:
            _create_schema(self.engine)
            return
        with _in_memory_schema()._sqlite() as template, self._sqlite() as target:
            template.backup(target)

    def snapshot(self) -> sqlite3.Connection:
        """A copy of this in-memory database, for `restore` (SQLite's backup API; a fraction of a
        millisecond for a small database): tests put back a state they built once instead of building
        it again."""
        copy = sqlite3.connect(":memory:", check_same_thread=False)
        with self._sqlite() as connection:
            connection.backup(copy)
        return copy

    def restore(self, snapshot: sqlite3.Connection) -> None:
        """Replace this in-memory database's content with a `snapshot` of it, between transactions."""
        with self._sqlite() as connection:
            snapshot.backup(connection)

    @contextmanager
    def _sqlite(self) -> Iterator[sqlite3.Connection]:
        """The one connection of an in-memory SQLite database, while no transaction runs on it."""
        if self._one_connection is None:
            raise ValueError("only an in-memory SQLite database is copied whole")
        with self._turn():
            raw = self.engine.raw_connection()
            try:
                yield cast(sqlite3.Connection, raw.driver_connection)
            finally:
                raw.close()

    def ping(self) -> None:
        with self._turn(), self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        # Closing the one in-memory connection while a worker thread is inside a statement on it crashes
        # SQLite (a background task of a platform being closed may still be finishing a unit of work).
        with self._turn():
            self.engine.dispose()
        self._readers.stop()

    def _turn(self) -> contextlib.AbstractContextManager[Any]:
        return self._one_connection if self._one_connection is not None else contextlib.nullcontext()


def _queue_pooled(url: str) -> bool:
    """Whether SQLAlchemy gives this URL its queue pool (in-memory SQLite gets a one-connection pool)."""
    if not url.startswith("sqlite"):
        return True
    database = make_url(url).database or ""
    return database not in ("", ":memory:") and "mode=memory" not in url


def _create_schema(engine: Engine) -> None:
    import caiplatform.db.models  # noqa: F401
    from caiplatform.db.base import Base

    Base.metadata.create_all(engine)


_template_lock = threading.Lock()
_template: Database | None = None
_in_memory_engine: Engine | None = None
_engine_lock = threading.Lock()


def _new_in_memory_engine() -> Engine:
    """An engine over a new in-memory database that shares one dialect and one compiled-statement cache
    with every other in-memory engine of the process. SQLAlchemy caches a statement's compiled form per
    engine (the key holds the dialect), so a fresh engine compiles every statement again: most of the CPU
    of a short-lived platform (tests make one per test). The new engine is the first one's, with a pool of
    its own (`recreate`, as `Engine.dispose` does: same creator, same listeners), so a new connection, so a
    new database. No one listens to engine events here, which the copies would share."""
    import copy

    global _in_memory_engine
    with _engine_lock:
        if _in_memory_engine is None:
            _in_memory_engine = create_engine("sqlite://", future=True, poolclass=StaticPool,
                                              connect_args={"check_same_thread": False, "timeout": 30})
            event.listen(_in_memory_engine, "connect", _sqlite_pragmas)
        engine = copy.copy(_in_memory_engine)
    engine.pool = _in_memory_engine.pool.recreate()
    return engine


def _in_memory_schema() -> Database:
    """One in-memory database per process holding the empty schema, copied into each new one."""
    global _template
    with _template_lock:
        if _template is None:
            template = Database("sqlite://")
            _create_schema(template.engine)
            _template = template
        return _template


DATABASE_UNAVAILABLE_MESSAGE = "the platform database is unavailable; try again shortly"


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached (stopped, restarting, connection lost), as
    opposed to a statement it refused: the former is 503, worth retrying."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
