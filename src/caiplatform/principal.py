"""Who is calling. Every service method takes a `Principal` and decides for itself what it may do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PrincipalKind(StrEnum):
    ANONYMOUS = "anonymous"
    USER = "user"  # session token or personal API key
    SERVICE_ACCOUNT = "service_account"
    WORKLOAD = "workload"  # cai_wl_ key: only mints read tokens for its own project's secrets
    AUTOMATION = "automation"  # the cluster machine credential
    INTERNAL = "internal"  # the platform itself (CAI_INTERNAL_TOKEN), for harness-facing routes


class CredentialKind(StrEnum):
    NONE = "none"
    SESSION = "session"
    API_KEY = "api_key"
    SERVICE_ACCOUNT_KEY = "service_account_key"
    WORKLOAD_KEY = "workload_key"
    AUTOMATION_TOKEN = "automation_token"
    INTERNAL_TOKEN = "internal_token"


@dataclass(frozen=True)
class Principal:
    kind: PrincipalKind
    credential: CredentialKind = CredentialKind.NONE
    user_id: str | None = None
    email: str | None = None
    service_account_id: str | None = None
    # Service accounts and workload keys belong to exactly one project.
    project_id: str | None = None
    key_id: str | None = None
    # The client address, used to rate-limit anonymous callers and to throttle sign-in.
    client_ip: str | None = None
    # Session tokens carry their expiry (Unix seconds) so that /v1/auth/me can report it.
    expires_at: int | None = None
    # The user's account as read when this credential was resolved (every request resolves it anew):
    # the owed password change gates management without another read of the same row.
    must_change_password: bool = False
    role: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.kind is not PrincipalKind.ANONYMOUS

    @property
    def is_human(self) -> bool:
        return self.kind is PrincipalKind.USER

    @property
    def rate_key(self) -> str:
        """The bucket a rate limiter charges this caller to."""
        if self.kind is PrincipalKind.ANONYMOUS:
            return f"ip:{self.client_ip or 'unknown'}"
        ident = self.user_id or self.service_account_id or self.key_id or self.kind.value
        return f"{self.kind.value}:{ident}"

    @classmethod
    def anonymous(cls, client_ip: str | None = None) -> Principal:
        return cls(kind=PrincipalKind.ANONYMOUS, client_ip=client_ip)

    @classmethod
    def automation(cls, client_ip: str | None = None) -> Principal:
        return cls(kind=PrincipalKind.AUTOMATION, credential=CredentialKind.AUTOMATION_TOKEN, client_ip=client_ip)

    @classmethod
    def internal(cls) -> Principal:
        return cls(kind=PrincipalKind.INTERNAL, credential=CredentialKind.INTERNAL_TOKEN)
