"""The agent management API's models (document 1): the deploy form, the agent view, env, secrets,
compute config, traffic, revisions, logs, stored files, spec, metrics and the embed config.

The rules with the specification's messages live in `caiplatform.domain.agents`; each request model runs
them before its own fields are checked, so a caller sees the spec's message and never pydantic's.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import ConfigDict, Field, RootModel, model_validator

from caiplatform.domain import agents as rules
from caiplatform.errors import BadRequest
from caiplatform.models.base import ListPage, OpenResponseModel, RequestModel, ResponseModel, parse_request

AgentState = Literal["building", "deploying", "ready", "failed"]
EnvScalar = str | int | float | bool | None


# ------------------------------------------------------------------------------------------ requests


class DeployForm(RequestModel):
    """`POST /v1/agents` (multipart/form-data). Any other field is 400 naming it; the project is the
    query parameter `project`, never a form field."""

    name: str = Field(description="lowercase DNS label, at most 63 characters")
    code: bytes = Field(json_schema_extra={"format": "binary"}, description="the .tar.gz of the agent directory")
    framework: Literal["adk", "langgraph", "crewai", "function", "container"] = "adk"
    runtime: Literal["python", "nodejs", "go", "ruby"] = Field(
        "python", description="functions only (sending it with an agent framework is 400)")
    config: str = Field("", description="JSON text of the compute config, as the config PATCH body")


class SetRemove(RequestModel):
    """The env and secrets PATCH body: `{set: map, remove: [names]}`; an empty value in `set` removes."""

    what: ClassVar[str] = "env"

    set: dict[str, EnvScalar] = Field(default_factory=dict)
    remove: list[str] = Field(default_factory=list)

    @classmethod
    def parse(cls, body: Any) -> Self:
        if not isinstance(body, dict):
            raise BadRequest(rules.NOTHING_TO_DO)
        return parse_request(cls, body)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, cls) or not isinstance(data, dict):
            return data
        set_, remove = rules.set_remove(data)
        if cls.what == "secret":
            values = rules.check_secret_map(set_)
            rules.check_names(remove)
        else:
            rules.check_names([*set_, *remove])
            values = {k: rules.env_value(k, v, "env") for k, v in set_.items()}
        return {**data, "set": values, "remove": remove}

    def values(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.set.items()}


class EnvPatch(SetRemove):
    """`PATCH /v1/agents/{name}/env`. Exposure variables are checked later, on the deploy path."""


class SecretsPatch(SetRemove):
    """`PATCH /v1/agents/{name}/secrets`."""

    what: ClassVar[str] = "secret"


class SecretsReplace(RootModel[dict[str, EnvScalar]]):
    """`PUT /v1/agents/{name}/secrets`: a flat map of keys to values that replaces the whole set; empty
    values are dropped. Values are write-only."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, cls):
            return data
        return rules.check_secret_map(data)

    @classmethod
    def parse(cls, body: Any) -> Self:
        if isinstance(body, cls):
            return body
        return cls.model_validate(body)

    def values(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.root.items() if value not in ("", None)}


class SourceFileWrite(RequestModel):
    """`PUT /v1/agents/{name}/files/{path}`: the file's new text."""

    content: str

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("content"), str):
            raise BadRequest("'content' is required and must be a string")
        return data


class TrafficShare(RequestModel):
    revision_name: str
    percent: int = Field(ge=0, le=100)


class TrafficSplit(RequestModel):
    """`POST /v1/agents/{name}/set-traffic`: the complete split, percentages summing to exactly 100."""

    traffic: list[TrafficShare]

    @classmethod
    def parse(cls, body: Any) -> Self:
        if not isinstance(body, dict):
            raise BadRequest(rules.TRAFFIC_REQUIRED)
        return parse_request(cls, body)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, cls) or not isinstance(data, dict):
            return data
        rules.traffic_split(data)  # the spec's messages; an entry's unknown field is still refused after
        return data


Removable = Literal[""] | None
Count = Annotated[int, Field(ge=0)]


