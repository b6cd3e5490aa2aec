"""In-memory session store (one process; lost on restart)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

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


class InMemorySessionStore(SessionStore):
    def __init__(self, *, clock: Clock | None = None):
        self.clock = clock or Clock()
        self._sessions: dict[tuple[str, str], Session] = {}
        self._lock = asyncio.Lock()

    async def create(self, agent: str, user_id: str, session_id: str, *, state: dict[str, Any] | None = None) -> Session:
        async with self._lock:
            if (agent, session_id) in self._sessions:
                raise Conflict(f"session {session_id} already exists")
            now = self.clock.now()
            session = Session(agent, user_id, session_id, now, now, [], dict(state or {}))
            self._sessions[(agent, session_id)] = session
            return copy.deepcopy(session)

    def _owned(self, agent: str, user_id: str, session_id: str, now: Any) -> Session:
        """The session, made (empty, created `now`) when it is new; `Conflict` when another user's."""
        session = self._sessions.get((agent, session_id))
        if session is None:
            session = Session(agent, user_id, session_id, now, now, [], {})
            self._sessions[(agent, session_id)] = session
        elif session.user_id != user_id:
            raise Conflict(other_user_message(session_id))
        return session

    async def get(self, agent: str, session_id: str) -> Session | None:
        session = self._sessions.get((agent, session_id))
        return copy.deepcopy(session) if session else None

    async def append(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]], *,
                     state: dict[str, Any] | None = None) -> Session:
        async with self._lock:
            now = self.clock.now()
            session = self._owned(agent, user_id, session_id, now)
            session.events.extend(copy.deepcopy(list(events)))
            session.state.update(state or {})
            session.last_update = now
            return copy.deepcopy(session)

    async def claim(self, agent: str, user_id: str, session_id: str) -> SessionHead:
        async with self._lock:
            session = self._owned(agent, user_id, session_id, self.clock.now())
            return SessionHead(session.user_id, session.created, len(session.events))

    async def extend(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]]) -> SessionHead:
        async with self._lock:
            now = self.clock.now()
            session = self._owned(agent, user_id, session_id, now)
            session.events.extend(copy.deepcopy(list(events)))
            session.last_update = now
            return SessionHead(session.user_id, session.created, len(session.events))

    async def list_users(self, agent: str, *, offset: int = 0, limit: int = 50) -> Listing[UserSummary]:
        check_limit(limit)
        check_offset(offset)
        users: dict[str, UserSummary] = {}
        for (a, _), s in self._sessions.items():
            if a != agent:
                continue
            u = users.get(s.user_id)
            if u is None:
                users[s.user_id] = UserSummary(s.user_id, s.created, s.last_update, 1)
            else:
                u.first_seen = min(u.first_seen, s.created)
                u.last_seen = max(u.last_seen, s.last_update)
                u.session_count += 1
        ordered = sorted(users.values(), key=lambda u: (u.first_seen, u.user_id))
        return Listing(ordered[offset : offset + limit], offset + limit < len(ordered))

    async def list_sessions(self, agent: str, user_id: str, *, offset: int = 0, limit: int = 50) -> Listing[SessionSummary]:
        check_limit(limit)
        check_offset(offset)
        rows = [
            SessionSummary(s.session_id, s.user_id, s.created, s.last_update, len(s.events), preview_of(s.events))
            for (a, _), s in self._sessions.items()
            if a == agent and s.user_id == user_id
        ]
        rows.sort(key=lambda r: (r.created, r.session_id))
        return Listing(rows[offset : offset + limit], offset + limit < len(rows))

    async def delete(self, agent: str, session_id: str) -> bool:
        async with self._lock:
            return self._sessions.pop((agent, session_id), None) is not None

    async def forget_user(self, agent: str, user_id: str) -> Forgotten:
        async with self._lock:
            keys = [k for k, s in self._sessions.items() if k[0] == agent and s.user_id == user_id]
            events = sum(len(self._sessions.pop(k).events) for k in keys)
            return Forgotten(len(keys), events)
