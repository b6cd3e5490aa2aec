"""Accounts, organizations, personal and service-account keys, search and the profile (document 2).

Each request model runs the rules that carry the specification's messages (`caiplatform.validation`
and the constants below) before pydantic's own checks. Rules that need the database or the caller
(the last admin, an organization's existence, who may create where) stay in the services.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from caiplatform import validation
from caiplatform.errors import BadRequest
from caiplatform.models.auth import PlatformRole
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

OrgRole = Literal["admin", "member"]

ROLES = ("admin", "user")
ORG_ROLES = ("admin", "member")
ORG_ROLE_MESSAGE = "role must be admin or member"
USER_ROLE_MESSAGE = "role must be admin or user"
ORG_ID_MESSAGE = "invalid orgID: must be a UUID"
BODY_ORG_ID_MESSAGE = "invalid org_id: must be a UUID"
SLUG_MESSAGE = "invalid slug (must be a lowercase DNS label, at most 63 characters)"
MAX_KEY_DAYS = 3650
EXPIRY_MESSAGE = f"expires_in_days must be 0 (never expires) or between 1 and {MAX_KEY_DAYS}"
DISPLAY_NAME_MAX = 200


def org_uuid(raw: Any, message: str = ORG_ID_MESSAGE) -> str:
    if not validation.is_uuid(raw):
        raise BadRequest(message)
    return str(raw).lower()


def parse_slug(raw: Any) -> str:
    slug = raw.strip().lower() if isinstance(raw, str) else ""
    if not validation.SLUG.match(slug):
        raise BadRequest(SLUG_MESSAGE)
    return slug


def optional_org_id(raw: Any) -> str | None:
    """A body's `org_id`: absent or empty means the caller's home organization."""
    return org_uuid(raw, BODY_ORG_ID_MESSAGE) if raw not in (None, "") else None


def optional_name(raw: Any, fallback: str) -> str:
    """A display name that defaults to the slug."""
    if raw is not None and not isinstance(raw, str):
        raise BadRequest("name must be a string")
    return (raw or "").strip() or fallback


# ------------------------------------------------------------------------------------------ requests


class UserCreate(RequestModel):
    """`POST /v1/users`. Without a password a temporary one is generated and returned once."""

    email: str = Field(description="lowercased and trimmed")
    role: PlatformRole = "user"
    password: str | None = Field(None, description="at least 12 characters; absent or empty: a temporary one")
    org_id: str | None = Field(None, description="the home organization; default the creator's")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        email = validation.email(data.get("email"))
        role = data.get("role") or "user"
        if role not in ROLES:
            raise BadRequest(USER_ROLE_MESSAGE)
        password = data.get("password")
        if password == "":
            password = None
        if password is not None:
            validation.password(password)
        return {**data, "email": email, "role": role, "password": password, "org_id": optional_org_id(data.get("org_id"))}


class UserRolePatch(RequestModel):
    """`PATCH /v1/users/{email}`: the platform role."""

    role: PlatformRole

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("role") in (None, ""):
            raise BadRequest("nothing to update: send {\"role\": \"admin\"|\"user\"}")
        if data["role"] not in ROLES:
            raise BadRequest(USER_ROLE_MESSAGE)
        return data


class OrgCreate(RequestModel):
    """`POST /v1/orgs`: the slug is lowercased and trimmed; the name defaults to it."""

    slug: str = Field(max_length=63, pattern=validation.SLUG.pattern)
    name: str = ""

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        slug = parse_slug(data.get("slug"))
        return {**data, "slug": slug, "name": optional_name(data.get("name"), slug)}


def org_role(raw: Any, default: str | None = None) -> str:
    role = raw if raw not in (None, "") else default
    if role not in ORG_ROLES:
        raise BadRequest(ORG_ROLE_MESSAGE)
    return role


class OrgMemberAdd(RequestModel):
    """`POST /v1/orgs/{orgID}/members`."""

    email: str
    role: OrgRole = "member"

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, "email": validation.email(data.get("email")), "role": org_role(data.get("role"), "member")}


class OrgMemberPatch(RequestModel):
    """`PATCH /v1/orgs/{orgID}/members/{userID}`."""

    role: OrgRole

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, "role": org_role(data.get("role"))}


class ApiKeyCreate(RequestModel):
    """`POST /v1/users/me/keys` and `POST .../service-accounts/{sa}/keys`. `description` is an alias of
    `display_name` (display_name wins)."""

    display_name: str = Field("", max_length=DISPLAY_NAME_MAX)
    description: str | None = Field(None, description="alias of display_name")
    expires_in_days: int = Field(0, ge=0, le=MAX_KEY_DAYS, description="0 or absent: never expires")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("display_name", data.get("description", ""))
        if name is None:
            name = ""
        if not isinstance(name, str) or len(name) > DISPLAY_NAME_MAX:
            raise BadRequest(f"display_name must be a string of at most {DISPLAY_NAME_MAX} characters")
        days = data.get("expires_in_days")
        if days is None:
            days = 0
        if isinstance(days, bool) or not isinstance(days, int | float) or int(days) != days:
            raise BadRequest(EXPIRY_MESSAGE)
        days = int(days)
        if days != 0 and not 1 <= days <= MAX_KEY_DAYS:
            raise BadRequest(EXPIRY_MESSAGE)
        description = data.get("description")
        return {**data, "display_name": name.strip(), "expires_in_days": days,
                "description": description if isinstance(description, str) else None}


class ModelKeySet(RequestModel):
    """`PUT /v1/profile/model-key`."""

    api_key: str = Field(description="the platform-wide default model key (trimmed)")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        key = data.get("api_key")
        if not isinstance(key, str) or not key.strip():
            raise BadRequest("missing 'api_key': the platform-wide default model key")
        return {**data, "api_key": key.strip()}


# ------------------------------------------------------------------------------------------ views


class User(ResponseModel):
    id: str
    email: str
    role: PlatformRole
    must_change_password: bool
    org_id: str | None = Field(None, description="absent for external users")
    external: bool = Field(description="no home organization (joined by invitation)")
    created_at: str
    projects: list[str] = Field(description="project slugs")
    agents: list[str] = Field(description="agent names, limited to the caller's resource grants")
    agent_count: int


class UserList(ListPage):
    items_field: ClassVar[str] = "users"
    users: list[User]
    unowned_agents: list[dict[str, Any]] = Field(description="agents with no recorded owner, as agent views")


class UserCreated(ResponseModel):
    user: User
    temporary_password: str | None = Field(None, description="shown only once, when one was generated")
    note: str


class UserRoleChanged(ResponseModel):
    user: User
    note: str


class UserDeleted(ResponseModel):
    deleted: str = Field(description="the deleted account's e-mail")
    note: str


class PasswordReset(ResponseModel):
    email: str
    temporary_password: str
    note: str


class Org(ResponseModel):
    id: str
    slug: str
    name: str
    created_at: str
    projects: int = Field(description="count")
    users: int = Field(description="count")


class OrgList(ListPage):
    items_field: ClassVar[str] = "orgs"
    orgs: list[Org]


class OrgCreated(ResponseModel):
    org: Org


class OrgDeleted(ResponseModel):
    deleted: bool
    org: str = Field(description="the deleted organization's slug")


class OrgMember(ResponseModel):
    user_id: str
    email: str
    role: OrgRole
    created_at: str


class OrgMemberList(ListPage):
    items_field: ClassVar[str] = "members"
    members: list[OrgMember]


class OrgMemberChanged(ResponseModel):
    """An added member (201; 200 when already a member with that role) or a changed role."""

    member: OrgMember
    note: str | None = None
    #: True when the call added the member (the HTTP answer is then 201); not part of the JSON
    created: bool = Field(False, exclude=True)


class OrgMemberRemoved(ResponseModel):
    deleted: bool
    user_id: str
    note: str


class ApiKey(ResponseModel):
    """A personal or service-account key. No field can carry a secret."""

    id: str
    key_id: str
    display_name: str
    kind: Literal["personal", "service_account", "workload"]
    created_at: str
    expires_at: str | None = None
    last_used_at: str | None = None
    revoked_at: str | None = None
    live: bool = Field(description="false once revoked or expired")


class ApiKeyList(ResponseModel):
    keys: list[ApiKey] = Field(description="newest first")


class ApiKeyCreated(ResponseModel):
    key: ApiKey
    secret: str = Field(description="the whole key, `cai_<key_id>_<secret>`: shown only in this response")
    note: str


class ApiKeyRevoked(ResponseModel):
    revoked: str = Field(description="the key_id")
    note: str


SearchKind = Literal["agent", "function", "service", "mcp_server", "service_account", "secret", "project"]


class SearchResult(ResponseModel):
    kind: SearchKind
    name: str
    project: str = Field(description="the project's slug")
    project_short: str
    route: str
    subtitle: str


class SearchResults(ListPage):
    items_field: ClassVar[str] = "results"
    results: list[SearchResult]


class Profile(ResponseModel):
    """`GET /v1/profile` and the model-key writes (these add `note`, and `warning` when a resync missed)."""

    model_key_configured: bool
    secret: str
    namespace: str
    scope: Literal["platform"]
    note: str | None = None
    warning: str | None = None


class CacheAclBackfill(ResponseModel):
    projects: int = Field(description="how many projects were tried")
    backfilled: list[str] = Field(description="slugs")
    failed: dict[str, str] = Field(description="slug: why")
    note: str

