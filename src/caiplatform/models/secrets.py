"""The project secret store's models (document 2, "Project secrets"): secrets, read tokens, bindings.

The rules with the specification's messages are in `caiplatform.domain.secrets`; a request model runs them
before its own fields are checked, so a caller sees the spec's message and never pydantic's. Values never appear in a view except
the audited reveal.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, Field, model_validator

from caiplatform.domain import secrets as rules
from caiplatform.errors import BadRequest
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

# ------------------------------------------------------------------------------------------ requests


class SecretWrite(RequestModel):
    """`POST .../secrets`: create a secret (201) or store its next version (200). Capped at 128 KiB."""

    name: str = Field(description="1 to 63 characters: ^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$", max_length=63)
    value: str = Field(min_length=1, description="non-empty, at most 65536 bytes; never returned by reads")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        rules.check_name(data.get("name"))
        rules.check_value(data.get("value"))
        return data


class SecretReveal(RequestModel):
    """`POST .../secrets/{name}:reveal` (project admin). Optional; a malformed body reveals the current
    version, so nothing in it is refused: an unusable `version` means the current one."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    version: int = Field(0, ge=0, description="0 or absent: the current version")
    reason: str = Field("", description="recorded in the audit log with the reveal")

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return {}
        raw = data.get("version")
        if isinstance(raw, str) and raw.strip().isdigit():
            raw = int(raw.strip())
        version = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
        reason = data.get("reason")
        return {"version": max(version, 0), "reason": reason if isinstance(reason, str) else ""}


class SecretIssueToken(RequestModel):
    """Body of both `:issue-token` routes (optional): the TTL asked for, clamped silently to 3600."""

    ttl_seconds: int = Field(300, description="default 300, clamped to 3600 (the store may clamp further)")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {**data, "ttl_seconds": rules.ttl_of(data.get("ttl_seconds"))}


class BindingPut(RequestModel):
    """`PUT .../agents/{agent}/secret-maps/{envName}`: bind a secret; `version` null or absent tracks the
    newest. Capped at 8 KiB."""

    secret_name: str = Field(description="the name of a secret of this project (must exist)")
    version: int | None = Field(None, ge=1, description="a pinned version (a digit string is accepted), or null")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        secret_name = data.get("secret_name")
        if not isinstance(secret_name, str) or not secret_name:
            raise BadRequest(rules.SECRET_NAME_REQUIRED_MESSAGE)
        return {**data, "version": rules.pin_of(data.get("version"))}


# ------------------------------------------------------------------------------------------ views


class SecretSummary(ResponseModel):
    """A list item: metadata only, no version history."""

    name: str
    current_version: int
    created_at: str | None
    updated_at: str | None


class SecretList(ListPage):
    items_field: ClassVar[str] = "secrets"
    secrets: list[SecretSummary]
    path_prefix: str = Field(description="where the project's secrets live in the secret store")


class SecretVersion(ResponseModel):
    version: int
    created_at: str | None
    destroyed: bool


class SecretUse(ResponseModel):
    """A binding pointing at a secret; `version` is omitted when the binding tracks the newest."""

    id: str
    agent_id: str
    agent_slug: str
    env_name: str
    version: int | None = None
    created_at: str | None
    updated_at: str | None


class Secret(ResponseModel):
    """The secret object (metadata only); `used_by` is absent, not empty, when nothing binds it."""

    name: str
    current_version: int
    created_at: str | None
    updated_at: str | None
    versions: list[SecretVersion]
    used_by: list[SecretUse] | None = None


class SecretVersions(ResponseModel):
    name: str
    current_version: int
    versions: list[SecretVersion]


class SecretWritten(ResponseModel):
    """201 for a first version (`created: true`), 200 for a rotation."""

    name: str
    version: int
    created: bool
    note: str


class SecretDeleted(ResponseModel):
    name: str
    deleted: bool
    note: str


class SecretRevealResult(ResponseModel):
    name: str
    version: int
    value: str
    note: str


class SecretReadLocation(ResponseModel):
    addr: str
    path: str


class SecretIssueTokenResult(ResponseModel):
    """A token presented directly to the secret store (header X-Vault-Token); it reads only."""

    token: str
    ttl_seconds: int
    read: SecretReadLocation
    note: str


class Binding(ResponseModel):
    """Stored secret `secret_name` arrives as `env_name` on the agent; `pinned_to` is `latest` or a version."""

    id: str
    agent_id: str
    agent_slug: str
    env_name: str
    secret_name: str
    pinned_to: str
    version: int | None = None
    created_at: str | None
    updated_at: str | None


class BindingList(ListPage):
    items_field: ClassVar[str] = "bindings"
    bindings: list[Binding]


class AgentBindings(ResponseModel):
    agent: str
    bindings: list[Binding]


class BindingSaved(ResponseModel):
    binding: Binding
    note: str


class BindingRemoved(ResponseModel):
    """When `revoked` is false the note says to treat the credential as exposed and rotate it."""

    agent: str
    env_name: str
    deleted: bool
    revoked: bool
    revision_rolled: bool
    note: str


class BindingApplied(ResponseModel):
    env_name: str
    secret_name: str
    version: int | None
    applied: bool


class BindingsApplied(ResponseModel):
    agent: str
    applied: list[BindingApplied]
    revision_rolled: bool
    note: str