class ScalingPatch(RequestModel):
    min_scale: Count | Removable = Field(None, description="instance floor; 1 avoids cold starts")
    max_scale: Count | Removable = Field(None, description="instance ceiling; 0 means unbounded")
    container_concurrency: Count | Removable = Field(None, description="simultaneous requests per instance")


class QuantitiesPatch(RequestModel):
    cpu: str | None = Field(None, description="a resource quantity, e.g. 100m")
    memory: str | None = Field(None, description="a resource quantity, e.g. 256Mi")


class ResourcesPatch(RequestModel):
    requests: QuantitiesPatch | Removable = None
    limits: QuantitiesPatch | Removable = None


class ConfigPatch(RequestModel):
    """`PATCH /v1/agents/{name}/config` (and the deploy form's `config`): sparse; an omitted field keeps its
    value and an empty one (null or "") removes that entry. `{"config": {...}}` is accepted too."""

    scaling: ScalingPatch | Removable = None
    resources: ResourcesPatch | Removable = None
    timeout_seconds: Annotated[int, Field(ge=1)] | Removable = Field(None, description="request timeout")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, cls):
            return data
        rules.merge_config({}, data)  # the spec's messages, before pydantic's
        if isinstance(data, dict) and set(data) == {"config"} and isinstance(data["config"], dict):
            return data["config"]
        return data

    def changes(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class EmbedUpdate(RequestModel):
    """`PUT /v1/agents/{name}/embed`: a partial update, every field optional; `embed_key` and
    `updated_at` are read-only and ignored."""

    enabled: bool | None = None
    allowed_origins: list[str] | None = Field(None, description="scheme://host[:port] or *")
    position: Literal["left", "right"] | None = None
    title: str | None = None
    subtitle: str | None = None
    greeting: str | None = None
    accent_color: str | None = None
    launcher_text: str | None = None
    embed_key: str | None = Field(None, description="read-only: ignored")
    updated_at: str | None = Field(None, description="read-only: ignored")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, cls):
            return data
        rules.merge_embed(None, data)
        return data

    def changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if k not in ("embed_key", "updated_at")}


# ------------------------------------------------------------------------------------------ views


class AgentView(ResponseModel):
    """An agent or function, as a single read and each list item show it."""

    name: str
    state: AgentState
    status: AgentState = Field(description="the same value as state")
    ready: bool = Field(description="true exactly when state is ready")
    kind: Literal["agent", "function"]
    framework: str
    runtime: str | None = Field(None, description="functions only")
    image: str
    url: str = Field(description="the internal address")
    public_url: str = Field(description="a reservation, not a live endpoint until published")
    latest_revision: str
    owner: str = Field(description="the deployer's e-mail; empty for tokenless deploys")
    project: str
    project_id: str
    created_at: str
    updated_at: str
    external_url: str | None = Field(None, description="present once the public address answers")
    message: str | None = Field(None, description="the last error or build output; omitted when empty")


class AgentList(ListPage):
    items_field: ClassVar[str] = "agents"
    agents: list[AgentView]


class DeployAccepted(ResponseModel):
    agent: str
    build_id: str
    note: str | None = None


class RedeployAccepted(ResponseModel):
    agent: str
    build_id: str
    files: int
    note: str


class AgentDeleted(ResponseModel):
    agent: str
    deleted: bool


class LogLine(ResponseModel):
    ts: str
    revision: str
    pod: str
    stream: str
    message: str


class LogHistory(ResponseModel):
    agent: str
    lines: list[LogLine] = Field(description="oldest first")
    count: int
    note: str


class SecretKeys(ResponseModel):
    agent: str
    keys: list[str]


class SecretsUpdated(ResponseModel):
    agent: str
    secrets_updated: bool
    keys: list[str] | None = None


class AgentEnv(ResponseModel):
    agent: str
    env: dict[str, str]


class EnvUpdated(ResponseModel):
    agent: str
    env_updated: bool
    env: dict[str, str]


class SourceFileEntry(ResponseModel):
    path: str
    size: int
    updated_at: str


class SourceFiles(ResponseModel):
    agent: str
    agent_id: str
    files: list[SourceFileEntry]
    editable: bool
    note: str


