"""Messaging (document 3): topics, subscriptions and their rules, limits and exact messages.

A topic is a JetStream stream `cai-<project short>-<topic>` on the subject `cai.<short>.<topic>`; a
subscription is a durable consumer `<subscription>` on that stream. The in-memory broker keeps the same
names so both adapters behave alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

from caiplatform.clock import rfc3339

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

PUBLISH_BODY_LIMIT = 4 * MiB
OTHER_BODY_LIMIT = 1 * MiB
MAX_PUBLISH_MESSAGES = 100
MAX_PULL_MESSAGES = 100
DEFAULT_PULL_MESSAGES = 10
DEFAULT_PULL_TIMEOUT_MS = 2000
MAX_PULL_TIMEOUT_MS = 20000
MAX_ACK_IDS = 1000
NAME_MAX = 63
NAME_PATTERN = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
DEFAULT_MAX_BYTES = "16Mi"
DEFAULT_BUDGET_BYTES = 1 * GiB
MAX_TOPICS_PER_PROJECT = 100
DEFAULT_ACK_DEADLINE = 30
DEFAULT_MAX_ACK_PENDING = 1000
DEFAULT_AFTER_ATTEMPTS = 5
PUSH_RESPONSE_READ_LIMIT = 64 * KiB
PUSH_BACKOFF_INITIAL = 1.0
PUSH_BACKOFF_CAP = 60.0

TOPIC_VERBS = ("publish",)
SUBSCRIPTION_VERBS = ("pull", "acknowledge", "ack")
SUBSCRIPTION_TYPES = ("shared", "key-shared", "exclusive", "failover")
# Types that promise total order with one active reader: the pull API cannot give that promise.
SINGLE_READER_TYPES = ("exclusive", "failover")
CONTENT_MODES = ("cloudevents-structured", "cloudevents-binary")
CLOUDEVENT_TYPE = "ai.platform.pubsub.message.v1"
DEAD_LETTER_PREFIX = "cai-dead-letter-"

PHASE_PENDING = "Pending"
PHASE_READY = "Ready"

# -- exact messages ----------------------------------------------------------------------------------
BARE_TOPIC_POST = "POST to a topic requires a method suffix, e.g. .../topics/<name>:publish"
BARE_SUBSCRIPTION_POST = "POST to a subscription requires a method suffix, e.g. .../subscriptions/<name>:pull"
TOPIC_NOT_FOUND = "topic not found"
SUBSCRIPTION_NOT_FOUND = "subscription not found"
TOPIC_EXISTS = "a topic with that name already exists in this project"
SUBSCRIPTION_EXISTS = "a subscription with that name already exists on this topic"
TOPIC_NOT_READY = "the topic is not ready yet; poll it until state.ready is true, then retry"
SUBSCRIPTION_NOT_READY = "the subscription is not ready yet; poll it until state.ready is true, then retry"
PULL_ON_PUSH = (
    "this is a push subscription: the platform delivers its messages to deliver.push.url; "
    "create a separate pull subscription to pull messages"
)
PULL_ON_EXCLUSIVE = (
    "an exclusive subscription cannot be read through the pull API: it has one reader in total order; "
    "use push or a direct client"
)
TOPIC_FULL = (
    "the topic is full and its discard policy is new: it refuses messages until subscribers acknowledge "
    "the backlog; raise max_bytes or consume faster"
)
NO_MESSAGES = "messages must contain at least one message"
NO_ACK_IDS = "ack_ids must contain at least one id"
TOO_MANY_ACK_IDS = "at most 1000 acknowledgement ids per request"
INVALID_ACK_IDS = "one or more acknowledgement ids are not valid for this subscription"
TOPIC_LIMIT = f"a project holds at most {MAX_TOPICS_PER_PROJECT} topics; delete one first"
DEAD_LETTER_SAME_TOPIC = "dead_letter.topic must differ from the subscription's own topic"
CONTENT_MODE_RULE = 'deliver.push.content_mode must be "cloudevents-structured" or "cloudevents-binary"'
TYPE_RULE = 'type must be one of "shared", "key-shared", "exclusive" or "failover"'
ACK_DEADLINE_RULE = "ack_deadline_seconds must be between 1 and 600"
MAX_DELIVER_RULE = "max_deliver must not be negative"


def unknown_verb(verb: str) -> str:
    return f"unknown method :{verb}"


def name_error(kind: str, value: Any) -> str | None:
    """The message for a bad topic or subscription name, or None when it is valid."""
    if value is None or value == "":
        return f"{kind} name is required"
    if not isinstance(value, str):
        return f"{kind} name must be a string"
    if len(value) > NAME_MAX:
        return f"{kind} name must be {NAME_MAX} characters or fewer"
    if not NAME_PATTERN.match(value):
        return (
            f'invalid {kind} name "{value}": use lowercase letters, digits and hyphens, '
            "starting with a letter and ending with a letter or digit"
        )
    return None


def valid_name(value: Any) -> bool:
    return name_error("topic", value) is None


# -- durations (Go's time.ParseDuration grammar) ----------------------------------------------------
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float | None:
    """Seconds of a Go duration string (`90s`, `1h30m`, `720h`), or None when it is not one.
    Negative durations are refused: an age limit cannot be negative."""
    if not isinstance(text, str) or not text:
        return None
    if text == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if not match:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """A compact Go-style duration without zero parts (`24h`, `1h30m`, `90s` → `1m30s`, `500ms`), so that a
    limit reads back the way it is usually written."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    secs_total = secs + (seconds - whole)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if secs_total:
        parts.append(f"{round(secs_total, 9):g}s")
    return "".join(parts)


