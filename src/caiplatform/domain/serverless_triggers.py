"""Serverless triggers' rules with the specification's messages (document 3, "Triggers"): names, targets and
the three sources (schedule, object store, Pub/Sub). The request models run them (`models/serverless.py`);
the trigger service orchestrates (`services/serverless_triggers.py`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from caiplatform.errors import BadRequest

TRIGGER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
TRIGGER_NAME_RULE = (
    "name must be 1 to 63 characters of lowercase letters, digits and hyphens, "
    "starting with a letter and ending with a letter or digit"
)
SOURCE_TYPES = ("schedule", "pubsub", "objectstore")
BUCKET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


def parse_trigger_name(name: Any) -> str:
    if not isinstance(name, str) or not TRIGGER_NAME.match(name):
        raise BadRequest(TRIGGER_NAME_RULE)
    return name


def parse_target(target: Any) -> dict[str, Any]:
    """`{service, path}` as far as it can be checked without the project (the service must exist too)."""
    if not isinstance(target, Mapping):
        raise BadRequest("target is required: {service, path}")
    service = target.get("service")
    if not isinstance(service, str) or not service:
        raise BadRequest("target.service is required: the name of a service, function or agent in this project")
    path = target.get("path")
    path = "/" if path in (None, "") else path
    if not isinstance(path, str) or not path.startswith("/"):
        raise BadRequest("target.path must be a path starting with /")
    return {"service": service, "path": path}


def parse_source(source: Any) -> dict[str, Any]:
    """`{type, <type>: {...}}` with each source's own rules."""
    if not isinstance(source, Mapping):
        raise BadRequest("source is required: {type: schedule|pubsub|objectstore, ...}")
    kind_of_source = source.get("type")
    if kind_of_source not in SOURCE_TYPES:
        raise BadRequest(f"source.type must be one of {', '.join(SOURCE_TYPES)}")
    if kind_of_source == "objectstore":
        return {"type": "objectstore", "objectstore": parse_objectstore(source.get("objectstore"))}
    if kind_of_source == "schedule":
        return {"type": "schedule", "schedule": parse_schedule(source.get("schedule"))}
    return {"type": "pubsub", "pubsub": parse_pubsub(source.get("pubsub"))}


def parse_schedule(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise BadRequest("source.schedule is required: {cron, time_zone, payload}")
    cron = raw.get("cron")
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise BadRequest(
            "source.schedule.cron must have five fields (minute, hour, day of month, month, day of week), "
            f"for example \"*/5 * * * *\" (got {cron!r})"
        )
    zone = raw.get("time_zone")
    zone = "UTC" if zone in (None, "") else zone
    try:
        if not isinstance(zone, str):
            raise ValueError(zone)
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"source.schedule.time_zone {zone!r} is not a known IANA time zone") from None
    payload = raw.get("payload")
    if payload is None:
        payload = ""
    elif not isinstance(payload, str):
        # The document's payload is a JSON string; an object is accepted and sent as its JSON text.
        payload = json.dumps(payload)
    elif payload:
        try:
            json.loads(payload)
        except ValueError as exc:
            raise BadRequest(f"{PAYLOAD_RULE}: {exc}") from None
    return {"cron": " ".join(cron.split()), "time_zone": zone, "payload": payload}


PAYLOAD_RULE = "source.schedule.payload must be a JSON document (it is sent verbatim as the request body)"
AGENT_PAYLOAD_RULE = (
    'source.schedule.payload for an agent is its invoke body: a JSON object with a non-empty "message" '
    '(and "session_id" to continue one conversation), for example {"message": "hello"}'
)


def require_invoke_body(payload: str) -> None:
    """An agent answers only an invoke body; a firing without `message` would fail every time."""
    body = json.loads(payload) if payload else None
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        raise BadRequest(AGENT_PAYLOAD_RULE)


def parse_objectstore(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise BadRequest("source.objectstore is required: {bucket, prefix}")
    bucket = raw.get("bucket")
    if not isinstance(bucket, str) or not BUCKET_NAME.match(bucket) or ".." in bucket:
        raise BadRequest("source.objectstore.bucket must be a bucket name: 1 to 63 lowercase letters, digits, "
                         "hyphens and dots, starting and ending with a letter or digit")
    prefix = raw.get("prefix")
    prefix = "" if prefix is None else prefix
    if not isinstance(prefix, str) or prefix.startswith("/") or ".." in prefix.split("/"):
        raise BadRequest("source.objectstore.prefix must be a relative object name prefix")
    return {"bucket": bucket, "prefix": prefix}


def parse_pubsub(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise BadRequest("source.pubsub is required: {topic}")
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic:
        raise BadRequest("source.pubsub.topic is required: a topic of this project")
    return {"topic": topic}
