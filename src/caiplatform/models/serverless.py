"""The serverless API's models (document 3): services, revisions, traffic, triggers and the health answer.

The rules with the specification's messages live in `caiplatform.domain.serverless` (and, for triggers,
in `caiplatform.domain.serverless_triggers`); each request model runs them before its own fields
are checked, so a caller sees the spec's message and never pydantic's. Rules that need the service's own
state (which revisions exist, whether a trigger's target exists) stay in the services.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from caiplatform.domain import serverless as rules
from caiplatform.domain import serverless_triggers as trigger_rules
from caiplatform.models.base import ListPage, OpenResponseModel, RequestModel, ResponseModel

PortName = Literal["http1", "h2c"]
Phase = Literal["Pending", "Ready", "NotReady", "Degraded", "Invalid"]
Tristate = Literal["True", "False", "Unknown"]


class _Part(BaseModel):
    """A block of a service's spec: the same shape in a request and in the Service object."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ServicePort(_Part):
    name: PortName = rules.DEFAULT_PORT_NAME
    container_port: int = Field(rules.DEFAULT_PORT, ge=1, le=65535)


class ServiceEnvFrom(_Part):
    """Exactly one of `secret_name` (a project secret) or `config_map_name`."""

    secret_name: str = ""
    config_map_name: str = ""
    optional: bool = False


class ServiceScaling(_Part):
    """A block sent replaces the whole block: omitted sub-fields revert to 0, 10, 80."""

    min_scale: int = Field(rules.DEFAULT_MIN_SCALE, ge=0, description="instance floor")
    max_scale: int = Field(rules.DEFAULT_MAX_SCALE, ge=0, description="ceiling; 0 behaves as 10")
    container_concurrency: int = Field(rules.DEFAULT_CONCURRENCY, ge=0, description="0: the serverless default")


class ServicePublish(_Part):
    enabled: bool = Field(False, description="true gives the public address https://<name>-<project-short>.{apps_domain}")
    host: str = Field("", description="accepted, stored and ignored")


class ServiceTrafficTarget(_Part):
    """One entry of a split: a named revision or the latest one, its percent and an optional tag."""

    revision_name: str = ""
    latest_revision: bool = False
    percent: int = Field(0, ge=0, le=100)
    tag: str = ""


Resources = dict[str, dict[str, str]]


def _plain(value: Any) -> Any:
    """A body as JSON values: a library caller may pass the nested models themselves."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _merge(raw: Any, normalized: Any) -> Any:
    """The normalized value, keeping the caller's unknown keys (so extra="forbid" still names them)."""
    if isinstance(raw, dict) and isinstance(normalized, dict):
        return {**raw, **{k: _merge(raw.get(k), v) for k, v in normalized.items()}}
    if isinstance(raw, list) and isinstance(normalized, list) and len(raw) == len(normalized):
        return [_merge(r, n) for r, n in zip(raw, normalized, strict=True)]
    return normalized


def _shape_of_traffic(value: Any, *, required: bool = False) -> list[dict[str, Any]]:
    """A split checked for everything but the existence of its revisions (the service knows those)."""
    items = value if isinstance(value, list) else []
    named = {item["revision_name"] for item in items if isinstance(item, dict) and isinstance(item.get("revision_name"), str)}
    entries = rules.parse_traffic(value, named, required=required)
    return [e.to_json() for e in entries]


# ------------------------------------------------------------------------------------------ requests


class ServiceCreate(RequestModel):
    """`POST .../services` (202): only `name` and `image` are required; the defaults are the spec's."""

    name: str = Field(max_length=rules.NAME_MAX, pattern=r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$",
                      description="1 to 52 characters; cannot be renamed")
    image: str = Field(description="a pullable reference: an image this platform built, a public image, or the project registry")
    command: list[str] = Field(default_factory=list, description="entrypoint override")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="plain variables, visible to anyone who can read the service")
    env_from: list[ServiceEnvFrom] = Field(default_factory=list)
    ports: list[ServicePort] = Field(default_factory=lambda: [ServicePort()], max_length=1)
    resources: Resources = Field(default_factory=rules.default_resources)
    scaling: ServiceScaling = Field(default_factory=ServiceScaling)
    publish: ServicePublish = Field(default_factory=ServicePublish)
    traffic: list[ServiceTrafficTarget] = Field(
        default_factory=lambda: [ServiceTrafficTarget(latest_revision=True, percent=100)])
    runtime_class_name: str = Field("", description="gvisor opts into the sandbox")
    service_account_name: str = ""
    timeout_seconds: int = Field(rules.DEFAULT_TIMEOUT, ge=rules.TIMEOUT_MIN, le=rules.TIMEOUT_MAX)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        name = data.get("name")
        spec = rules.parse_create(data, f"{name}-00001" if isinstance(name, str) else "")
        return _merge(data, spec.model_dump())

    def spec(self) -> rules.ServiceSpec:
        return rules.ServiceSpec.model_validate(self.model_dump())


