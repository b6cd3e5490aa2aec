"""Session store port: conversations of an agent's callers and their ordered transcripts.

A session is keyed by (agent, user_id, session_id). A session id is unique within one agent: the owning
user is resolved from the session id alone (the browser's read and delete routes only know the id), and
appending to a session that belongs to another user is refused.

Transcript events are plain dicts in the spec's shape::

    {"id": ..., "author": "user" | <agent name>, "timestamp": "<RFC 3339>", "invocation_id": ...,
     "content": {"role": "user" | "model", "parts": [
         {"text": ...}, {"text": ..., "thought": true},
         {"function_call": {"id", "name", "args"}}, {"function_response": {"id", "name", "response"}}]}}

Lists are ordered oldest first (users by `first_seen`, sessions by `created`, ties by id) so that paging
is stable while new users and sessions arrive. Adapters take `offset` and `limit` (1 to 200) and
return a `Listing` that says whether more exist; the harness turns that into signed page tokens.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from caiplatform.clock import rfc3339
from caiplatform.errors import BadRequest, Conflict
from caiplatform.pagination import MAX_PAGE_SIZE, PAGE_SIZE_MESSAGE

T = TypeVar("T")

PREVIEW_CHARS = 120


@dataclass
class Listing(Generic[T]):
    items: list[T]
    more: bool = False


@dataclass
class UserSummary:
    user_id: str
    first_seen: datetime
    last_seen: datetime
    session_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "first_seen": rfc3339(self.first_seen),
            "last_seen": rfc3339(self.last_seen),
            "session_count": self.session_count,
        }


@dataclass
class SessionSummary:
    session_id: str
    user_id: str
    created: datetime
    last_update: datetime
    event_count: int
    preview: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created": rfc3339(self.created),
            "last_update": rfc3339(self.last_update),
            "event_count": self.event_count,
            "preview": self.preview,
        }


@dataclass
class Session:
    agent: str
    user_id: str
    session_id: str
    created: datetime
    last_update: datetime
    events: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The transcript as the browser's read route answers it."""
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "agent": self.agent,
            "created": rfc3339(self.created),
            "last_update": rfc3339(self.last_update),
            "event_count": len(self.events),
            "events": list(self.events),
        }


@dataclass(frozen=True)
class Forgotten:
    """What erasing one user from one agent's store removed: counts, never contents."""

    sessions: int = 0
    events: int = 0


@dataclass(frozen=True)
class SessionHead:
    """A session without its events: who owns it, when it was created, how many events it holds.

    `(created, event_count)` is the transcript's version: a caller that holds state derived from the
    transcript (the harness's live LangGraph state) compares it to know whether anyone else wrote.
    """

    user_id: str
    created: datetime
    event_count: int

    @property
    def version(self) -> tuple[datetime, int]:
        return (self.created, self.event_count)


def check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise BadRequest(PAGE_SIZE_MESSAGE)
    

def check_offset(offset: int) -> None:
    if not isinstance(offset, int) or offset < 0:
        raise BadRequest("offset must be a non-negative integer")


def other_user_message(session_id: str) -> str:
    return f"session {session_id} belongs to another user"


def preview_of(events: Sequence[dict[str, Any]]) -> str:
    """The first user text of the transcript, cut to `PREVIEW_CHARS` characters."""
    for event in events:
        if event.get("author") != "user":
            continue
        for part in (event.get("content") or {}).get("parts") or []:
            text = part.get("text") if isinstance(part, dict) else None
            if text and not part.get("thought"):
                text = " ".join(text.split())
                return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return ""


def new_event(author: str, parts: list[dict[str, Any]], *, invocation_id: str, timestamp: datetime,
              role: str | None = None) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "author": author,
        "timestamp": rfc3339(timestamp),
        "invocation_id": invocation_id,
        "content": {"role": role or ("user" if author == "user" else "model"), "parts": parts},
    }


class SessionStore(abc.ABC):
    """Async port. All methods are safe to call concurrently."""

    @abc.abstractmethod
    async def create(self, agent: str, user_id: str, session_id: str, *, state: dict[str, Any] | None = None) -> Session:
        """Create an empty session; `Conflict` when the id is taken (by anyone) in this agent."""

    @abc.abstractmethod
    async def get(self, agent: str, session_id: str) -> Session | None:
        """The whole session with its events, or None."""

    @abc.abstractmethod
    async def append(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]], *,
                     state: dict[str, Any] | None = None) -> Session:
        """Append events in order, creating the session when missing; merge `state` keys into its state.

        `Conflict` when the session exists under a different user.
        """

    @abc.abstractmethod
    async def list_users(self, agent: str, *, offset: int = 0, limit: int = 50) -> Listing[UserSummary]:
        """Users of the agent, oldest `first_seen` first."""

    @abc.abstractmethod
    async def list_sessions(self, agent: str, user_id: str, *, offset: int = 0, limit: int = 50) -> Listing[SessionSummary]:
        """One user's sessions, oldest `created` first."""

    @abc.abstractmethod
    async def delete(self, agent: str, session_id: str) -> bool:
        """Delete a session (owning user resolved from the id); False when it did not exist."""

    @abc.abstractmethod
    async def forget_user(self, agent: str, user_id: str) -> Forgotten:
        """Delete every session of `user_id` in this agent with its events and state, all or nothing, and
        the user from the agent's user list; what was removed (zero counts when nothing was there)."""

    async def ensure(self, agent: str, user_id: str, session_id: str) -> Session:
        """The session, created empty when missing; `Conflict` when it belongs to another user."""
        existing = await self.get(agent, session_id)
        if existing is not None:
            if existing.user_id != user_id:
                raise Conflict(other_user_message(session_id))
            return existing
        try:
            return await self.create(agent, user_id, session_id)
        except Conflict:
            again = await self.get(agent, session_id)
            if again is None or again.user_id != user_id:
                raise
            return again

    async def claim(self, agent: str, user_id: str, session_id: str) -> SessionHead:
        """`ensure` without reading the events: what a turn needs before it runs.

        Adapters override it with a read of the session's row alone (the default reads the whole session).
        """
        session = await self.ensure(agent, user_id, session_id)
        return SessionHead(session.user_id, session.created, len(session.events))

    async def extend(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]]) -> SessionHead:
        """`append` that does not read the transcript back: the head after the write.

        A turn appends its events with this, so its cost does not depend on the session's length.
        Adapters override it (the default reads the whole session back).
        """
        session = await self.append(agent, user_id, session_id, events)
        return SessionHead(session.user_id, session.created, len(session.events))

    async def aclose(self) -> None:
        return None
