"""The messaging API's models (document 3): topics, subscriptions, publish, pull, acknowledge, project views.

Each request model runs the specification's rules before its own fields are checked (the messages are
in `caiplatform.domain.messaging`), so a caller sees the spec's message and never pydantic's. Rules that
need context stay in `TopicService`: the budget, whether a dead-letter topic exists, the push URL's
namespace, whether an acknowledgement id belongs to the subscription.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeGuard

from pydantic import Field, PrivateAttr, model_validator
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from caiplatform.domain import messaging as m
from caiplatform.errors import BadRequest
from caiplatform.models.base import ListPage, RequestModel, ResponseModel
from caiplatform.ports.broker import OutgoingMessage

NAME = Field(max_length=m.NAME_MAX, pattern=m.NAME_PATTERN.pattern)
INT32_MAX = 2**31 - 1  # counts the broker and the database hold as 32-bit integers
Discard = Literal["old", "new"]
SubscriptionType = Literal["shared", "key-shared", "exclusive", "failover"]
ContentMode = Literal["cloudevents-structured", "cloudevents-binary"]


# ------------------------------------------------------------------------------------------ rules


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A refused value as the caller wrote it: a string as is, anything else as its JSON text."""
    return value if isinstance(value, str) else json.dumps(value)


def checked_name(kind: str, value: Any) -> str:
    """A valid topic or subscription name, or BadRequest with the message `m.name_error` gives."""
    problem = m.name_error(kind, value)
    if problem:
        raise BadRequest(problem)
    assert isinstance(value, str)  # name_error refuses every non-string
    return value


def int_field(body: Mapping[str, Any], key: str, message: str, *, stored: str | None = None) -> int | None:
    """An optional integer field: None when absent or null, else the int (a float with no fraction counts),
    or 400 with `message`. A value `stored` (named so in messages) above 2147483647 is 400."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise BadRequest(message)
    if stored is not None and value > INT32_MAX:
        raise BadRequest(f"{stored} must be at most {INT32_MAX}")
    return value


def text_field(body: Mapping[str, Any], key: str, label: str | None = None) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{label or key} must be a string")
    return value


def _object(value: Any, message: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequest(message)
    return value


_URLSAFE_B64 = re.compile(r"^[A-Za-z0-9_-]*={0,2}$")


def decode_base64(text: str) -> bytes | None:
    """Standard base64 (padded), or its URL-safe alphabet with or without padding."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    if not _URLSAFE_B64.match(text) or len(text.rstrip("=")) % 4 == 1:
        return None
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        return None