class ServicePatch(RequestModel):
    """`PATCH .../services/{name}` (200): every create field is accepted; omitted fields are left alone and
    explicit zeros set zero. `generation` (as read) makes the update conditional: 409 when it moved on."""

    name: str | None = Field(None, description="must be the service's own name: a service cannot be renamed")
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    env_from: list[ServiceEnvFrom] | None = None
    ports: list[ServicePort] | None = Field(None, max_length=1)
    resources: Resources | None = None
    scaling: ServiceScaling | None = None
    publish: ServicePublish | None = None
    traffic: list[ServiceTrafficTarget] | None = None
    runtime_class_name: str | None = None
    service_account_name: str | None = None
    timeout_seconds: int | None = Field(None, ge=rules.TIMEOUT_MIN, le=rules.TIMEOUT_MAX)
    generation: int | None = Field(None, description="the generation the change was based on")
    observed_generation: int | None = Field(None, description="an alias of generation")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        parsers: dict[str, Any] = {
            "image": rules.parse_image,
            "command": lambda v: rules.parse_strings(v, "command"),
            "args": lambda v: rules.parse_strings(v, "args"),
            "env": rules.parse_env,
            "env_from": rules.parse_env_from,
            "ports": rules.parse_ports,
            "resources": rules.parse_resources,
            "scaling": rules.parse_scaling,
            "publish": rules.parse_publish,
            "timeout_seconds": rules.parse_timeout,
        }
        normalized: dict[str, Any] = {}
        for key, parse in parsers.items():
            if data.get(key) is not None:
                value = parse(data[key])
                normalized[key] = value.model_dump() if isinstance(value, BaseModel) else (
                    [v.model_dump() if isinstance(v, BaseModel) else v for v in value] if isinstance(value, list)
                    else value)
        if "image" in data and data["image"] is None:
            raise rules.BadRequest(rules.IMAGE_REQUIRED)
        if data.get("traffic") is not None:
            normalized["traffic"] = _shape_of_traffic(data["traffic"])
        for key in ("generation", "observed_generation"):
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise rules.BadRequest("generation must be an integer")
        return _merge(data, normalized)

    def changes(self) -> dict[str, Any]:
        """The fields the caller sent, as the domain's sparse update reads them."""
        return self.model_dump(exclude_unset=True)


class TrafficUpdate(RequestModel):
    """`POST .../services/{name}:set-traffic` (202): the complete split; percentages sum to 100."""

    traffic: list[ServiceTrafficTarget] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        return _merge(data, {"traffic": _shape_of_traffic(data.get("traffic"), required=True)})


class TriggerTarget(_Part):
    """A service, function or agent of the same project; an agent serves only /invoke and /invoke/stream."""

    service: str
    path: str = "/"


class TriggerSchedule(_Part):
    cron: str = Field(description="five fields: minute, hour, day of month, month, day of week")
    time_zone: str = "UTC"
    payload: str = Field("", description="a JSON document sent verbatim as the request body")


class TriggerObjectStore(_Part):
    bucket: str
    prefix: str = ""


class TriggerPubSub(_Part):
    topic: str


class TriggerSource(_Part):
    type: Literal["schedule", "objectstore", "pubsub"]
    schedule: TriggerSchedule | None = None
    objectstore: TriggerObjectStore | None = None
    pubsub: TriggerPubSub | None = None


def _trigger_parts(data: dict[str, Any]) -> dict[str, Any]:
    # A block left out, null or empty keeps what the trigger has (on create the rules above refused it).
    data = {k: v for k, v in data.items() if k not in ("target", "source") or v}
    normalized: dict[str, Any] = {}
    if "target" in data:
        normalized["target"] = trigger_rules.parse_target(data["target"])
    if "source" in data:
        normalized["source"] = trigger_rules.parse_source(data["source"])
    return _merge(data, normalized)


class TriggerCreate(RequestModel):
    """`POST .../triggers` (202): the trigger fires its target from its source; `pending`, then `ready`."""

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    target: TriggerTarget
    source: TriggerSource

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        trigger_rules.parse_trigger_name(data.get("name"))
        trigger_rules.parse_target(data.get("target"))
        trigger_rules.parse_source(data.get("source"))
        return _trigger_parts(data)


