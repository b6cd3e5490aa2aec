"""Hosted MCP servers' models (document 2, "MCP servers"): servers, tools, versions and their verbs.

The rules with the specification's messages are in `caiplatform.domain.mcp`; a request model runs them
before its own fields are checked.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from caiplatform.domain import mcp as rules
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

McpStatus = Literal["pending", "building", "deploying", "ready", "failed"]

# ------------------------------------------------------------------------------------------ requests


class McpServerCreate(RequestModel):
    """`POST .../mcpservers` (admin). Other fields are ignored silently (no warm-instance setting exists)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: str = Field(max_length=40, description="a lowercase DNS label, immutable: ^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
    expose: Literal["", "apps"] = Field("", description='"" (cluster-local) or "apps" (published); fixed at creation')

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name, expose = rules.parse_server_create(data)
        return {**data, "name": name, "expose": expose}


class McpToolPublish(RequestModel):
    """`PUT .../mcpservers/{name}/tools/{tool}` (admin): a full replace of the tool's record, so omitted
    `description` or `credential_keys` are cleared. `credentialKeys` is the same field's other spelling."""

    handler: str = Field(description="the complete Python module of the tool (import caiplatform.mcp, decorate with @tool)")
    description: str = ""
    tool_schema: dict[str, Any] = Field(default_factory=dict, alias="schema", description="catalog metadata")
    credential_keys: list[str] = Field(default_factory=list, description="secret names the tool may read")
    credentialKeys: list[str] | None = Field(None, description="the same as credential_keys", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        handler, description, schema, keys = rules.parse_tool(data)
        normalized = {"handler": handler, "description": description, "schema": schema, "credential_keys": keys}
        rest = {k: v for k, v in data.items() if k != "credentialKeys"}
        return {**rest, **normalized}


# ------------------------------------------------------------------------------------------ views


class McpServer(ResponseModel):
    """`url`, `version` and `image` appear once a version serves; `message` says why a build failed."""

    name: str
    visibility: Literal["private", "org", "public"]
    expose: Literal["", "apps"]
    status: McpStatus
    url: str | None = Field(None, description="MCP at path /mcp; GET /healthz is open")
    version: int | None = None
    image: str | None = None
    tool_names: list[str]
    tool_count: int
    message: str | None = None
    created_at: str


class McpServerEnvelope(ResponseModel):
    mcp_server: McpServer


class McpServerList(ListPage):
    items_field: ClassVar[str] = "mcpservers"
    mcpservers: list[McpServer]


class McpServerDeleted(ResponseModel):
    name: str
    deleted: bool


class McpServerToken(ResponseModel):
    """The server's bearer token (`cai_mcp_` and 64 hex), for the project's admins."""

    server: str
    token: str


class McpTool(ResponseModel):
    name: str
    description: str
    handler: str
    tool_schema: dict[str, Any] = Field(alias="schema")
    credential_keys: list[str]
    credentialKeys: list[str]
    updated_at: str


class McpToolList(ResponseModel):
    server: str
    tools: list[McpTool]


class McpToolPublished(ResponseModel):
    server: str
    name: str
    published: bool
    build_id: str
    note: str


class McpToolDeleted(ResponseModel):
    server: str
    name: str
    deleted: bool
    build_id: str
    note: str


class McpVersion(ResponseModel):
    """`image_digest` once its build succeeded; `yanked` and `yanked_at` only on retired versions."""

    version: int
    image_digest: str | None = None
    credential_keys: list[str]
    tool_names: list[str]
    tool_count: int
    current: bool
    yanked: bool | None = None
    yanked_at: str | None = None
    created_at: str


class McpVersionList(ResponseModel):
    server: str
    versions: list[McpVersion]


class McpVersionRollback(ResponseModel):
    server: str
    version: int
    image: str
    rolled_back: bool
    note: str


class McpVersionYank(ResponseModel):
    """`:yank`: `yanked: true` (the version is retired as a rollback target, not deleted)."""

    server: str
    version: int
    yanked: bool


class McpVersionUnyank(McpVersionYank):
    """`:unyank`: `yanked: false`."""