def _normalized(data: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with normalized values; keys the body did not carry stay absent (they stay unset)."""
    return {**data, **{key: value for key, value in changes.items() if key in data}}


# ------------------------------------------------------------------------------------------ topics


def _topic_limit_rules(data: Mapping[str, Any]) -> dict[str, Any]:
    """The limit fields of a topic create or PATCH, checked with the spec's messages and normalized
    (`max_bytes` as text, "" for "the default" as absent)."""
    out: dict[str, Any] = {}
    text_field(data, "display_name")
    raw_max = data.get("max_bytes")
    if is_int(raw_max):
        raw_max = str(raw_max)
    if raw_max is None or raw_max == "":
        out["max_bytes"] = None
    else:
        if m.parse_bytes(raw_max) is None:
            raise BadRequest(f'max_bytes "{shown(raw_max)}" is not a valid quantity')
        out["max_bytes"] = raw_max.strip()
    raw_age = data.get("max_age")
    if raw_age not in (None, "") and (not isinstance(raw_age, str) or m.parse_duration(raw_age) is None):
        raise BadRequest(f'max_age "{shown(raw_age)}" is not a valid duration')
    raw_discard = data.get("discard")
    if raw_discard is None or raw_discard == "":
        out["discard"] = None
    elif raw_discard not in ("old", "new"):
        raise BadRequest(f'discard must be old or new (got "{shown(raw_discard)}")')
    return out


class _TopicFields(RequestModel):
    display_name: str | None = Field(None, description="free text; omitted from the topic when empty")
    max_bytes: str | None = Field(None, description="backlog cap as a resource quantity (default 16Mi)",
                                  examples=["16Mi"])
    max_age: str | None = Field(None, description="a duration (`72h`); empty means no limit", examples=["72h"])
    discard: Discard | None = Field(None, description="`old` drops the oldest when full (default), `new` refuses")

    @property
    def max_bytes_value(self) -> int | None:
        return None if self.max_bytes is None else m.parse_bytes(self.max_bytes)

    @property
    def max_age_seconds(self) -> float | None:
        """None: not given; 0: no limit."""
        if self.max_age is None:
            return None
        return m.parse_duration(self.max_age) if self.max_age else 0.0


class TopicCreate(_TopicFields):
    """`POST .../topics` (admin). The topic claims `max_bytes` of the project's budget at once."""

    name: str = NAME

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        checked_name("topic", data.get("name"))
        return _normalized(data, _topic_limit_rules(data))


class TopicPatch(_TopicFields):
    """`PATCH .../topics/{topic}` (admin): omitted fields keep their values; `max_age: ""` clears the limit."""

    name: str | None = Field(None, description="immutable: only the topic's own name is accepted")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return _normalized(data, _topic_limit_rules(data))


class PublishMessage(RequestModel):
    text: str | None = Field(None, description="the payload as text; excludes data")
    data: str | None = Field(None, description="the payload as base64; excludes text")
    attributes: dict[str, str] | None = None
    key: str | None = Field(None, description="the ordering key of key-shared subscriptions")


def outgoing_messages(body: Mapping[str, Any]) -> list[OutgoingMessage]:
    """The messages of a publish body, checked in order with the spec's messages, payloads decoded."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(m.NO_MESSAGES)
    if len(messages) > m.MAX_PUBLISH_MESSAGES:
        raise BadRequest(f"a publish carries at most {m.MAX_PUBLISH_MESSAGES} messages (got {len(messages)})")
    out = []
    for i, raw in enumerate(messages):
        # `type(...) is dict` first: what a JSON body decodes to, without the ABC check (a third of the loop).
        if type(raw) is not dict and not isinstance(raw, Mapping):
            raise BadRequest(f"messages[{i}] must be an object")
        text, data = raw.get("text"), raw.get("data")
        if text not in (None, "") and data not in (None, ""):
            raise BadRequest(f"messages[{i}]: set either data (base64) or text, not both")
        if data not in (None, ""):
            payload = decode_base64(data) if isinstance(data, str) else None
            if payload is None:
                raise BadRequest(f"messages[{i}]: data is not valid base64")
        elif text not in (None, ""):
            if not isinstance(text, str):
                raise BadRequest(f"messages[{i}]: text must be a string")
            payload = text.encode()
        else:
            payload = b""
        attributes = raw.get("attributes") or {}
        if type(attributes) is not dict and not isinstance(attributes, Mapping):
            raise BadRequest(f"messages[{i}]: attributes must be an object of strings")
        for name, value in attributes.items():
            if not name or "\n" in name or "\r" in name:
                raise BadRequest(f"messages[{i}]: attribute names must be non-empty and single-line")
            if not isinstance(value, str):
                raise BadRequest(f"messages[{i}]: attribute values must be strings")
        key = raw.get("key")
        if key is not None and not isinstance(key, str):
            raise BadRequest(f"messages[{i}]: key must be a string")
        out.append(OutgoingMessage(payload, dict(attributes), key or None))
    return out


class PublishRequest(RequestModel):
    """`POST .../topics/{topic}:publish`: 1 to 100 messages, each text, base64 data or neither."""

    messages: list[PublishMessage] = Field(min_length=1, max_length=m.MAX_PUBLISH_MESSAGES)
    _outgoing: list[OutgoingMessage] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _spec_rules(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The rules decode each payload once; the decoded messages ride along for the service.
        outgoing = outgoing_messages(data) if isinstance(data, Mapping) else None
        model = handler(data)
        if outgoing is not None and isinstance(model, PublishRequest):
            model._outgoing = outgoing
        return model

    def outgoing(self) -> list[OutgoingMessage]:
        """The messages as the broker takes them (payload bytes, attributes, key)."""
        if not self._outgoing:
            self._outgoing = outgoing_messages(self.model_dump(exclude_none=True))
        return self._outgoing


# ------------------------------------------------------------------------------------------ subscriptions


class SubscriptionPush(RequestModel):
    url: str | None = Field(None, description="plain http URL of a service in the project's own namespace")
    content_mode: ContentMode | None = Field(None, description="default cloudevents-structured")


class SubscriptionDeliver(RequestModel):
    mode: Literal["pull", "push"] | None = Field(None, description="default pull")
    push: SubscriptionPush | None = None


class SubscriptionDeadLetter(RequestModel):
    topic: str | None = Field(None, description="a topic of this project, not the subscription's own; '' clears")
    after_attempts: int | None = Field(None, ge=1, le=INT32_MAX, description="default 5")


def _subscription_rules(data: Mapping[str, Any]) -> dict[str, Any]:
    """The context-free rules of a subscription create or PATCH, with the spec's messages; what they
    normalize (an empty string meaning "the default", a whole float) is returned."""
    out: dict[str, Any] = {}
    text_field(data, "display_name")
    for key in ("type", "start_from"):
        value = data.get(key)
        if value == "":
            out[key] = None
    raw_type = data.get("type")
    if raw_type not in (None, "") and raw_type not in m.SUBSCRIPTION_TYPES:
        raise BadRequest(f'{m.TYPE_RULE} (got "{shown(raw_type)}")')
    start = data.get("start_from")
    if start not in (None, "") and start not in ("all", "new"):
        raise BadRequest(f'start_from must be all or new (got "{shown(start)}")')
    deadline = int_field(data, "ack_deadline_seconds", m.ACK_DEADLINE_RULE)
    if deadline is not None and not 1 <= deadline <= 600:
        raise BadRequest(m.ACK_DEADLINE_RULE)
    out["ack_deadline_seconds"] = deadline
    max_deliver = int_field(data, "max_deliver", m.MAX_DELIVER_RULE, stored="max_deliver")
    if max_deliver is not None and max_deliver < 0:
        raise BadRequest(m.MAX_DELIVER_RULE)
    out["max_deliver"] = max_deliver
    pending = int_field(data, "max_ack_pending", "max_ack_pending must be a positive integer", stored="max_ack_pending")
    if pending is not None and pending < 0:
        raise BadRequest("max_ack_pending must be a positive integer")
    out["max_ack_pending"] = pending
    deliver = _object(data.get("deliver"), "deliver must be an object")
    if deliver:
        deliver = dict(deliver)
        mode = deliver.get("mode")
        if mode == "":
            deliver["mode"] = None
        elif mode is not None and mode not in ("pull", "push"):
            raise BadRequest(f'deliver.mode must be "pull" or "push" (got "{shown(mode)}")')
        push = deliver.get("push")
        if mode == "pull" and push not in (None, {}):
            raise BadRequest('deliver.push is set but deliver.mode is "pull"')
        push = _object(push, "deliver.push must be an object")
        if push:
            push = dict(push)
            url = push.get("url")
            if url == "":
                push["url"] = None
            elif url is not None and not isinstance(url, str):
                raise BadRequest("deliver.push.url is not allowed: it must be a string")
            content_mode = push.get("content_mode")
            if content_mode == "":
                push["content_mode"] = None
            elif content_mode is not None and content_mode not in m.CONTENT_MODES:
                raise BadRequest(m.CONTENT_MODE_RULE)
            deliver["push"] = push
        out["deliver"] = deliver
    dead = _object(data.get("dead_letter"), "dead_letter must be an object")
    if dead:
        dead = dict(dead)
        text_field(dead, "topic", "dead_letter.topic")
        attempts = int_field(dead, "after_attempts", "dead_letter.after_attempts must be at least 1",
                             stored="dead_letter.after_attempts")
        if attempts is not None and attempts < 1:
            raise BadRequest("dead_letter.after_attempts must be at least 1")
        dead["after_attempts"] = attempts
        out["dead_letter"] = _normalized(dead, {"after_attempts": attempts})
    if data.get("topic") is not None and not isinstance(data.get("topic"), str):
        raise BadRequest("topic must be a string")
    return out


class _SubscriptionFields(RequestModel):
    display_name: str | None = None
    ack_deadline_seconds: int | None = Field(None, ge=1, le=600, description="default 30; also the push timeout")
    max_deliver: int | None = Field(None, ge=0, le=INT32_MAX, description="0: unset; enforced by push only")
    max_ack_pending: int | None = Field(None, ge=0, le=INT32_MAX, description="default 1000")
    deliver: SubscriptionDeliver | None = None
    dead_letter: SubscriptionDeadLetter | None = None
    topic: str | None = Field(None, description="the topic of the path, if sent at all")
    type: SubscriptionType | None = Field(None, description="default shared; immutable")
    start_from: Literal["all", "new"] | None = Field(None, description="default all; immutable")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if cls is SubscriptionCreate:
            checked_name("subscription", data.get("name"))
        return _normalized(data, _subscription_rules(data))

    def given(self) -> list[str]:
        """The fields the caller sent (for the audit record)."""
        return sorted(key for key in self.model_fields_set if key != "name")


class SubscriptionCreate(_SubscriptionFields):
    """`POST .../topics/{topic}/subscriptions` (admin)."""

    name: str = NAME


class SubscriptionPatch(_SubscriptionFields):
    """`PATCH .../subscriptions/{sub}` (admin): `topic`, `type`, `start_from` and `name` are immutable."""

    name: str | None = None


class PullRequest(RequestModel):
    """`POST .../subscriptions/{sub}:pull`; the body is optional."""

    max_messages: int | None = Field(None, ge=0, description="default 10, silently capped at 100")
    timeout_ms: int | None = Field(None, ge=0, description="long-poll for the first message; default 2000, cap 20000")
    auto_ack: bool | None = Field(None, description="acknowledge before answering (lossy if the client crashes)")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        max_messages = int_field(data, "max_messages", "max_messages must be an integer")
        if max_messages is not None and max_messages < 0:
            raise BadRequest("max_messages must not be negative")
        timeout_ms = int_field(data, "timeout_ms", "timeout_ms must be an integer")
        if timeout_ms is not None and timeout_ms < 0:
            raise BadRequest("timeout_ms must not be negative")
        auto_ack = data.get("auto_ack")
        if auto_ack is not None and not isinstance(auto_ack, bool):
            raise BadRequest("auto_ack must be true or false")
        return _normalized(data, {"max_messages": max_messages, "timeout_ms": timeout_ms})

    @property
    def batch(self) -> int:
        return min(self.max_messages or m.DEFAULT_PULL_MESSAGES, m.MAX_PULL_MESSAGES)

    @property
    def timeout_seconds(self) -> float:
        timeout = m.DEFAULT_PULL_TIMEOUT_MS if self.timeout_ms is None else self.timeout_ms
        return min(timeout, m.MAX_PULL_TIMEOUT_MS) / 1000


class AcknowledgeRequest(RequestModel):
    """`POST .../subscriptions/{sub}:acknowledge` (alias `:ack`)."""

    ack_ids: list[str] = Field(min_length=1, max_length=m.MAX_ACK_IDS)

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ids = data.get("ack_ids")
        if ids is None or (isinstance(ids, list) and not ids):
            raise BadRequest(m.NO_ACK_IDS)
        if not isinstance(ids, list):
            raise BadRequest("ack_ids must be a list of strings")
        if len(ids) > m.MAX_ACK_IDS:
            raise BadRequest(m.TOO_MANY_ACK_IDS)
        if not all(isinstance(ack_id, str) and ack_id for ack_id in ids):
            raise BadRequest(m.INVALID_ACK_IDS)
        return data


# ------------------------------------------------------------------------------------------ views


class TopicState(ResponseModel):
    phase: str
    ready: bool
    message: str | None = Field(None, description="why the topic is not ready (omitted when ready)")
    published: int
    delivered: int
    published_bytes: int
    delivered_bytes: int
    storage_bytes: int
    backlog_bytes: int
    subscriptions: int
    producers: int


class Topic(ResponseModel):
    name: str
    display_name: str | None = None
    path: str
    max_bytes: str
    max_age: str | None = Field(None, description="omitted when there is no age limit")
    discard: Discard
    created_at: str
    address: str
    state: TopicState


class TopicList(ListPage):
    items_field: ClassVar[str] = "topics"
    topics: list[Topic]


class PubsubDeletion(ResponseModel):
    """202 of a topic or subscription delete."""

    name: str
    status: Literal["deleting"]


class PublishResult(ResponseModel):
    message_ids: list[str] = Field(description="`<n>:<n>`, in request order")


class PublishPartial(ResponseModel):
    """207: some messages were written before the failure."""

    message_ids: list[str]
    error: str
    published: int
    requested: int


class SubscriptionPushView(ResponseModel):
    url: str
    content_mode: ContentMode


class SubscriptionDeliverView(ResponseModel):
    mode: Literal["pull", "push"]
    push: SubscriptionPushView | None = None


class SubscriptionDeadLetterView(ResponseModel):
    topic: str | None = None
    after_attempts: int


class SubscriptionState(ResponseModel):
    phase: str
    ready: bool
    address: str
    active_type: SubscriptionType
    backlog: int
    unacknowledged: int
    delivered: int
    consumers: int
    redeliver_rate: float


class Subscription(ResponseModel):
    name: str
    display_name: str | None = None
    topic: str
    path: str
    type: SubscriptionType
    ack_deadline_seconds: int
    max_deliver: int
    start_from: Literal["all", "new"]
    max_ack_pending: int
    deliver: SubscriptionDeliverView
    dead_letter: SubscriptionDeadLetterView | None = None
    created_at: str | None = None
    state: SubscriptionState


class SubscriptionList(ListPage):
    items_field: ClassVar[str] = "subscriptions"
    subscriptions: list[Subscription]


class PulledMessage(ResponseModel):
    ack_id: str | None = Field(None, description="omitted with auto_ack")
    id: str
    data: str = Field(description="base64")
    attributes: dict[str, str]
    key: str | None = None
    publish_time: str
    delivery_attempt: int


class PullResult(ResponseModel):
    """200 `{messages}` (with auto_ack also `acknowledged`); 207 `{messages: [], acknowledged, error}`."""

    messages: list[PulledMessage]
    acknowledged: int | None = None
    error: str | None = None


class AcknowledgeResult(ResponseModel):
    acknowledged: int


class PubsubQuota(ResponseModel):
    limit_bytes: int
    allocated_bytes: int
    backlog_bytes: int
    storage_bytes: int
    available_bytes: int
    human: str
    topics: int
    provisioned: bool


class TopicUsage(ResponseModel):
    name: str
    published: int
    delivered: int
    published_bytes: int
    delivered_bytes: int
    storage_bytes: int
    backlog_bytes: int
    subscriptions: int


class UsageTotals(ResponseModel):
    published: int
    delivered: int
    published_bytes: int
    delivered_bytes: int
    storage_bytes: int
    backlog_bytes: int
    subscriptions: int


class PubsubUsage(ResponseModel):
    project: str
    topics: list[TopicUsage]
    totals: UsageTotals
    caveat: str


class BrokerCredentialView(ResponseModel):
    service_url: str
    external_endpoint: str | None = None
    external_service_url: str | None = Field(None, description="an alias of external_endpoint")
    reachable_scope: Literal["vpc"] | None = None
    token: str
    topic_prefix: str
    note: str


class PubsubDependency(ResponseModel):
    status: Literal["ok", "down", "not configured"]
    error: str | None = None
    critical: bool


class PubsubDependencies(ResponseModel):
    kubernetes: PubsubDependency
    database: PubsubDependency
    broker: PubsubDependency
    session_key: PubsubDependency = Field(alias="session-key")


class PubsubHealth(ResponseModel):
    status: Literal["ok", "degraded"]
    dependencies: PubsubDependencies


__all__ = [
    "AcknowledgeRequest", "AcknowledgeResult", "BrokerCredentialView", "SubscriptionDeadLetter", "SubscriptionDeadLetterView",
    "PubsubDeletion", "SubscriptionDeliver", "SubscriptionDeliverView", "PublishMessage", "PublishPartial", "PublishRequest",
    "PublishResult", "PubsubHealth", "PubsubQuota", "PubsubUsage", "PullRequest", "PullResult", "PulledMessage",
    "SubscriptionPush", "Subscription", "SubscriptionCreate", "SubscriptionList", "SubscriptionPatch", "Topic",
    "TopicCreate", "TopicList", "TopicPatch", "TopicUsage",
]