class TriggerPatch(RequestModel):
    """`PATCH .../triggers/{name}`: `target` and `source` replace their block when sent."""

    name: str | None = Field(None, description="must be the trigger's own name: a trigger cannot be renamed")
    target: TriggerTarget | None = None
    source: TriggerSource | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        return _trigger_parts(data)


# ------------------------------------------------------------------------------------------ views


class ServiceTraffic(ResponseModel):
    revision_name: str
    percent: int
    tag: str
    url: str


class ServiceCondition(ResponseModel):
    type: Literal["Ready", "ServiceReady", "VisibilityEnforced", "RuntimeClassApplied", "TrafficAccepted", "Exposed"]
    status: Tristate
    reason: str
    message: str
    last_transition_time: str


class ServiceStatus(ResponseModel):
    """`generation` unequal to `observed_generation`: the change is accepted but not yet applied."""

    url: str
    external_url: str | None = Field(None, description="only once the public address answers")
    internal_url: str = Field(description="always present; internal means removed from the internet, not authenticated")
    published: bool
    latest_ready_revision: str
    latest_created_revision: str
    traffic: list[ServiceTraffic]
    phase: Phase
    conditions: list[ServiceCondition]
    observed_generation: int
    generation: int
    message: str | None = Field(None, description="why the runtime refused the latest change")


class Service(ResponseModel):
    """The Service object of every read and write: the accepted spec, defaults applied, and its status."""

    name: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    env_from: list[ServiceEnvFrom]
    ports: list[ServicePort]
    resources: Resources
    scaling: ServiceScaling
    publish: ServicePublish
    traffic: list[ServiceTrafficTarget]
    runtime_class_name: str
    service_account_name: str
    timeout_seconds: int
    project: str = Field(description="projects/<short>/services/<name>")
    created_at: str
    status: ServiceStatus


class ServiceList(ListPage):
    items_field: ClassVar[str] = "services"
    services: list[Service]


class ServiceRevision(ResponseModel):
    name: str
    generation: int
    image: str = Field(description="the resolved digest when known")
    ready: Tristate
    reason: str
    message: str
    replicas: int
    created_at: str
    traffic_percent: int
    tag: str
    url: str


class ServiceRevisionList(ResponseModel):
    """Every revision, newest first by generation, never paged."""

    revisions: list[ServiceRevision]


class ServiceSpecDocument(ResponseModel):
    """The sanitized live spec as YAML: sensitive env values read `***REDACTED***`."""

    service: str
    yaml: str
    note: str


class ServiceInstances(ResponseModel):
    current: int
    desired: int


class ServiceRevisionMetrics(ResponseModel):
    name: str
    generation: int
    replicas: int
    ready: bool
    traffic_percent: int
    latest_ready: bool
    latest_created: bool


class ServiceReadiness(ResponseModel):
    ready: bool
    reason: str
    message: str
    last_transition_time: str


class ServiceMetrics(ResponseModel):
    """A live readout, no history: `desired` equals `current`."""

    service: str
    instances: ServiceInstances
    revisions: list[ServiceRevisionMetrics]
    phase: Phase
    readiness: ServiceReadiness
    scaling: ServiceScaling
    note: str


class TriggerRun(ResponseModel):
    id: str
    occurrence: str
    status: str
    http_status: int | None
    error: str | None
    started_at: str
    finished_at: str | None


class Trigger(ResponseModel):
    """`runs` (newest first) only on the single-trigger read; `message` says why it is not ready."""

    name: str
    project: str = Field(description="projects/<short>/triggers/<name>")
    target: TriggerTarget
    source: TriggerSource
    state: str = Field(description="pending, then ready")
    ready: bool
    delivery_url: str
    created_at: str
    updated_at: str
    message: str | None = None
    runs: list[TriggerRun] | None = None


class TriggerList(ListPage):
    items_field: ClassVar[str] = "triggers"
    triggers: list[Trigger]


class SandboxStatus(OpenResponseModel):
    """How local processes running deployed code are confined (`on`, `off`, `unavailable`, `not used`)."""

    status: str | None = None
    detail: str | None = None


class ServerlessHealth(ResponseModel):
    """Always 200; `status` says whether every dependency answers. Without a cluster `kubernetes` and `crd`
    read `not configured`, with the runtime in use in `runtime` and the details saying so."""

    status: Literal["ok", "degraded"]
    service: Literal["serverless"]
    database: Literal["ok", "disabled", "unreachable"]
    database_detail: str | None = None
    sessions: Literal["ok", "unavailable"]
    sessions_detail: str | None = None
    kubernetes: Literal["ok", "unreachable", "not configured"]
    kubernetes_detail: str | None = None
    crd: Literal["ok", "missing", "not configured"]
    crd_detail: str | None = None
    runtime: str | None = None
    sandbox: SandboxStatus | None = None

