"""Serverless services and triggers (document 3): the create/PATCH body rules with the spec's messages,
the defaults table, traffic validation and the sanitizing of the spec view.

Parsing is separate from the service so that the library and the HTTP API share every rule. A parsed
`ServiceSpec` is what a service *is*; the revision template is the part of it whose change creates a
new immutable revision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from caiplatform.errors import BadRequest
from caiplatform.validation import ENV_NAME, SERVERLESS_NAME

MAX_BODY_BYTES = 256 * 1024
NAME_MAX = 52
TIMEOUT_MIN, TIMEOUT_MAX, DEFAULT_TIMEOUT = 1, 3600, 300
DEFAULT_MIN_SCALE, DEFAULT_MAX_SCALE, DEFAULT_CONCURRENCY = 0, 10, 80
DEFAULT_PORT_NAME: Literal["http1", "h2c"] = "http1"
DEFAULT_PORT = 8080
PORT_NAMES = ("http1", "h2c")
TAIL_MIN, TAIL_MAX, DEFAULT_TAIL = 1, 10000, 500
TIMEOUT_ENV = "PLATFORM_REQUEST_TIMEOUT_SECONDS"

NAME_RULE = (
    "name must be 1 to 52 characters of lowercase letters, digits and hyphens, "
    "starting with a letter and ending with a letter or digit"
)
IMAGE_REQUIRED = (
    "image is required - set it to a pullable reference: an image this platform built "
    "(registry.local/cai-<project>-<name>@sha256:<digest>), a public registry image, or the project registry"
)
TRAFFIC_REQUIRED = (
    'traffic is required - send the complete split, for example {"traffic": [{"latest_revision": true, '
    '"percent": 100}]}'
)
NAME_TAKEN = "a service with that name already exists in this project"
CONCURRENT = "the service was modified concurrently - re-read it and retry"
SERVICE_NOT_FOUND = "service not found"
TRIGGER_NOT_FOUND = "trigger not found"
TRIGGER_NAME_TAKEN = "a trigger with that name already exists in this project"
TAIL_RULE = f"tail must be an integer between {TAIL_MIN} and {TAIL_MAX}"
NO_DATABASE = "the platform database is not configured, so project access cannot be resolved"


SERVICE_VERBS = ("set-traffic",)


def unknown_verb(verb: str) -> str:
    return f"unknown method ':{verb}' - the supported one is ':set-traffic'"


def default_resources() -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


class Port(BaseModel):
    name: Literal["http1", "h2c"] = DEFAULT_PORT_NAME
    container_port: int = DEFAULT_PORT


class EnvFrom(BaseModel):
    secret_name: str = ""
    config_map_name: str = ""
    optional: bool = False


class ScalingSpec(BaseModel):
    min_scale: int = DEFAULT_MIN_SCALE
    max_scale: int = DEFAULT_MAX_SCALE
    container_concurrency: int = DEFAULT_CONCURRENCY

    @property
    def effective_max(self) -> int:
        """0 is accepted and round-tripped but behaves as the default ceiling."""
        return self.max_scale or DEFAULT_MAX_SCALE


class Publish(BaseModel):
    enabled: bool = False
    host: str = ""  # accepted, stored and ignored (the address is always <name>-<short>.<apps_domain>)


class TrafficEntry(BaseModel):
    revision_name: str = ""
    latest_revision: bool = False
    percent: int = 0
    tag: str = ""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class ServiceSpec(BaseModel):
    """Every field of the create body, defaults applied."""

    name: str
    image: str
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    env_from: list[EnvFrom] = Field(default_factory=list)
    ports: list[Port] = Field(default_factory=lambda: [Port()])
    resources: dict[str, dict[str, str]] = Field(default_factory=default_resources)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    publish: Publish = Field(default_factory=Publish)
    traffic: list[TrafficEntry] = Field(default_factory=lambda: [TrafficEntry(latest_revision=True, percent=100)])
    runtime_class_name: str = ""
    service_account_name: str = ""
    timeout_seconds: int = DEFAULT_TIMEOUT

    #: Fields whose change makes a new revision (everything but routing and publishing).
    TEMPLATE_FIELDS: ClassVar[tuple[str, ...]] = (
        "image", "command", "args", "env", "env_from", "ports", "resources", "scaling",
        "runtime_class_name", "service_account_name", "timeout_seconds",
    )

    def template(self) -> dict[str, Any]:
        return self.model_dump(include=set(self.TEMPLATE_FIELDS))

    @property
    def port(self) -> Port:
        return self.ports[0] if self.ports else Port()


# ------------------------------------------------------------------------------------ field parsers


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and not value.is_integer()):
        raise BadRequest(f"{field} must be an integer")
    return int(value)


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string")
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{field} must be true or false")
    return value


def _object(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest(f"{field} must be an object")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{field} must be an array")
    return value


def parse_name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > NAME_MAX or not SERVERLESS_NAME.match(value):
        raise BadRequest(NAME_RULE)
    return value


def parse_image(value: Any) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadRequest(IMAGE_REQUIRED)
    image = _str(value, "image").strip()
    if any(c.isspace() for c in image):
        raise BadRequest("image must be an image reference without spaces")
    return image


def parse_strings(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    return [_str(item, f"{field}[{i}]") for i, item in enumerate(_list(value, field))]


def parse_env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    env: dict[str, str] = {}
    for key, item in _object(value, "env").items():
        if not ENV_NAME.match(key):
            raise BadRequest(f"env name {key!r} is not a valid environment variable name")
        if key == TIMEOUT_ENV:
            raise BadRequest(f"env {TIMEOUT_ENV} is set by the platform from timeout_seconds")
        env[key] = _str(item, f"env[{key!r}]")
    return env


def parse_env_from(value: Any) -> list[EnvFrom]:
    out: list[EnvFrom] = []
    for i, item in enumerate(_list(value, "env_from") if value is not None else []):
        entry = _object(item, f"env_from[{i}]")
        secret = _str(entry.get("secret_name") or "", f"env_from[{i}].secret_name")
        config_map = _str(entry.get("config_map_name") or "", f"env_from[{i}].config_map_name")
        if bool(secret) == bool(config_map):
            raise BadRequest(f"env_from[{i}] must set exactly one of secret_name or config_map_name")
        optional = entry.get("optional")
        out.append(EnvFrom(secret_name=secret, config_map_name=config_map,
                           optional=False if optional is None else _bool(optional, f"env_from[{i}].optional")))
    return out


def parse_ports(value: Any) -> list[Port]:
    if value is None:
        return [Port()]
    items = _list(value, "ports")
    if len(items) > 1:
        raise BadRequest(f"ports accepts at most one entry (got {len(items)})")
    if not items:
        return [Port()]
    entry = _object(items[0], "ports[0]")
    name = entry.get("name")
    name = DEFAULT_PORT_NAME if name in (None, "") else name
    if name not in PORT_NAMES:
        raise BadRequest(f"ports[0].name must be http1 or h2c (got {name!r})")
    port = entry.get("container_port")
    port = DEFAULT_PORT if port is None else _int(port, "ports[0].container_port")
    if not 1 <= port <= 65535:
        raise BadRequest(f"ports[0].container_port must be between 1 and 65535 (got {port})")
    return [Port(name=name, container_port=port)]


def parse_resources(value: Any) -> dict[str, dict[str, str]]:
    if value is None:
        return default_resources()
    body = _object(value, "resources")
    out: dict[str, dict[str, str]] = {}
    for part in ("requests", "limits"):
        raw = body.get(part)
        if raw is None:
            continue
        out[part] = {str(k): _str(v, f"resources.{part}.{k}") for k, v in _object(raw, f"resources.{part}").items()}
    return out or default_resources()


def parse_scaling(value: Any) -> ScalingSpec:
    """A `scaling` block replaces the whole block: omitted sub-fields revert to 0, 10, 80."""
    if value is None:
        return ScalingSpec()
    body = _object(value, "scaling")
    values: dict[str, int] = {}
    for key, default in (("min_scale", DEFAULT_MIN_SCALE), ("max_scale", DEFAULT_MAX_SCALE),
                         ("container_concurrency", DEFAULT_CONCURRENCY)):
        raw = body.get(key)
        number = default if raw is None else _int(raw, f"scaling.{key}")
        if number < 0:
            raise BadRequest(f"scaling.{key} must not be negative (got {number})")
        values[key] = number
    scaling = ScalingSpec(**values)
    if scaling.min_scale > scaling.effective_max:
        raise BadRequest(
            f"scaling.min_scale ({scaling.min_scale}) must not be greater than scaling.max_scale "
            f"({scaling.effective_max})"
        )
    return scaling


def parse_publish(value: Any) -> Publish:
    if value is None:
        return Publish()
    body = _object(value, "publish")
    enabled = body.get("enabled")
    host = body.get("host")
    return Publish(enabled=False if enabled is None else _bool(enabled, "publish.enabled"),
                   host="" if host is None else _str(host, "publish.host"))


def parse_timeout(value: Any) -> int:
    if value is None:
        return DEFAULT_TIMEOUT
    timeout = _int(value, "timeout_seconds")
    if not TIMEOUT_MIN <= timeout <= TIMEOUT_MAX:
        raise BadRequest(f"timeout_seconds must be between {TIMEOUT_MIN} and {TIMEOUT_MAX} (got {timeout})")
    return timeout


def parse_traffic(value: Any, revisions: set[str], *, required: bool = False) -> list[TrafficEntry]:
    """The complete split: sums to 100, each entry names an existing revision or follows the latest,
    no duplicate targets or tags."""
    if value is None or value == []:
        if required:
            raise BadRequest(TRAFFIC_REQUIRED)
        return [TrafficEntry(latest_revision=True, percent=100)]
    items = _list(value, "traffic")
    entries: list[TrafficEntry] = []
    targets: set[str] = set()
    tags: set[str] = set()
    for i, item in enumerate(items):
        raw = _object(item, f"traffic[{i}]")
        revision = raw.get("revision_name")
        revision = "" if revision is None else _str(revision, f"traffic[{i}].revision_name")
        latest = raw.get("latest_revision")
        latest = False if latest is None else _bool(latest, f"traffic[{i}].latest_revision")
        percent = raw.get("percent")
        percent = 0 if percent is None else _int(percent, f"traffic[{i}].percent")
        tag = raw.get("tag")
        tag = "" if tag is None else _str(tag, f"traffic[{i}].tag")
        if not 0 <= percent <= 100:
            raise BadRequest(f"traffic[{i}].percent must be between 0 and 100 (got {percent})")
        if revision and latest:
            raise BadRequest(f"traffic[{i}] sets both revision_name and latest_revision: true - choose one")
        if not revision and not latest:
            raise BadRequest(f"traffic[{i}] needs either revision_name or latest_revision: true")
        target = revision or ":latest"
        if target in targets:
            what = f"revision {revision!r}" if revision else "the latest revision"
            raise BadRequest(f"traffic[{i}] is a duplicate target: {what} appears more than once")
        targets.add(target)
        if tag:
            if not SERVERLESS_NAME.match(tag):
                raise BadRequest(f"traffic[{i}].tag must be a lowercase DNS label")
            if tag in tags:
                raise BadRequest(f"traffic[{i}].tag {tag!r} is a duplicate tag")
            tags.add(tag)
        if revision and revision not in revisions:
            raise BadRequest(f"traffic[{i}].revision_name {revision!r} does not exist for this service")
        entries.append(TrafficEntry(revision_name=revision, latest_revision=latest, percent=percent, tag=tag))
    total = sum(e.percent for e in entries)
    if total != 100:
        raise BadRequest(f"traffic percentages must sum to 100 (got {total})")
    return entries


def body_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest("invalid JSON body: expected a JSON object")
    return body


def parse_create(body: Any, revision_name: str) -> ServiceSpec:
    """A create body, defaults applied; `revision_name` is the revision the create makes."""
    body = body_object(body)
    name = parse_name(body.get("name"))
    return _spec_from(body, name=name, image=parse_image(body.get("image")), revisions={revision_name})


def _spec_from(body: Mapping[str, Any], *, name: str, image: str, revisions: set[str]) -> ServiceSpec:
    rc = body.get("runtime_class_name")
    sa = body.get("service_account_name")
    return ServiceSpec(
        name=name,
        image=image,
        command=parse_strings(body.get("command"), "command"),
        args=parse_strings(body.get("args"), "args"),
        env=parse_env(body.get("env")),
        env_from=parse_env_from(body.get("env_from")),
        ports=parse_ports(body.get("ports")),
        resources=parse_resources(body.get("resources")),
        scaling=parse_scaling(body.get("scaling")),
        publish=parse_publish(body.get("publish")),
        traffic=parse_traffic(body.get("traffic"), revisions),
        runtime_class_name="" if rc is None else _str(rc, "runtime_class_name"),
        service_account_name="" if sa is None else _str(sa, "service_account_name"),
        timeout_seconds=parse_timeout(body.get("timeout_seconds")),
    )


def apply_patch(current: ServiceSpec, body: Any, revisions: set[str], next_revision: str) -> ServiceSpec:
    """Sparse PATCH: omitted fields are kept, explicit values (zeros included) are set; a `scaling`
    block replaces the whole block. Traffic is validated as on create, against the existing revisions
    plus the one this PATCH would create."""
    body = body_object(body)
    if "name" in body and body["name"] != current.name:
        raise BadRequest("name cannot be changed: a service cannot be renamed")
    merged: dict[str, Any] = current.model_dump()
    present = {key for key, value in body.items() if value is not None}
    parsers: dict[str, Any] = {
        "image": parse_image,
        "command": lambda v: parse_strings(v, "command"),
        "args": lambda v: parse_strings(v, "args"),
        "env": parse_env,
        "env_from": parse_env_from,
        "ports": parse_ports,
        "resources": parse_resources,
        "scaling": parse_scaling,
        "publish": parse_publish,
        "runtime_class_name": lambda v: _str(v, "runtime_class_name"),
        "service_account_name": lambda v: _str(v, "service_account_name"),
        "timeout_seconds": parse_timeout,
    }
    for key, parse in parsers.items():
        if key in present:
            value = parse(body[key])
            merged[key] = value.model_dump() if isinstance(value, BaseModel) else (
                [v.model_dump() if isinstance(v, BaseModel) else v for v in value] if isinstance(value, list) else value
            )
    if "image" in body and body["image"] is None:
        raise BadRequest(IMAGE_REQUIRED)
    candidate = ServiceSpec.model_validate(merged)
    if "traffic" in present:
        candidate.traffic = parse_traffic(body["traffic"], revisions | {next_revision})
    return candidate


def parse_tail(raw: Any) -> int:
    if raw is None or raw == "":
        return DEFAULT_TAIL
    try:
        tail = int(str(raw))
    except ValueError:
        raise BadRequest(TAIL_RULE) from None
    if not TAIL_MIN <= tail <= TAIL_MAX:
        raise BadRequest(TAIL_RULE)
    return tail


def internal_host_label(host: str) -> tuple[str, str] | None:
    """A service's private hostname, `[<tag>-]<service>.cai-p-<short>[.svc[.cluster.local]]` (a port is
    ignored), as (its first label, the project's short id); None for any other host."""
    parts = host.lower().split(":", 1)[0].split(".")
    if len(parts) not in (2, 3, 5) or not parts[1].startswith("cai-p-"):
        return None
    if parts[2:] not in ([], ["svc"], ["svc", "cluster", "local"]):
        return None
    return parts[0], parts[1][len("cai-p-"):]
