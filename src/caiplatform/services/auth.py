"""Credentials → principals, password sign-in, and the bootstrap of the first admin."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from caiplatform import security, validation
from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.db.models import ApiKey, Org, OrgMember, Project, ServiceAccount, User
from caiplatform.db.prefetch import Prefetched, Then
from caiplatform.db.prepared import PreparedRead
from caiplatform.domain.identity import PLATFORM_CLOUD_KEY, default_cloud_mapping
from caiplatform.errors import BadRequest, RateLimited, Unauthenticated, Unavailable
from caiplatform.models.auth import Me, SignIn
from caiplatform.principal import CredentialKind, Principal, PrincipalKind
from caiplatform.ratelimit import SlidingWindowThrottle
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog

log = logging.getLogger(__name__)

DEFAULT_SLUG = "default"
LOGIN_WINDOW_SECONDS = 15 * 60
IP_ATTEMPTS = 10
ACCOUNT_ATTEMPTS = 50
# The account a session token names, read on every request: one Core statement on a pooled connection
# (no ORM session, no identity map, no commit), built once so only its cache key is computed per call.
SESSION_ACCOUNT = PreparedRead(
    select(User.id, User.email, User.role, User.must_change_password).where(User.id == bindparam("id")))


def sign_in_throttles(clock: Clock | None = None) -> tuple[SlidingWindowThrottle, SlidingWindowThrottle]:
    """The sign-in throttle of one process: 10 failed attempts per IP, 50 per account, per 15 minutes."""
    return (SlidingWindowThrottle(IP_ATTEMPTS, LOGIN_WINDOW_SECONDS, clock),
            SlidingWindowThrottle(ACCOUNT_ATTEMPTS, LOGIN_WINDOW_SECONDS, clock))


def go_duration(seconds: float) -> str:
    """Durations the way the original Go services print them: `14m32s`."""
    total = max(1, int(seconds + 0.999))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class AuthService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        session_key: bytes,
        automation_token: str | None = None,
        throttles: tuple[Any, Any] | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.tokens = security.SessionTokens(session_key)
        self.automation_token = automation_token
        # (per IP, per account): this process's own, or shared by the cluster (`sign_in_throttles`).
        pair: tuple[Any, Any] = throttles or sign_in_throttles(clock)
        self.ip_throttle, self.account_throttle = pair

    # -- credentials ----------------------------------------------------------------------------

    async def authenticate(self, bearer: str | None, client_ip: str | None = None) -> Principal:
        """Resolve a bearer credential. An invalid or expired credential is treated as none.

        Called once per request and never cached: a revoked key or a deleted user is refused on the very
        next request. The one database read runs off the event loop."""
        principal, _ = await self.authenticate_with(bearer, client_ip, None)
        return principal

    async def authenticate_with(self, bearer: str | None, client_ip: str | None,
                                then: Then | None) -> tuple[Principal, Prefetched | None]:
        """`authenticate`, and `then`'s read in the same worker-thread job right after the credential's,
        when the credential names an account (`caiplatform.db.prefetch`); otherwise no prefetched read."""
        if not bearer:
            return Principal.anonymous(client_ip), None
        if self.automation_token and security.hmac.compare_digest(bearer, self.automation_token):
            return Principal.automation(client_ip), None
        if bearer.startswith("cai_"):

            def by_key(session: Session) -> tuple[Principal | None, Prefetched | None]:
                principal = self._principal_for_key(session, bearer, client_ip)
                return principal, (then.run(session.connection(), principal) if then and principal else None)

            found, prefetched = await self.db.run(by_key)
            return (found, prefetched) if found is not None else (Principal.anonymous(client_ip), None)
        claims = self.tokens.verify(bearer, self.clock.time())
        if claims is None:
            return Principal.anonymous(client_ip), None

        def by_session(connection: Connection) -> tuple[Principal | None, Prefetched | None]:
            user = SESSION_ACCOUNT.first(connection, {"id": claims["sub"]})
            if user is None:
                return None, None
            principal = Principal(
                kind=PrincipalKind.USER,
                credential=CredentialKind.SESSION,
                user_id=user.id,
                email=user.email,
                client_ip=client_ip,
                expires_at=int(claims["exp"]),
                must_change_password=user.must_change_password,
                role=user.role,
            )
            return principal, (then.run(connection, principal) if then else None)

        found, prefetched = await self.db.read(by_session)
        return (found, prefetched) if found is not None else (Principal.anonymous(client_ip), None)

    def _principal_for_key(self, session: Session, bearer: str, client_ip: str | None) -> Principal | None:
        workload = security.WORKLOAD_KEY_RE.match(bearer)
        match = workload or security.API_KEY_RE.match(bearer)
        if match is None:
            return None
        key = session.scalar(select(ApiKey).where(ApiKey.key_id == match["key_id"]))
        if key is None or not security.secret_matches(key.secret_hash, match["secret"]):
            return None
        now = self.clock.now()
        if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
            return None
        if (key.kind == "workload") != bool(workload):
            return None
        key.last_used_at = now
        if key.kind == "workload":
            return Principal(
                kind=PrincipalKind.WORKLOAD,
                credential=CredentialKind.WORKLOAD_KEY,
                project_id=key.project_id,
                key_id=key.key_id,
                client_ip=client_ip,
            )
        if key.kind == "service_account":
            sa = session.get(ServiceAccount, key.service_account_id)
            if sa is None or sa.disabled or sa.deleted_at is not None:
                return None
            project = session.get(Project, sa.project_id)
            return Principal(
                kind=PrincipalKind.SERVICE_ACCOUNT,
                credential=CredentialKind.SERVICE_ACCOUNT_KEY,
                service_account_id=sa.id,
                project_id=sa.project_id,
                email=f"{sa.name}@{project.short}.cai.local" if project else None,
                key_id=key.key_id,
                client_ip=client_ip,
            )
        user = session.get(User, key.user_id)
        if user is None:
            return None
        return Principal(
            kind=PrincipalKind.USER,
            credential=CredentialKind.API_KEY,
            user_id=user.id,
            email=user.email,
            key_id=key.key_id,
            client_ip=client_ip,
            must_change_password=user.must_change_password,
            role=user.role,
        )

    # -- sign-in --------------------------------------------------------------------------------

    def _throttle_keys(self, client_ip: str | None, email: str | None) -> list[tuple[Any, str]]:
        keys = [(self.ip_throttle, f"ip:{client_ip or 'unknown'}")]
        if email:
            keys.append((self.account_throttle, f"account:{email}"))
        return keys

    async def throttle_sign_in(self, client_ip: str | None, email: str | None) -> None:
        """Refuse a sign-in attempt (login, invitation accept) with 429 while its IP or account is over
        the limit of failed attempts."""
        for throttle, key in self._throttle_keys(client_ip, email):
            wait = await throttle.check(key)
            if wait is not None:
                raise RateLimited(f"too many sign-in attempts; try again in {go_duration(wait)}", retry_after=wait)

    async def record_failed_sign_in(self, client_ip: str | None, email: str | None) -> None:
        """Count a failed attempt. Only failures count, so that people and scripts signing in correctly
        are never locked out while guessing is still capped at 10 per IP and 50 per account."""
        for throttle, key in self._throttle_keys(client_ip, email):
            await throttle.record(key)

    async def login(self, email: str, password: str, client_ip: str | None = None) -> SignIn:
        """A session token for an e-mail and password (`LoginRequest` carries the same two fields)."""
        if not isinstance(email, str) or not email.strip() or not isinstance(password, str) or not password:
            raise BadRequest("email and password are required")
        email = email.strip().lower()
        await self.throttle_sign_in(client_ip, email)

        def find(session: Session) -> User | None:
            if session.scalar(select(func.count()).select_from(User)) == 0:
                raise Unavailable(
                    "user management is not initialized: no account exists yet "
                    "(set CAI_ADMIN_EMAIL and CAI_ADMIN_PASSWORD and restart)"
                )
            return session.scalar(select(User).where(User.email == email))

        user = await self.db.run(find)
        # argon2 takes tens of milliseconds: verified in a worker thread of its own, after the read's
        # transaction has ended, so it holds neither the event loop nor a database connection.
        stored = user.password_hash if user else security.dummy_password_hash()
        if not await anyio.to_thread.run_sync(security.verify_password, stored, password) or user is None:
            await self.record_failed_sign_in(client_ip, email)
            raise Unauthenticated("invalid email or password")
        return self._sign_in(user)

    def _sign_in(self, user: User) -> SignIn:
        token, expires_at = self.tokens.issue(user.id, self.clock.time())
        return SignIn.of({"token": token, "email": user.email, "role": user.role,
                          "must_change_password": user.must_change_password, "expires_at": expires_at})

    async def me(self, principal: Principal) -> Me:
        self.access.require_authenticated(principal)
        if principal.kind is not PrincipalKind.USER:
            role = "admin" if principal.kind is PrincipalKind.AUTOMATION else "user"
            return Me(email=principal.email or "", role=role, must_change_password=False, expires_at=None)
        if principal.role is not None:  # read from the account when the credential was resolved
            # Every value came from the account's row or the verified token: nothing to validate again.
            return Me.trusted(email=principal.email or "", role=principal.role,
                              must_change_password=principal.must_change_password, expires_at=principal.expires_at)
        user = await self.db.run(lambda s: s.get(User, principal.user_id))
        if user is None:
            raise Unauthenticated("invalid email or password")
        return Me.of({"email": user.email, "role": user.role, "must_change_password": user.must_change_password,
                      "expires_at": principal.expires_at})

    async def change_password(self, principal: Principal, current: str, new: str) -> SignIn:
        """A fresh session token after the password change (`PasswordChange` carries the two fields)."""
        self.access.require_authenticated(principal)
        if principal.kind is not PrincipalKind.USER:
            raise BadRequest("only a signed-in user can change a password")
        if not isinstance(current, str) or not isinstance(new, str):
            raise BadRequest("current_password and new_password are required")

        def change(session: Session) -> User:
            user = session.get(User, principal.user_id)
            if user is None or not security.verify_password(user.password_hash, current):
                raise Unauthenticated("current password is incorrect")
            validation.password(new)
            if new == current:
                raise BadRequest("new password must differ from the current one")
            user.password_hash = security.hash_password(new)
            user.must_change_password = False
            return user

        return self._sign_in(await self.db.run(change))

    # -- bootstrap ------------------------------------------------------------------------------

    def bootstrap(self, admin_email: str | None, admin_password: str | None) -> None:
        """On a start with no accounts, create the platform admin, the default org and project."""

        def run(session: Session) -> None:
            self.db.serialize_setup(session)  # replicas starting at once: one creates, the others find
            now = self.clock.now()
            org = session.scalar(select(Org).where(Org.slug == DEFAULT_SLUG))
            if org is None:
                org = Org(slug=DEFAULT_SLUG, name="Default", created_at=now)
                session.add(org)
                session.flush()
            if session.scalar(select(Project).where(Project.slug == DEFAULT_SLUG)) is None:
                session.add(
                    Project(
                        org_id=org.id, slug=DEFAULT_SLUG, name="Default", short=new_short(session), created_at=now,
                        settings={PLATFORM_CLOUD_KEY: default_cloud_mapping()},
                    )
                )
            if not admin_email or (session.scalar(select(func.count()).select_from(User)) or 0) > 0:
                return
            email = validation.email(admin_email)
            validation.password(admin_password)
            user = User(
                email=email,
                password_hash=security.hash_password(admin_password or ""),
                role="admin",
                must_change_password=False,
                org_id=org.id,
                created_at=now,
            )
            session.add(user)
            session.flush()
            session.add(OrgMember(org_id=org.id, user_id=user.id, role="admin", created_at=now))
            self.audit.record(session, None, None, "user.create", email, {"role": "admin", "bootstrap": True})
            # Said at start-up even when quiet (`caiplatform.startup`): the one account a newcomer signs in with.
            logging.getLogger("caiplatform.startup").info("created the bootstrap platform admin %s", email)

        self.db.run_sync(run)


def new_short(session: Session) -> str:
    """An immutable, unique project fragment for namespaces and hostnames."""
    import secrets

    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    while True:
        short = "".join(secrets.choice(alphabet) for _ in range(6))
        if session.scalar(select(Project).where(Project.short == short)) is None:
            return short


def utc_iso(moment: datetime | None) -> str | None:
    from caiplatform.clock import rfc3339

    return rfc3339(moment) if moment else None
