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
from caiplatform.domain.identity import KeyView
from caiplatform.errors import BadRequest, Forbidden, NotFound
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog

MAX_KEY_DAYS = 3650
EXPIRY_MESSAGE = f"expires_in_days must be 0 (never expires) or between 1 and {MAX_KEY_DAYS}"
DISPLAY_NAME_MAX = 200
KEY_NOTE = "store the secret now: it is shown only in this response and cannot be recovered"
REVOKE_NOTE = "the key stops working on the next request"
PERSONAL_ONLY = "personal keys belong to a signed-in user"


def key_view(key: ApiKey, now: datetime) -> dict[str, Any]:
    """No field of a key view can carry a secret."""
    return KeyView(
        id=key.id,
        key_id=key.key_id,
        display_name=key.display_name,
        kind=key.kind,
        created_at=rfc3339(key.created_at),
        expires_at=_iso(key.expires_at),
        last_used_at=_iso(key.last_used_at),
        revoked_at=_iso(key.revoked_at),
        live=key_live(key, now),
    ).body()


def _iso(moment: datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None


def key_live(key: ApiKey, now: datetime) -> bool:
    return key.revoked_at is None and (key.expires_at is None or key.expires_at > now)


def parse_key_body(body: dict[str, Any], now: datetime) -> tuple[str, datetime | None]:
    """`{display_name, expires_in_days}`: 0 or absent never expires, otherwise 1 to 3650 days."""
    name = body.get("display_name", body.get("description", ""))
    if name is None:
        name = ""
    if not isinstance(name, str) or len(name) > DISPLAY_NAME_MAX:
        raise BadRequest(f"display_name must be a string of at most {DISPLAY_NAME_MAX} characters")
    days = body.get("expires_in_days")
    if days is None:
        days = 0
    if isinstance(days, bool) or not isinstance(days, int | float) or int(days) != days:
        raise BadRequest(EXPIRY_MESSAGE)
    days = int(days)
    if days != 0 and not 1 <= days <= MAX_KEY_DAYS:
        raise BadRequest(EXPIRY_MESSAGE)
    return name.strip(), (now + timedelta(days=days)) if days else None


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

    async def list(self, principal: Principal) -> dict[str, Any]:
        user_id = self._user(principal)
        now = self.clock.now()

        def fetch(session: Session) -> list[dict[str, Any]]:
            rows = session.scalars(
                select(ApiKey)
                .where(ApiKey.user_id == user_id, ApiKey.kind == "personal")
                .order_by(ApiKey.created_at.desc(), ApiKey.key_id)
            )
            return [key_view(k, now) for k in rows]

        return {"keys": await self.db.run(fetch)}

    async def create(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        user_id = self._user(principal)
        now = self.clock.now()
        display_name, expires_at = parse_key_body(body, now)

        def create(session: Session) -> dict[str, Any]:
            row, secret = new_key(session, now, kind="personal", display_name=display_name, expires_at=expires_at, user_id=user_id)
            self.audit.record(session, None, principal, "apikey.create", row.key_id, {"display_name": display_name})
            return {"key": key_view(row, now), "secret": secret, "note": KEY_NOTE}

        return await self.db.run(create)

    async def revoke(self, principal: Principal, key_ref: str) -> dict[str, Any]:
        user_id = self._user(principal)
        now = self.clock.now()

        def revoke(session: Session) -> dict[str, Any]:
            key = find_key(session, key_ref, user_id=user_id, kind="personal")
            if key.revoked_at is None:
                key.revoked_at = now
                self.audit.record(session, None, principal, "apikey.revoke", key.key_id)
            return {"revoked": key.key_id, "note": REVOKE_NOTE}

        return await self.db.run(revoke)
