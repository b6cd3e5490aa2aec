"""The harness's internal read surface over a session store: users, sessions, transcripts, delete.

What the control plane's users and sessions browser proxies to. Callers must present the platform's
internal secret for this workload in `X-CAI-Internal` (`check_internal`; `workload_internal_token`): 503 when the harness has none configured, 401
when it is missing or wrong. Paging follows the platform rules (page_size 1 to 200, default 50; signed
page tokens bound to the list).
"""

from __future__ import annotations

import hmac
from typing import Any

from caiplatform.errors import BadRequest, NotFound, Unauthenticated, Unavailable
from caiplatform.pagination import Pager
from caiplatform.ports.sessions import SessionStore

INTERNAL_HEADER = "X-CAI-Internal"
NOT_CONFIGURED = "session browsing is not configured: the internal token (CAI_INTERNAL_TOKEN) is not set"
BAD_INTERNAL = f"this route needs the platform's internal credential in {INTERNAL_HEADER}"
USER_ID_REQUIRED = "the user_id query parameter is required"


def workload_internal_token(platform_token: str, workload_key: str) -> str:
    """The internal credential of one workload, derived from the platform's: an agent that reads its own
    (it is in its environment) cannot call another agent's internal surface with it."""
    return hmac.new(platform_token.encode(), f"internal/{workload_key}".encode(), "sha256").hexdigest()


def check_internal(presented: str | None, configured: str | None) -> None:
    if not configured:
        raise Unavailable(NOT_CONFIGURED)
    if not presented or not hmac.compare_digest(presented.encode(), configured.encode()):
        raise Unauthenticated(BAD_INTERNAL)


def session_not_found(session_id: str) -> NotFound:
    return NotFound(f"session {session_id} not found")


class SessionBrowser:
    def __init__(self, store: SessionStore, agent: str, pager: Pager):
        self.store = store
        self.agent = agent
        self.pager = pager

    async def users(self, page_size: Any = None, page_token: str | None = None) -> dict[str, Any]:
        req = self.pager.request(f"harness-users:{self.agent}", page_size, page_token)
        listing = await self.store.list_users(self.agent, offset=req.offset, limit=req.size)
        token = self.pager.token(req.list_key, req.offset + req.size) if listing.more else ""
        return {"users": [u.to_dict() for u in listing.items], "next_page_token": token}

    async def sessions(self, user_id: str | None, page_size: Any = None, page_token: str | None = None) -> dict[str, Any]:
        if not user_id:
            raise BadRequest(USER_ID_REQUIRED)
        req = self.pager.request(f"harness-sessions:{self.agent}:{user_id}", page_size, page_token)
        listing = await self.store.list_sessions(self.agent, user_id, offset=req.offset, limit=req.size)
        token = self.pager.token(req.list_key, req.offset + req.size) if listing.more else ""
        return {"sessions": [s.to_dict() for s in listing.items], "next_page_token": token}

    async def transcript(self, session_id: str) -> dict[str, Any]:
        session = await self.store.get(self.agent, session_id)
        if session is None:
            raise session_not_found(session_id)
        return session.to_dict()

    async def delete(self, session_id: str) -> None:
        if not await self.store.delete(self.agent, session_id):
            raise session_not_found(session_id)
