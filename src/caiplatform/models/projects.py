"""Projects and what hangs off them (document 2): the project view, the cloud-credential mapping,
members and service-account grants, break-glass, invitations, service accounts, quota and audit.

Each request model runs the rules that carry the specification's messages before pydantic's own
checks; rules that need the project or the caller (last admin, slug conflicts, who may escalate)
stay in the services.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from caiplatform import validation
from caiplatform.errors import BadRequest
from caiplatform.models.accounts import optional_name, optional_org_id, parse_slug
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

MemberRole = Literal["admin", "member"]
MEMBER_ROLES = ("admin", "member")
ROLE_MESSAGE = "role must be admin or member"
BREAK_GLASS_DEFAULT_MINUTES = 240
BREAK_GLASS_MAX_MINUTES = 1440
BREAK_GLASS_REASON_MIN = 8
SERVICE_ACCOUNT_NAME_MESSAGE = (
    "missing or invalid 'name' (must be a DNS-1035 label: lowercase letters, digits and '-', at most 63)"
)
CLOUD_FIELDS = ("credential", "registry", "region", "account", "bucket", "repository")


def parse_role(raw: Any, default: str | None = None) -> str:
    role = raw if raw not in (None, "") else default
    if role not in MEMBER_ROLES:
        raise BadRequest(ROLE_MESSAGE)
    return role


# ------------------------------------------------------------------------------------------ requests


class ProjectCreate(RequestModel):
    """`POST /v1/projects`: the slug is lowercased and trimmed; the name defaults to it."""

    slug: str = Field(max_length=63, pattern=validation.SLUG.pattern)
    name: str = ""
    org_id: str | None = Field(None, description="the owning organization; default the caller's home org")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        slug = parse_slug(data.get("slug"))
        return {**data, "slug": slug, "name": optional_name(data.get("name"), slug),
                "org_id": optional_org_id(data.get("org_id"))}


class ProjectPatch(RequestModel):
    """`PATCH /v1/projects/{projectID}`: rename; `short` and `namespace` never change."""

    slug: str | None = Field(None, max_length=63, pattern=validation.SLUG.pattern)
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        slug = parse_slug(data["slug"]) if data.get("slug") not in (None, "") else None
        name = data.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise BadRequest("name must be a non-empty string")
        return {**data, "slug": slug, "name": name.strip() if name is not None else None}


class CloudMappingPut(RequestModel):
    """`PUT /v1/projects/{projectID}/platform-cloud`: the cloud credential deploys use."""

    provider: str = Field(description='the cloud whose credential deploys use (e.g. "local")')
    credential: str = ""
    registry: str | None = None
    region: str | None = None
    account: str | None = None
    bucket: str | None = None
    repository: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        provider = data.get("provider")
        if not isinstance(provider, str) or not provider.strip():
            raise BadRequest("missing 'provider': name the cloud whose credential deploys use (e.g. \"local\")")
        for field in CLOUD_FIELDS:
            value = data.get(field)
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"'{field}' must be a string")
        return {**data, "provider": provider.strip(), "credential": data.get("credential") or ""}

    def mapping(self) -> dict[str, Any]:
        """The stored mapping: the provider, the credential, and the other fields that were sent."""
        mapping: dict[str, Any] = {"provider": self.provider}
        for field in CLOUD_FIELDS:
            value = getattr(self, field)
            if value is not None and (field != "credential" or field in self.model_fields_set):
                mapping[field] = value
        mapping.setdefault("credential", "")
        return mapping


class MemberAdd(RequestModel):
    """`POST /v1/projects/{projectID}/members`: grants a role to an existing account."""

    email: str
    role: MemberRole = "member"

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, "email": validation.email(data.get("email")), "role": parse_role(data.get("role"), "member")}


class InvitationCreate(MemberAdd):
    """`POST /v1/projects/{projectID}/invitations`: an existing account is granted the role directly."""


class MemberRolePatch(RequestModel):
    """`PATCH .../members/{userID}` and `.../members/service-accounts/{saID}`."""

    role: MemberRole

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, "role": parse_role(data.get("role"))}


class BreakGlassRequest(RequestModel):
    """`POST /v1/projects/{projectID}/break-glass` (platform admin, a person's credentials)."""

    reason: str = Field(min_length=BREAK_GLASS_REASON_MIN, description="shown verbatim to project members")
    role: MemberRole = "admin"
    minutes: int = Field(BREAK_GLASS_DEFAULT_MINUTES, ge=1, le=BREAK_GLASS_MAX_MINUTES)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        reason = data.get("reason")
        if not isinstance(reason, str) or len(reason.strip()) < BREAK_GLASS_REASON_MIN:
            raise BadRequest(
                f"reason is required (at least {BREAK_GLASS_REASON_MIN} characters, shown to project members)"
            )
        role = parse_role(data.get("role"), "admin")
        minutes = data.get("minutes")
        if minutes is None:
            minutes = BREAK_GLASS_DEFAULT_MINUTES
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or int(minutes) != minutes or minutes < 1:
            raise BadRequest("minutes must be a positive whole number")
        if minutes > BREAK_GLASS_MAX_MINUTES:
            raise BadRequest("a break-glass grant may last at most 24 hours (1440 minutes)")
        return {**data, "reason": reason.strip(), "role": role, "minutes": int(minutes)}


class InvitationAccept(RequestModel):
    """`POST /v1/invitations/accept`: `password` only when no account exists (never changes an existing one)."""

    token: str = Field(description="the invitation token; a bad one is 404 `invalid invitation link`")
    password: str | None = Field(None, description="at least 12 characters; for a new account only")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        token = data.get("token")
        password = data.get("password")
        return {**data, "token": token if isinstance(token, str) else "",
                "password": password if isinstance(password, str) else None}


class ServiceAccountCreate(RequestModel):
    """`POST .../service-accounts`. `description` is an alias of `display_name` (display_name wins)."""

    name: str = Field(max_length=63, pattern=validation.SERVICE_ACCOUNT_NAME.pattern, description="a DNS-1035 label")
    display_name: str = ""
    description: str | None = Field(None, description="alias of display_name")
    role: MemberRole = "member"

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("name")
        if not isinstance(name, str) or not validation.SERVICE_ACCOUNT_NAME.match(name):
            raise BadRequest(SERVICE_ACCOUNT_NAME_MESSAGE)
        display = data.get("display_name") or data.get("description") or ""
        if not isinstance(display, str):
            raise BadRequest("display_name must be a string")
        description = data.get("description")
        return {**data, "display_name": display.strip(), "role": parse_role(data.get("role"), "member"),
                "description": description if isinstance(description, str) else None}


# ------------------------------------------------------------------------------------------ views


class Project(ResponseModel):
    id: str
    org_id: str
    slug: str = Field(description="renameable handle")
    name: str
    short: str = Field(description="immutable id fragment used in the namespace and hostnames")
    namespace: str = Field(description="`cai-p-<short>`, immutable")
    created_at: str
    your_role: MemberRole | None = Field(None, description="contents (resource) authority; absent when none")
    your_metadata_role: MemberRole | None = Field(None, description="object authority; absent when none")


class ProjectList(ListPage):
    items_field: ClassVar[str] = "projects"
    projects: list[Project]


class ProjectCreated(ResponseModel):
    project: Project
    warning: str | None = Field(None, description="a provisioning step that failed (non-fatal)")
    note: str | None = None


class ProjectUpdated(ResponseModel):
    project: Project
    note: str


class ProjectDeleted(ResponseModel):
    deleted: bool
    project: str = Field(description="the deleted project's slug")


class CloudMapping(ResponseModel):
    project: str = Field(description="the project's slug")
    mapped: bool
    mapping: dict[str, Any] | None = Field(description="null when unmapped")
    note: str | None = None


class ProjectMember(ResponseModel):
    user_id: str
    email: str
    role: MemberRole
    kind: Literal["user", "service_account"]
    service_account_id: str | None = None
    external: bool
    created_at: str
    break_glass: bool | None = None
    expires_at: str | None = None
    reason: str | None = None
    granted_by: str | None = None
    expired: bool | None = Field(None, description="true once a break-glass grant has expired")


class ProjectMemberList(ListPage):
    items_field: ClassVar[str] = "members"
    members: list[ProjectMember]


class MemberAdded(ResponseModel):
    member: ProjectMember
    note: str


class MemberRoleChanged(ResponseModel):
    user_id: str
    role: MemberRole


class ServiceAccountRole(ResponseModel):
    service_account_id: str
    role: MemberRole


class MemberRemoved(ResponseModel):
    deleted: bool
    user_id: str
    note: str


class ServiceAccountGrantRemoved(ResponseModel):
    deleted: bool
    service_account_id: str
    note: str


class BreakGlassGrant(ResponseModel):
    grant: ProjectMember
    note: str


InvitationState = Literal["open", "accepted", "revoked", "expired"]


class Invitation(ResponseModel):
    id: str
    email: str
    role: MemberRole
    state: InvitationState
    created_at: str
    expires_at: str
    accept_url: str | None = Field(None, description="`/invite/<token>`, on creation only")
    token: str | None = Field(None, description="on creation only")


class InvitationList(ListPage):
    items_field: ClassVar[str] = "invitations"
    invitations: list[Invitation]


class InvitationSent(ResponseModel):
    """An invitation; or, when the address already has an account, the member row granted directly."""

    invitation: Invitation | None = None
    member: ProjectMember | None = None
    note: str


class InvitationRevoked(ResponseModel):
    invitation: Invitation
    note: str


class InvitationPreview(ResponseModel):
    project_name: str
    project_slug: str
    email: str
    role: MemberRole
    expires_at: str
    account_exists: bool


class InvitationAccepted(ResponseModel):
    accepted: bool
    project_id: str
    role: MemberRole
    email: str
    note: str


class ServiceAccount(ResponseModel):
    id: str
    project_id: str
    name: str
    email: str = Field(description="`<name>@<project short>.cai.local`, derived and immutable")
    display_name: str
    role: MemberRole | None = None
    disabled: bool
    created_at: str


class ServiceAccountList(ListPage):
    items_field: ClassVar[str] = "service_accounts"
    service_accounts: list[ServiceAccount]


class ServiceAccountCreated(ResponseModel):
    service_account: ServiceAccount
    note: str


class ServiceAccountDeleted(ResponseModel):
    deleted: bool
    service_account: str = Field(description="the deleted account's e-mail")
    note: str


class QuotaEntry(ResponseModel):
    resource: str
    used: str
    hard: str
    used_pct: int = Field(description="0 when hard is 0 or lower (unlimited)")
    display: str = Field(description="the resource's label")


class ProjectQuota(ResponseModel):
    project: str
    namespace: str
    quotas: list[QuotaEntry]
    note: str


class AuditEntry(ResponseModel):
    ts: str
    actor: str = Field(description="empty when the platform acted")
    action: str
    target: str
    detail: str


class AuditEntryList(ListPage):
    items_field: ClassVar[str] = "entries"
    entries: list[AuditEntry] = Field(description="newest first")
