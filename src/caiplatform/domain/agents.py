"""Rules of the agent surface that need no I/O: deploy form values, compute config, publishing variables,
embed config, the sanitized spec document. Each raises `BadRequest` with the specification's message.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from caiplatform.errors import BadRequest
from caiplatform.validation import ENV_NAME

# -- deploy form -------------------------------------------------------------------------------------

DEPLOY_FIELDS = ("name", "code", "framework", "runtime", "config")
DEPLOY_FRAMEWORKS = ("adk", "langgraph", "crewai", "function", "container")
AGENT_FRAMEWORKS = ("adk", "langgraph", "crewai")
FUNCTION_RUNTIMES = ("python", "nodejs", "go", "ruby")
DEFAULT_FRAMEWORK = "adk"

NAME_MESSAGE = "missing or invalid 'name' (must be a lowercase DNS label)"
RUNTIME_ONLY_FOR_FUNCTIONS = "'runtime' only applies to framework=function"


def unknown_agent(name: str) -> str:
    """The 404 of a name that is no agent the caller may see."""
    return f"unknown agent: {name}"


def unknown_field_message(field: str) -> str:
    return f"unknown form field '{field}' (allowed: {', '.join(DEPLOY_FIELDS)}; the project is chosen with ?project=)"


def framework_of(framework: str | None, runtime: str | None) -> tuple[str, str | None, str]:
    """(stored framework, runtime, kind) for the deploy form's `framework` and `runtime`."""
    framework = (framework or "").strip() or DEFAULT_FRAMEWORK
    runtime = (runtime or "").strip() or None
    if framework not in DEPLOY_FRAMEWORKS:
        raise BadRequest(f"unsupported 'framework': {framework!r} (allowed: {', '.join(DEPLOY_FRAMEWORKS)})")
    if framework == "container":
        raise BadRequest(
            "unsupported 'framework': 'container' needs a prebuilt image, which this route cannot take; "
            f"upload source with one of {', '.join(f for f in DEPLOY_FRAMEWORKS if f != 'container')}"
        )
    if framework in AGENT_FRAMEWORKS:
        if runtime is not None:
            raise BadRequest(RUNTIME_ONLY_FOR_FUNCTIONS)
        return framework, None, "agent"
    runtime = runtime or "python"
    if runtime not in FUNCTION_RUNTIMES:
        raise BadRequest(f"unsupported 'runtime': {runtime!r} (allowed: {', '.join(FUNCTION_RUNTIMES)})")
    return ("function" if runtime == "python" else f"function-{runtime}"), runtime, "function"


# -- compute config ----------------------------------------------------------------------------------

SCALING_FIELDS = ("min_scale", "max_scale", "container_concurrency")
RESOURCE_KINDS = ("requests", "limits")
RESOURCE_NAMES = ("cpu", "memory")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def _empty(value: Any) -> bool:
    return value is None or value == ""


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise BadRequest(f"{field} must be an integer (got {json.dumps(value)})")
    number = int(value)
    if number < 0:
        short = field.rsplit(".", 1)[-1]
        raise BadRequest(f"{short} {number} is negative; {short} must be zero or more")
    return number