# A Kubernetes resource quantity in bytes: a decimal number (fractions and exponents allowed, `1.5Gi`,
# `0.5Mi`, `1e6`) with a binary or decimal suffix; sub-byte suffixes (m, u, n) make no sense for bytes.
_BYTES_QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                             r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?[0-9]{1,3}))?$")
_BYTES_FACTORS = {"Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
                  "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_bytes(text: Any) -> int | None:
    """Bytes of a positive resource quantity (`16Mi`, `1.5Gi`, `100M`, `1e9`), rounded up to a whole byte
    as Kubernetes does, or None when it is not one."""
    if not isinstance(text, str):
        return None
    match = _BYTES_QUANTITY.match(text.strip())
    if not match:
        return None
    number = Fraction(match["number"])
    if match["suffix"]:
        number *= _BYTES_FACTORS[match["suffix"]]
    elif match["exponent"]:
        number *= Fraction(10) ** int(match["exponent"])
    value = math.ceil(number)
    return value if value > 0 else None


def human_bytes(n: int) -> str:
    """`1.0GiB`, `16.0MiB`, `512B`: how budget messages speak of sizes."""
    for unit, factor in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= factor:
            return f"{n / factor:.1f}{unit}"
    return f"{n}B"


def service_key(host: str) -> str | None:
    """`<service>.<namespace>` of a push host (`<service>.<namespace>[.svc[.cluster.local]]`), else None."""
    labels = host.lower().rstrip(".").split(".")
    if len(labels) == 2 or (len(labels) == 3 and labels[2] == "svc") or (
        len(labels) == 5 and labels[2:] == ["svc", "cluster", "local"]
    ):
        return f"{labels[0]}.{labels[1]}"
    return None


def backoff_delay(attempt: int) -> float:
    """Push retry delay after failed attempt number `attempt` (1-based): 1 s, 2 s, 4 s ... capped at 60 s."""
    return min(PUSH_BACKOFF_INITIAL * (2 ** max(attempt - 1, 0)), PUSH_BACKOFF_CAP)


def stream_name(project_short: str, topic: str) -> str:
    return f"cai-{project_short}-{topic}"


def subject_of(project_short: str, topic: str) -> str:
    return f"cai.{project_short}.{topic}"


def subject_prefix(project_short: str) -> str:
    return f"cai.{project_short}."


def message_id(sequence: int) -> str:
    """Public id `<n>:<n>`: the broker's ledger (always 0 for JetStream's single sequence) and the sequence."""
    return f"0:{sequence}"


# -- resources ------------------------------------------------------------------------------------


@dataclass
class TopicCounters:
    """Per-topic counters kept by the serving process; they reset on restart (as the spec allows)."""

    published: int = 0
    delivered: int = 0
    published_bytes: int = 0
    delivered_bytes: int = 0


@dataclass
class Topic:
    project_id: str
    project_short: str
    name: str
    display_name: str
    max_bytes: str
    max_bytes_value: int
    max_age_seconds: float
    discard: str
    phase: str
    created_at: datetime

    @property
    def stream(self) -> str:
        return stream_name(self.project_short, self.name)

    @property
    def subject(self) -> str:
        return subject_of(self.project_short, self.name)

    @property
    def path(self) -> str:
        return f"projects/{self.project_short}/topics/{self.name}"

    def to_json(self, state: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name}
        if self.display_name:
            body["display_name"] = self.display_name
        body["path"] = self.path
        body["max_bytes"] = self.max_bytes
        if self.max_age_seconds:
            body["max_age"] = format_duration(self.max_age_seconds)
        body["discard"] = self.discard
        body["created_at"] = rfc3339(self.created_at)
        body["address"] = f"jetstream://{self.stream}/{self.subject}"
        body["state"] = state
        return body


@dataclass
class Subscription:
    project_id: str
    project_short: str
    topic: str
    name: str
    display_name: str = ""
    type: str = "shared"
    ack_deadline_seconds: int = DEFAULT_ACK_DEADLINE
    max_deliver: int = 0
    start_from: str = "all"
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    deliver_mode: str = "pull"
    push_url: str = ""
    content_mode: str = "cloudevents-structured"
    dead_letter_topic: str = ""
    dead_letter_after_attempts: int = DEFAULT_AFTER_ATTEMPTS
    phase: str = PHASE_READY
    created_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stream(self) -> str:
        return stream_name(self.project_short, self.topic)

    @property
    def consumer(self) -> str:
        return self.name

    @property
    def path(self) -> str:
        return f"projects/{self.project_short}/topics/{self.topic}/subscriptions/{self.name}"

    @property
    def ordered(self) -> bool:
        """Types whose order the broker must keep: one message in flight at a time."""
        return self.type != "shared"

    def to_json(self, state: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name}
        if self.display_name:
            body["display_name"] = self.display_name
        deliver: dict[str, Any] = {"mode": self.deliver_mode}
        if self.deliver_mode == "push":
            deliver["push"] = {"url": self.push_url, "content_mode": self.content_mode}
        body.update(
            {
                "topic": self.topic,
                "path": self.path,
                "type": self.type,
                "ack_deadline_seconds": self.ack_deadline_seconds,
                "max_deliver": self.max_deliver,
                "start_from": self.start_from,
                "max_ack_pending": self.max_ack_pending,
                "deliver": deliver,
            }
        )
        # `after_attempts` also bounds a push message without a dead-letter topic (it is dropped then), so a
        # value the caller set reads back even when no topic is set.
        if self.dead_letter_topic:
            body["dead_letter"] = {"topic": self.dead_letter_topic, "after_attempts": self.dead_letter_after_attempts}
        elif self.dead_letter_after_attempts != DEFAULT_AFTER_ATTEMPTS:
            body["dead_letter"] = {"after_attempts": self.dead_letter_after_attempts}
        if self.created_at is not None:
            body["created_at"] = rfc3339(self.created_at)
        body["state"] = state
        return body