class SourceFile(ResponseModel):
    path: str
    content: str
    updated_at: str


class SourceFileWritten(ResponseModel):
    path: str
    bytes: int
    note: str


class SourceFileDeleted(ResponseModel):
    deleted: str


class Revision(ResponseModel):
    name: str
    generation: int
    traffic_percent: int
    tag: str | None = None
    created_at: str
    ready: bool
    state: Literal["ready", "not_ready", "unknown"]
    reason: str
    message: str
    replicas: int
    image: str
    url: str


class RevisionList(ResponseModel):
    agent: str
    revisions: list[Revision] = Field(description="newest first")


class TrafficAssignment(ResponseModel):
    revision_name: str
    percent: int


class TrafficSet(ResponseModel):
    agent: str
    traffic: list[TrafficAssignment]


class Scaling(ResponseModel):
    min_scale: int | None = None
    max_scale: int | None = None
    container_concurrency: int | None = None


class Quantities(ResponseModel):
    cpu: str | None = None
    memory: str | None = None


class ComputeResources(ResponseModel):
    requests: Quantities | None = None
    limits: Quantities | None = None


class ComputeConfig(ResponseModel):
    scaling: Scaling | None = None
    resources: ComputeResources | None = None
    timeout_seconds: int | None = None


class AgentConfig(ResponseModel):
    agent: str
    config: ComputeConfig | None = Field(description="null while the agent runs on platform defaults")


class ConfigUpdated(ResponseModel):
    agent: str
    config_updated: bool
    config: ComputeConfig | None


class AgentSpec(ResponseModel):
    agent: str
    yaml: str
    note: str


class RevisionCount(ResponseModel):
    name: str
    ready: bool
    state: str
    replicas: int
    traffic_percent: int


class AgentMetrics(ResponseModel):
    agent: str
    instances: int
    revisions: list[RevisionCount]
    readiness: str
    latest_ready_revision: str
    target_concurrency: int
    note: str


class EmbedConfig(ResponseModel):
    """The chat widget's config; an unset one reads enabled false, no origins, position right."""

    agent: str
    enabled: bool
    embed_key: str
    allowed_origins: list[str]
    position: Literal["left", "right"]
    title: str
    subtitle: str
    greeting: str
    accent_color: str
    launcher_text: str
    updated_at: str


class EmbedDeleted(ResponseModel):
    agent: str
    deleted: bool


# ------------------------------------------------------------------------------------------ tool sandbox


class SandboxToolCall(RequestModel):
    """`POST /v1/projects/{project_id}/sandbox/tool-calls`: one of the calling agent's own tool functions."""

    module_path: str = Field(description="a .py file of the agent's code, relative")
    function: str = Field(description="a (dotted) Python name")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    timeout_s: int = Field(30, ge=1, le=120)

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        """The tool call's messages (document 1's limits for `timeout_s`), before pydantic's own checks."""
        if not isinstance(data, dict):
            return data
        from pathlib import PurePosixPath

        from caiplatform.codesandbox.limits import TOOL

        module_path, function = data.get("module_path"), data.get("function")
        if not isinstance(module_path, str) or not module_path.endswith(".py") or \
                PurePosixPath(module_path).is_absolute() or ".." in PurePosixPath(module_path).parts:
            raise BadRequest("invalid 'module_path': a relative path of a .py file of the agent's code")
        if not isinstance(function, str) or not all(p.isidentifier() for p in function.split(".")):
            raise BadRequest("invalid 'function': a (dotted) Python name")
        args = data.get("args") or {}
        if not isinstance(args, dict):
            raise BadRequest("invalid 'args': expected a JSON object of keyword arguments")
        return {**data, "args": args, "timeout_s": TOOL.check_timeout(data.get("timeout_s"))}


class SandboxToolAnswer(OpenResponseModel):
    """`{result}` or `{error}`, with how the call ran."""

    result: Any = None
    error: str | None = None
    killed: Literal["timeout", "memory"] | None
    message: str | None
    duration_ms: int
    startup_ms: int
    timeout_s: int