def _object(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be an object")
    return value


def merge_config(current: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply a sparse PATCH (omitted fields keep their value, an empty value removes that entry)."""
    patch = _object("config", patch)
    if set(patch) == {"config"} and isinstance(patch["config"], dict):
        patch = patch["config"]
    merged = copy.deepcopy(current or {})
    for key in patch:
        if key not in ("scaling", "resources", "timeout_seconds"):
            raise BadRequest(f"unknown config field '{key}' (allowed: scaling, resources, timeout_seconds)")
    if "timeout_seconds" in patch:
        value = patch["timeout_seconds"]
        if _empty(value):
            merged.pop("timeout_seconds", None)
        else:
            seconds = _int("timeout_seconds", value)
            if seconds == 0:
                raise BadRequest("timeout_seconds must be at least 1")
            merged["timeout_seconds"] = seconds
    if "scaling" in patch:
        if _empty(patch["scaling"]):
            merged.pop("scaling", None)
        else:
            scaling = dict(merged.get("scaling") or {})
            for key, value in _object("scaling", patch["scaling"]).items():
                if key not in SCALING_FIELDS:
                    raise BadRequest(f"unknown config field 'scaling.{key}' (allowed: {', '.join(SCALING_FIELDS)})")
                if _empty(value):
                    scaling.pop(key, None)
                else:
                    scaling[key] = _int(f"scaling.{key}", value)
            merged["scaling"] = scaling
    if "resources" in patch:
        if _empty(patch["resources"]):
            merged.pop("resources", None)
        else:
            resources = copy.deepcopy(merged.get("resources") or {})
            for kind, values in _object("resources", patch["resources"]).items():
                if kind not in RESOURCE_KINDS:
                    raise BadRequest(f"unknown config field 'resources.{kind}' (allowed: requests, limits)")
                if _empty(values):
                    resources.pop(kind, None)
                    continue
                section = dict(resources.get(kind) or {})
                for name, quantity in _object(f"resources.{kind}", values).items():
                    if name not in RESOURCE_NAMES:
                        raise BadRequest(f"unknown config field 'resources.{kind}.{name}' (allowed: cpu, memory)")
                    if _empty(quantity):
                        section.pop(name, None)
                    elif not isinstance(quantity, str) or not QUANTITY.match(quantity):
                        raise BadRequest(
                            f"resources.{kind}.{name} {json.dumps(quantity)} is not a valid quantity "
                            "(for example 100m, 256Mi or 1Gi)"
                        )
                    else:
                        section[name] = quantity
                if section:
                    resources[kind] = section
                else:
                    resources.pop(kind, None)
            merged["resources"] = resources
    for key in ("scaling", "resources"):
        if key in merged and not merged[key]:
            merged.pop(key)
    scaling = merged.get("scaling") or {}
    low, high = scaling.get("min_scale"), scaling.get("max_scale")
    if low is not None and high:
        if low > high:
            raise BadRequest(
                f"min_scale {low} is greater than max_scale {high}; raise max_scale or lower min_scale"
            )
    return merged


# -- publishing variables ----------------------------------------------------------------------------

EXPOSE_EXTERNAL = "CAI_EXPOSE_EXTERNAL"
EXPOSE_RATE_LIMIT = "CAI_EXPOSE_RATE_LIMIT"
EXPOSE_JWT_ISSUER = "CAI_EXPOSE_JWT_ISSUER"
EXPOSE_JWT_JWKS_URI = "CAI_EXPOSE_JWT_JWKS_URI"
EXPOSE_MODES = ("apikey", "jwt", "none")
RATE_LIMIT = re.compile(r"^([1-9][0-9]*)/(second|minute|hour|day)$")


RATE_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def rate_budget(text: str) -> tuple[int, int]:
    """(requests, per seconds) of a valid `CAI_EXPOSE_RATE_LIMIT`."""
    match = RATE_LIMIT.match(text.strip())
    if match is None:
        raise ValueError(f"not a rate budget: {text!r}")
    return int(match.group(1)), RATE_UNITS[match.group(2)]


def exposure(env: dict[str, str]) -> tuple[str | None, str]:
    """(auth mode or None when unpublished, refusal text or "") for an agent's env."""
    mode = (env.get(EXPOSE_EXTERNAL) or "").strip()
    if not mode:
        return None, ""
    if mode not in EXPOSE_MODES:
        return None, (
            f"{EXPOSE_EXTERNAL}={mode!r} is refused: it must name the auth mode, one of "
            f"{', '.join(EXPOSE_MODES)} (a bare boolean such as 'true' is not accepted)"
        )
    rate = (env.get(EXPOSE_RATE_LIMIT) or "").strip()
    if not rate:
        return None, (
            f"{EXPOSE_RATE_LIMIT} is required when {EXPOSE_EXTERNAL} is set "
            "(form N/second, N/minute, N/hour or N/day)"
        )
    if not RATE_LIMIT.match(rate):
        return None, f"{EXPOSE_RATE_LIMIT}={rate!r} is refused: use N/second, N/minute, N/hour or N/day"
    if mode == "jwt":
        missing = [k for k in (EXPOSE_JWT_ISSUER, EXPOSE_JWT_JWKS_URI) if not (env.get(k) or "").strip()]
        if missing:
            return None, f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required in jwt mode"
    return mode, ""


# -- embed config ------------------------------------------------------------------------------------

EMBED_TEXT_FIELDS = ("title", "subtitle", "greeting", "accent_color", "launcher_text")
EMBED_FIELDS = ("enabled", "allowed_origins", "position", *EMBED_TEXT_FIELDS)
EMBED_POSITIONS = ("left", "right")
ORIGIN = re.compile(r"^(https?://[^/\s?#]+|\*)$")


def embed_defaults() -> dict[str, Any]:
    # Every field of the spec's embed config is always present (texts empty until set), so a client
    # can read any of them from the first GET on.
    return {"enabled": False, "embed_key": "", "allowed_origins": [], "position": "right",
            **dict.fromkeys(EMBED_TEXT_FIELDS, ""), "updated_at": ""}


def merge_embed(current: dict[str, Any] | None, patch: Any) -> dict[str, Any]:
    """A partial update of the embed config: every field optional."""
    if not isinstance(patch, dict):
        raise BadRequest("invalid JSON body: expected a JSON object")
    merged = {**embed_defaults(), **(current or {})}
    for key, value in patch.items():
        if key in ("embed_key", "updated_at"):
            continue  # read-only; minted and stamped by the platform
        if key not in EMBED_FIELDS:
            raise BadRequest(f"unknown embed field '{key}' (allowed: {', '.join(EMBED_FIELDS)})")
        if key == "enabled":
            if not isinstance(value, bool):
                raise BadRequest("enabled must be a boolean")
        elif key == "allowed_origins":
            if value is None:
                value = []
            if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
                raise BadRequest("allowed_origins must be an array of origins")
            value = [o.strip().rstrip("/") for o in value if o.strip()]
            bad = [o for o in value if not ORIGIN.match(o)]
            if bad:
                raise BadRequest(f"invalid origin {bad[0]!r}: use scheme://host[:port], e.g. https://example.com")
        elif key == "position":
            if value not in EMBED_POSITIONS:
                raise BadRequest("position must be left or right")
        elif value is not None and not isinstance(value, str):
            raise BadRequest(f"{key} must be a string")
        merged[key] = value if value is not None else ""
    return merged




# -- env, secrets, traffic ---------------------------------------------------------------------------

NOTHING_TO_DO = "nothing to do: provide 'set' and/or 'remove'"
TRAFFIC_REQUIRED = (
    'traffic is required - send the complete split, e.g. {"traffic": [{"revision_name": "<name>-00002", "percent": 100}]}'
)


def invalid_key(key: Any) -> str:
    return f"invalid secret key (must be a valid environment variable name): {key}"


def set_remove(body: Any) -> tuple[dict[str, Any], list[Any]]:
    """`{set: map, remove: [names]}` of the env and secrets PATCH bodies."""
    if not isinstance(body, dict):
        raise BadRequest(NOTHING_TO_DO)
    set_ = body.get("set")
    remove = body.get("remove")
    if set_ is not None and not isinstance(set_, dict):
        raise BadRequest("'set' must be an object mapping names to values")
    if remove is not None and not isinstance(remove, list):
        raise BadRequest("'remove' must be an array of names")
    if not set_ and not remove:
        raise BadRequest(NOTHING_TO_DO)
    return set_ or {}, remove or []


def check_names(names: Any) -> None:
    for key in names:
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise BadRequest(invalid_key(key))


def env_value(key: str, value: Any, what: str) -> str:
    """A value of the env or secret map as the string the instance sees (null: "", a removal)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise BadRequest(f"{what} values must be strings: {key}")


def check_secret_map(values: Any) -> dict[str, str]:
    if not isinstance(values, dict):
        raise BadRequest("the body must be a JSON object mapping secret keys to values")
    checked: dict[str, str] = {}
    for key, value in values.items():
        if not ENV_NAME.match(key):
            raise BadRequest(invalid_key(key))
        checked[key] = env_value(key, value, "secret")
    return checked


def traffic_split(body: Any) -> list[tuple[str, int]]:
    """`(revision_name, percent)` of a set-traffic body: the complete split, summing to exactly 100."""
    split = body.get("traffic") if isinstance(body, dict) else None
    if not isinstance(split, list) or not split:
        raise BadRequest(TRAFFIC_REQUIRED)
    targets: list[tuple[str, int]] = []
    seen: set[str] = set()
    for entry in split:
        if not isinstance(entry, dict) or not isinstance(entry.get("revision_name"), str) or not entry["revision_name"]:
            raise BadRequest(f"{TRAFFIC_REQUIRED} (every entry needs revision_name and percent)")
        percent = entry.get("percent")
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise BadRequest(f"{TRAFFIC_REQUIRED} (percent must be an integer from 0 to 100)")
        if entry["revision_name"] in seen:
            raise BadRequest(f"{TRAFFIC_REQUIRED} (revision {entry['revision_name']} appears twice)")
        seen.add(entry["revision_name"])
        targets.append((entry["revision_name"], percent))
    total = sum(percent for _, percent in targets)
    if total != 100:
        raise BadRequest(f"{TRAFFIC_REQUIRED} (percentages must sum to exactly 100, got {total})")
    return targets
