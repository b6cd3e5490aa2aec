"""SQLite session store: one file in the platform's data dir (the embedded default).

Plain `sqlite3` in WAL mode; every call runs in a worker thread under one lock, each write in one
transaction. Timestamps are stored as integer microseconds since the epoch (UTC).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from caiplatform.clock import Clock
from caiplatform.errors import Conflict
from caiplatform.ports.sessions import (
    Forgotten,
    Listing,
    Session,
    SessionHead,
    SessionStore,
    SessionSummary,
    UserSummary,
    check_limit,
    check_offset,
    other_user_message,
    preview_of,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cai_sessions (
    agent TEXT NOT NULL,
    session_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    created INTEGER NOT NULL,
    last_update INTEGER NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    preview TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (agent, session_id)
);
CREATE INDEX IF NOT EXISTS cai_sessions_user ON cai_sessions (agent, user_id, created, session_id);
CREATE TABLE IF NOT EXISTS cai_session_events (
    agent TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (agent, session_id, seq)
);
"""


def _us(moment: datetime) -> int:
    return int(round(moment.timestamp() * 1_000_000))


def _dt(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


class SQLiteSessionStore(SessionStore):
    def __init__(self, path: str | Path, *, clock: Clock | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock or Clock()
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.executescript(_SCHEMA)

    @classmethod
    def in_data_dir(cls, data_dir: str | Path, *, clock: Clock | None = None) -> SQLiteSessionStore:
        return cls(Path(data_dir) / "sessions.sqlite3", clock=clock)

    async def _call(self, fn, *args):
        def locked():
            with self._lock:
                return fn(*args)

        return await anyio.to_thread.run_sync(locked)

    def _tx(self, fn):
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # -- sync bodies -----------------------------------------------------------------------------
    def _load(self, conn, agent: str, session_id: str) -> Session | None:
        row = conn.execute(
            "SELECT user_id, created, last_update, state FROM cai_sessions WHERE agent=? AND session_id=?",
            (agent, session_id),
        ).fetchone()
        if row is None:
            return None
        events = [json.loads(b) for (b,) in conn.execute(
            "SELECT body FROM cai_session_events WHERE agent=? AND session_id=? ORDER BY seq", (agent, session_id))]
        return Session(agent, row[0], session_id, _dt(row[1]), _dt(row[2]), events, json.loads(row[3]))

    def _create(self, agent, user_id, session_id, state):
        now = _us(self.clock.now())

        def body(conn):
            try:
                conn.execute(
                    "INSERT INTO cai_sessions (agent, session_id, user_id, created, last_update, state) VALUES (?,?,?,?,?,?)",
                    (agent, session_id, user_id, now, now, json.dumps(state or {})),
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"session {session_id} already exists") from None
            return self._load(conn, agent, session_id)

        return self._tx(body)

    def _write_events(self, conn, agent, user_id, session_id, events, state) -> SessionHead:
        """Append `events` after the last stored one; reads the session's row, never its events."""
        now = _us(self.clock.now())
        row = conn.execute(
            "SELECT user_id, event_count, preview, state, created FROM cai_sessions WHERE agent=? AND session_id=?",
            (agent, session_id),
        ).fetchone()
        merged: dict[str, Any] = {}
        if row is None:
            conn.execute(
                "INSERT INTO cai_sessions (agent, session_id, user_id, created, last_update) VALUES (?,?,?,?,?)",
                (agent, session_id, user_id, now, now),
            )
            count, preview, created = 0, "", now
        else:
            if row[0] != user_id:
                raise Conflict(other_user_message(session_id))
            count, preview, created = row[1], row[2], row[4]
            if state:
                merged = json.loads(row[3])
        conn.executemany(
            "INSERT INTO cai_session_events (agent, session_id, seq, body) VALUES (?,?,?,?)",
            [(agent, session_id, count + i, json.dumps(e)) for i, e in enumerate(events)],
        )
        if state:
            merged.update(state)
            conn.execute("UPDATE cai_sessions SET state=? WHERE agent=? AND session_id=?",
                         (json.dumps(merged), agent, session_id))
        conn.execute(
            "UPDATE cai_sessions SET last_update=?, event_count=?, preview=? WHERE agent=? AND session_id=?",
            (now, count + len(events), preview or preview_of(events), agent, session_id),
        )
        return SessionHead(user_id, _dt(created), count + len(events))

    def _append(self, agent, user_id, session_id, events, state):
        def body(conn):
            self._write_events(conn, agent, user_id, session_id, events, state)
            return self._load(conn, agent, session_id)

        return self._tx(body)

    def _extend(self, agent, user_id, session_id, events):
        return self._tx(lambda conn: self._write_events(conn, agent, user_id, session_id, events, None))

    def _claim(self, agent, user_id, session_id):
        now = _us(self.clock.now())

        def body(conn):
            row = conn.execute("SELECT user_id, created, event_count FROM cai_sessions WHERE agent=? AND session_id=?",
                               (agent, session_id)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO cai_sessions (agent, session_id, user_id, created, last_update) VALUES (?,?,?,?,?)",
                    (agent, session_id, user_id, now, now),
                )
                return SessionHead(user_id, _dt(now), 0)
            if row[0] != user_id:
                raise Conflict(other_user_message(session_id))
            return SessionHead(row[0], _dt(row[1]), row[2])

        return self._tx(body)

    def _users(self, agent, offset, limit):
        rows = self._conn.execute(
            "SELECT user_id, MIN(created) AS f, MAX(last_update), COUNT(*) FROM cai_sessions WHERE agent=? "
            "GROUP BY user_id ORDER BY f, user_id LIMIT ? OFFSET ?",
            (agent, limit + 1, offset),
        ).fetchall()
        items = [UserSummary(r[0], _dt(r[1]), _dt(r[2]), r[3]) for r in rows[:limit]]
        return Listing(items, len(rows) > limit)

    def _sessions(self, agent, user_id, offset, limit):
        rows = self._conn.execute(
            "SELECT session_id, created, last_update, event_count, preview FROM cai_sessions "
            "WHERE agent=? AND user_id=? ORDER BY created, session_id LIMIT ? OFFSET ?",
            (agent, user_id, limit + 1, offset),
        ).fetchall()
        items = [SessionSummary(r[0], user_id, _dt(r[1]), _dt(r[2]), r[3], r[4]) for r in rows[:limit]]
        return Listing(items, len(rows) > limit)

    def _delete(self, agent, session_id):
        def body(conn):
            gone = conn.execute("DELETE FROM cai_sessions WHERE agent=? AND session_id=?", (agent, session_id)).rowcount
            conn.execute("DELETE FROM cai_session_events WHERE agent=? AND session_id=?", (agent, session_id))
            return gone > 0

        return self._tx(body)

    def _forget_user(self, agent, user_id):
        def body(conn):
            sessions, events = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(event_count), 0) FROM cai_sessions WHERE agent=? AND user_id=?",
                (agent, user_id)).fetchone()
            conn.execute("DELETE FROM cai_session_events WHERE agent=? AND session_id IN "
                         "(SELECT session_id FROM cai_sessions WHERE agent=? AND user_id=?)", (agent, agent, user_id))
            conn.execute("DELETE FROM cai_sessions WHERE agent=? AND user_id=?", (agent, user_id))
            return Forgotten(int(sessions), int(events))

        return self._tx(body)

    # -- port ------------------------------------------------------------------------------------
    async def create(self, agent: str, user_id: str, session_id: str, *, state: dict[str, Any] | None = None) -> Session:
        return await self._call(self._create, agent, user_id, session_id, state)

    async def get(self, agent: str, session_id: str) -> Session | None:
        return await self._call(self._load, self._conn, agent, session_id)

    async def append(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]], *,
                     state: dict[str, Any] | None = None) -> Session:
        return await self._call(self._append, agent, user_id, session_id, list(events), state)

    async def claim(self, agent: str, user_id: str, session_id: str) -> SessionHead:
        return await self._call(self._claim, agent, user_id, session_id)

    async def extend(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]]) -> SessionHead:
        return await self._call(self._extend, agent, user_id, session_id, list(events))

    async def list_users(self, agent: str, *, offset: int = 0, limit: int = 50) -> Listing[UserSummary]:
        check_limit(limit)
        check_offset(offset)
        return await self._call(self._users, agent, offset, limit)

    async def list_sessions(self, agent: str, user_id: str, *, offset: int = 0, limit: int = 50) -> Listing[SessionSummary]:
        check_limit(limit)
        check_offset(offset)
        return await self._call(self._sessions, agent, user_id, offset, limit)

    async def delete(self, agent: str, session_id: str) -> bool:
        return await self._call(self._delete, agent, session_id)

    async def forget_user(self, agent: str, user_id: str) -> Forgotten:
        return await self._call(self._forget_user, agent, user_id)

    async def aclose(self) -> None:
        with self._lock:
            self._conn.close()
