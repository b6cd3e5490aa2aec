"""Who a turn belongs to: the session id (minted when absent) and the user id (derived when absent).

- A minted session id is a random UUID4.
- A derived user id is a UUIDv5 of the session id in the platform's own namespace: the same session id
  always yields the same user id, on every instance and after restarts, and it tells nothing about the
  session id.
- An unauthenticated caller choosing its own session id needs at least 24 characters (a short id is
  guessable, and whoever guesses it reads the conversation); authenticated callers are exempt.
- A given user id must match the spec's user id pattern.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from caiplatform import validation
from caiplatform.errors import BadRequest

USER_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://caiplatform.dev/invoke/user-id")
MIN_ANONYMOUS_SESSION_ID = 24
SHORT_SESSION_MESSAGE = (
    f"session_id must be at least {MIN_ANONYMOUS_SESSION_ID} characters for unauthenticated callers: "
    "a short, guessable session id is refused; omit session_id to get a minted one or sign in"
)
SESSION_TYPE_MESSAGE = "session_id must be a string"


def mint_session_id() -> str:
    return str(uuid.uuid4())


def derive_user_id(session_id: str) -> str:
    return str(uuid.uuid5(USER_NAMESPACE, session_id))


@dataclass(frozen=True)
class InvokeIds:
    session_id: str
    user_id: str
    session_minted: bool
    user_derived: bool


def resolve(session_id: Any = None, user_id: Any = None, *, authenticated: bool) -> InvokeIds:
    """Apply invoke rules 2 and 3 and fill in what the caller left out."""
    minted = session_id is None or session_id == ""
    if minted:
        session_id = mint_session_id()
    elif not isinstance(session_id, str):
        raise BadRequest(SESSION_TYPE_MESSAGE)
    elif not authenticated and len(session_id) < MIN_ANONYMOUS_SESSION_ID:
        raise BadRequest(SHORT_SESSION_MESSAGE)
    derived = user_id is None or user_id == ""
    if derived:
        user_id = derive_user_id(session_id)
    else:
        validation.user_id(user_id)
    return InvokeIds(session_id, user_id, minted, derived)
