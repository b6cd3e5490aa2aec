"""Who does a piece of background work when several replicas serve one platform.

A replica holds a *work lock* while it does one piece of claimed work (a schedule occurrence being
fired, a build being run). On PostgreSQL a work lock is a session-level advisory lock
(`pg_try_advisory_lock`) taken on one connection this replica keeps for its locks alone, so the lock
lasts exactly as long as that connection: a replica that dies (kill -9, a lost host) loses its
connection and with it every lock, and work recorded as claimed whose lock nobody holds is an orphan
that another replica takes over. `application_name` of that connection is the replica's id, so
`pg_locks` joined with `pg_stat_activity` shows who holds what.

SQLite cannot be shared by replicas, so there the locks live in this process.

When the lock connection breaks (PostgreSQL restarted) the locks are gone with it: the next call opens
a new connection and takes the locks this replica still means to hold again; one another replica took
in between is reported as lost (the work may then run twice: at least once, never never).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from typing import Any

import anyio.to_thread

from caiplatform.db import Database

log = logging.getLogger(__name__)


def lock_key(name: str) -> int:
    """A lock name → the signed 64-bit key of a PostgreSQL advisory lock."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def held_lock_keys(session: Any) -> set[int]:
    """The keys of the work locks some replica holds now (every session's advisory locks on PostgreSQL),
    so that a replica can tell whether the one recorded as running something is still alive."""
    from sqlalchemy import text

    rows = session.execute(text(
        "SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"))
    keys = set()
    for high, low in rows:
        key = (int(high) << 32) | int(low)
        keys.add(key - (1 << 64) if key >= 1 << 63 else key)
    return keys


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class LocalWorkLocks:
    """Work locks of a platform that is the only replica (SQLite, in memory). They cannot tell a dead
    claimer from a live one in another process, so nothing is taken over on them (`shared` False)."""

    shared = False

    def __init__(self, replica_id: str = ""):
        self.replica_id = replica_id or default_replica_id()
        self._held: set[str] = set()
        self._mutex = threading.Lock()

    async def try_acquire(self, name: str) -> bool:
        with self._mutex:
            if name in self._held:
                return False
            self._held.add(name)
            return True

    async def release(self, name: str) -> None:
        with self._mutex:
            self._held.discard(name)

    def holds(self, name: str) -> bool:
        return name in self._held

    async def close(self) -> None:
        self._held.clear()


class PostgresWorkLocks:
    """Work locks as PostgreSQL session-level advisory locks on one connection of this replica."""

    shared = True

    def __init__(self, url: str, replica_id: str = ""):
        from sqlalchemy.engine import make_url

        self.replica_id = replica_id or default_replica_id()
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: Any = None
        self._connected_before = False
        self._held: set[str] = set()
        self._mutex = threading.Lock()

    def _connection(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        reconnect, self._connected_before = self._connected_before, True
        self._conn = psycopg.connect(
            self._conninfo, autocommit=True, application_name=self.replica_id[:63], connect_timeout=5,
            keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
        )
        if reconnect:
            for name in list(self._held):  # the old connection took its locks with it: take them again
                if not self._take(name):
                    self._held.discard(name)
                    log.warning("work lock %s was taken over by another replica while the database "
                                "connection was down", name)
        return self._conn

    def _take(self, name: str) -> bool:
        row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(name),)).fetchone()
        return bool(row and row[0])

    def _call(self, fn: Any) -> Any:
        with self._mutex:
            try:
                self._connection()
                return fn()
            except Exception:
                # A broken connection is replaced on the next call (its locks are gone with it).
                if self._conn is not None and (self._conn.closed or self._conn.broken):
                    self._conn = None
                raise

    def _acquire_sync(self, name: str) -> bool:
        def run() -> bool:
            if name in self._held:
                return False
            if self._take(name):
                self._held.add(name)
                return True
            return False

        return bool(self._call(run))

    def _release_sync(self, name: str) -> None:
        def run() -> None:
            if name in self._held:
                self._held.discard(name)
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(name),))

        try:
            self._call(run)
        except Exception:  # noqa: BLE001 - a lost connection released it already
            self._held.discard(name)

    async def try_acquire(self, name: str) -> bool:
        return bool(await anyio.to_thread.run_sync(self._acquire_sync, name))

    async def release(self, name: str) -> None:
        await anyio.to_thread.run_sync(self._release_sync, name)

    def holds(self, name: str) -> bool:
        return name in self._held

    async def close(self) -> None:
        def run() -> None:
            with self._mutex:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                self._held.clear()

        await anyio.to_thread.run_sync(run)


def work_locks_for(db: Database, replica_id: str | None = None) -> LocalWorkLocks | PostgresWorkLocks:
    if db.dialect == "postgresql":
        return PostgresWorkLocks(db.url, replica_id or "")
    return LocalWorkLocks(replica_id or "")
