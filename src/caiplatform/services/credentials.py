"""API keys: personal keys, service-account keys and workload keys.

A key is `cai_<keyid>_<secret>` (`cai_wl_<keyid>_<secret>` for workloads); only a hash of the secret is
stored and the whole key appears in exactly one response, at creation. A key is `live` until it is
revoked or expires. Personal keys act as their user, re-resolved on every request (`AuthService`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform import security
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import ApiKey
from caiplatform.errors import Forbidden, NotFound
from caiplatform.models.accounts import ApiKey as ApiKeyView
from caiplatform.models.accounts import ApiKeyCreate, ApiKeyCreated, ApiKeyList, ApiKeyRevoked
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog

KEY_NOTE = "store the secret now: it is shown only in this response and cannot be recovered"
REVOKE_NOTE = "the key stops working on the next request"
PERSONAL_ONLY = "personal keys belong to a signed-in user"


def key_view(key: ApiKey, now: datetime) -> ApiKeyView:
    """No field of a key view can carry a secret; an optional moment that never happened is absent."""
    moments = {"expires_at": key.expires_at, "last_used_at": key.last_used_at, "revoked_at": key.revoked_at}
    return ApiKeyView.of({
        "id": key.id,
        "key_id": key.key_id,
        "display_name": key.display_name,
        "kind": key.kind,
        "created_at": rfc3339(key.created_at),
        **{name: rfc3339(moment) for name, moment in moments.items() if moment is not None},
        "live": key_live(key, now),
    })


def key_live(key: ApiKey, now: datetime) -> bool:
    return key.revoked_at is None and (key.expires_at is None or key.expires_at > now)


def key_expiry(body: ApiKeyCreate, now: datetime) -> datetime | None:
    """`expires_in_days`: 0 never expires, otherwise 1 to 3650 days from now (the model checked the range)."""
    return now + timedelta(days=body.expires_in_days) if body.expires_in_days else None


def new_key(session: Session, now: datetime, *, kind: str, display_name: str, expires_at: datetime | None, **owner: Any) -> tuple[ApiKey, str]:
    """Insert a key row and return it with the whole key (the only time it exists in clear)."""
    minted = security.mint_workload_key() if kind == "workload" else security.mint_api_key()
    row = ApiKey(
        key_id=minted.key_id,
        secret_hash=minted.secret_hash,
        kind=kind,
        display_name=display_name,
        created_at=now,
        expires_at=expires_at,
        **owner,
    )
    session.add(row)
    session.flush()
    return row, minted.secret


def find_key(session: Session, key_ref: str, **owner: Any) -> ApiKey:
    """A key by its `key_id` (or row id) among the owner's keys; anyone else's key is 404."""
    query = select(ApiKey).where((ApiKey.key_id == key_ref) | (ApiKey.id == key_ref))
    for column, value in owner.items():
        query = query.where(getattr(ApiKey, column) == value)
    key = session.scalar(query)
    if key is None:
        raise NotFound(f"key not found: {key_ref}")
    return key


class PersonalKeyService:
    def __init__(self, db: Database, access: Access, audit: AuditLog, clock: Clock):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock

    def _user(self, principal: Principal) -> str:
        self.access.require_human(principal)
        if principal.kind is not PrincipalKind.USER or not principal.user_id:
            raise Forbidden(PERSONAL_ONLY)
        return principal.user_id

    async def list(self, principal: Principal) -> ApiKeyList:
        user_id = self._user(principal)
        now = self.clock.now()

        def fetch(session: Session) -> list[ApiKeyView]:
            rows = session.scalars(
                select(ApiKey)
                .where(ApiKey.user_id == user_id, ApiKey.kind == "personal")
                .order_by(ApiKey.created_at.desc(), ApiKey.key_id)
            )
            return [key_view(k, now) for k in rows]

        return ApiKeyList(keys=await self.db.run(fetch))

    async def create(self, principal: Principal, body: ApiKeyCreate | None = None) -> ApiKeyCreated:
        user_id = self._user(principal)
        now = self.clock.now()
        body = body or ApiKeyCreate()
        display_name, expires_at = body.display_name, key_expiry(body, now)

        def create(session: Session) -> ApiKeyCreated:
            row, secret = new_key(session, now, kind="personal", display_name=display_name, expires_at=expires_at, user_id=user_id)
            self.audit.record(session, None, principal, "apikey.create", row.key_id, {"display_name": display_name})
            return ApiKeyCreated(key=key_view(row, now), secret=secret, note=KEY_NOTE)

        return await self.db.run(create)

    async def revoke(self, principal: Principal, key_ref: str) -> ApiKeyRevoked:
        user_id = self._user(principal)
        now = self.clock.now()

        def revoke(session: Session) -> ApiKeyRevoked:
            key = find_key(session, key_ref, user_id=user_id, kind="personal")
            if key.revoked_at is None:
                key.revoked_at = now
                self.audit.record(session, None, principal, "apikey.revoke", key.key_id)
            return ApiKeyRevoked(revoked=key.key_id, note=REVOKE_NOTE)

        return await self.db.run(revoke)
