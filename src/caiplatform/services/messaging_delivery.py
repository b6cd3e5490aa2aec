"""The data path: publish, pull and acknowledge, each gated by one prepared read of the caller's grant
with the topic (and the subscription): `MessageDelivery`, a layer of `TopicService`."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re
from typing import Any

from sqlalchemy import Select, and_, bindparam, select
from sqlalchemy.engine import Connection

from caiplatform.clock import rfc3339
from caiplatform.db.models import MessagingSubscription, MessagingTopic, Project, ProjectMember
from caiplatform.db.prepared import PreparedRead
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription, Topic
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound, Unavailable
from caiplatform.models import messaging as views
from caiplatform.models.messaging import AcknowledgeRequest, PublishRequest, PullRequest
from caiplatform.ports.broker import (
    BrokerError,
    BrokerUnavailable,
    OutgoingMessage,
    PublishFailed,
    StreamFull,
)
from caiplatform.principal import Principal
from caiplatform.services.access import GATE_COLUMNS, GATE_MEMBER_JOIN, ProjectRef, Role
from caiplatform.services.messaging_base import MessagingBase, subscription_of, topic_of
from caiplatform.services.messaging_tracing import traced_publish


def _b64url(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).rstrip(b"=").decode()


def _unb64url(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def broker_failure(what: str, exc: BrokerError) -> InternalError | Unavailable:
    """A broker that does not answer is 503 (nothing was done; retry), any other failure 500."""
    if isinstance(exc, BrokerUnavailable):
        return Unavailable(f"{what} failed: the message broker is unavailable, try again shortly ({exc})")
    return InternalError(f"{what} failed: {exc}")


# The reads of publish, pull and acknowledge, made on every request: one prepared statement each (built
# once, compiled once per dialect, run on the DB-API cursor) that reads the caller's grant on the project
# with the topic (and the subscription), rather than ORM queries built, compiled and loaded into objects
# each time (`Access.project_gate_sync`: a row per grant row of the caller). Rows carry the ORM attributes'
# names. Publish: the topic's columns (all None when there is no such topic).
def _topic_gate(*columns: Any) -> Select[Any]:
    """The project gate's columns and `columns`, from the project with the caller's grants and its topic
    named `topic` (outer joins: the gate's row exists whether or not the topic does)."""
    return (
        select(*GATE_COLUMNS, *columns)
        .select_from(Project)
        .outerjoin(ProjectMember, GATE_MEMBER_JOIN)
        .outerjoin(MessagingTopic, and_(MessagingTopic.project_id == Project.id, MessagingTopic.name == bindparam("topic")))
    )


_TOPIC_GATE = PreparedRead(_topic_gate(*MessagingTopic.__table__.columns).where(Project.id == bindparam("project")))
# Pull and acknowledge: the topic's id and the subscription's columns (`topic_row_id` None: no such topic;
# `id` None: no such subscription).
_SUBSCRIPTION_GATE = PreparedRead(
    _topic_gate(MessagingTopic.id.label("topic_row_id"), *MessagingSubscription.__table__.columns)
    .outerjoin(MessagingSubscription, and_(MessagingSubscription.topic_id == MessagingTopic.id,
                                           MessagingSubscription.name == bindparam("subscription")))
    .where(Project.id == bindparam("project"))
)


class MessageDelivery(MessagingBase):
    async def _project_topic(self, principal: Principal, project_id: str, name: str) -> tuple[ProjectRef, Topic]:
        """`_project` then the topic in one transaction: one trip to the database on the publish path."""
        self.access.require_management(principal)

        def read(connection: Connection) -> tuple[ProjectRef, Any]:
            grant, rows = self.access.project_gate_sync(connection, principal, project_id, _TOPIC_GATE,
                                                        {"topic": name}, need=Role.MEMBER, bad_id=NotFound)
            row = rows[0]
            return grant.project, (row if row.id is not None and m.valid_name(name) else None)

        project, row = await self.db.read(read)  # a read-only gate: no session, no transaction to commit
        if row is None:
            raise NotFound(m.TOPIC_NOT_FOUND)
        return project, topic_of(row, project)

    async def _project_subscription(self, principal: Principal, project_id: str, topic: str,
                                    name: str) -> tuple[ProjectRef, Subscription]:
        """`_project`, the topic and the subscription in one transaction: one trip to the database on pull
        and acknowledge."""
        self.access.require_management(principal)

        def read(connection: Connection) -> tuple[ProjectRef, Any]:
            grant, rows = self.access.project_gate_sync(connection, principal, project_id, _SUBSCRIPTION_GATE,
                                                        {"topic": topic, "subscription": name},
                                                        need=Role.MEMBER, bad_id=NotFound)
            row = rows[0]
            if not m.valid_name(topic) or row.topic_row_id is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            return grant.project, row if row.id is not None and m.valid_name(name) else None

        project, row = await self.db.read(read)  # a read-only gate: no session, no transaction to commit
        if row is None:
            raise NotFound(m.SUBSCRIPTION_NOT_FOUND)
        return project, subscription_of(row, project.short)

    # ------------------------------------------------------------------------------------ publish

    async def publish(
        self, principal: Principal, project_id: str, topic_name: str, body: PublishRequest,
        idempotency_key: str | None = None,
    ) -> tuple[int, views.PublishResult | views.PublishPartial]:
        """200 `{message_ids}` in request order; 207 `{message_ids, error, published, requested}` after a
        partial write; 409 when a `discard: new` topic is full before the first message.

        `idempotency_key` (the `Idempotency-Key` header): the request's messages carry ids derived from it,
        the caller and their place in the request, so a publish retried with the same key and messages
        (after a 503 or a 207) within the topic's duplicate window stores each message once and answers the
        same `message_ids`."""
        project, topic = await self._project_topic(principal, project_id, topic_name)
        messages = body.outgoing()
        if idempotency_key is not None:
            messages = with_message_ids(messages, idempotency_key, principal)
        if topic.phase != m.PHASE_READY:
            raise Conflict(m.TOPIC_NOT_READY)
        return await self.publish_to(topic, messages)

    @traced_publish  # while tracing: the `publish <topic>` span, its context in each message
    async def publish_to(
        self, topic: Topic, messages: list[OutgoingMessage]
    ) -> tuple[int, views.PublishResult | views.PublishPartial]:
        counters = self.counters(topic.project_id, topic.name)
        try:
            sequences = await self.broker.publish(topic.stream, topic.subject, messages)
        except PublishFailed as failed:
            done = failed.sequences
            counters.published += len(done)
            self.prometheus.observe_published(topic.project_short, topic.name, len(done))
            counters.published_bytes += sum(len(msg.data) for msg in messages[: len(done)])
            if not done:
                if isinstance(failed.cause, StreamFull):
                    raise Conflict(m.TOPIC_FULL) from failed
                raise broker_failure("publish", failed.cause) from failed
            error = m.TOPIC_FULL if isinstance(failed.cause, StreamFull) else f"publish failed: {failed.cause}"
            return 207, views.PublishPartial(message_ids=[m.message_id(seq) for seq in done], error=error,
                                             published=len(done), requested=len(messages))
        except BrokerError as exc:
            raise broker_failure("publish", exc) from exc
        counters.published += len(sequences)
        counters.published_bytes += sum(len(msg.data) for msg in messages)
        self.prometheus.observe_published(topic.project_short, topic.name, len(sequences))
        return 200, views.PublishResult(message_ids=[m.message_id(seq) for seq in sequences])

    # ------------------------------------------------------------------------------------ pull / ack

    async def pull(
        self, principal: Principal, project_id: str, topic: str, name: str, body: PullRequest | None = None
    ) -> tuple[int, views.PullResult]:
        """200 `{messages}` (with auto_ack also `acknowledged`); 207 when the auto-ack failed."""
        project, sub = await self._project_subscription(principal, project_id, topic, name)
        body = body or PullRequest()
        auto_ack = bool(body.auto_ack)
        if sub.deliver_mode == "push":
            raise Conflict(m.PULL_ON_PUSH)
        if sub.type in m.SINGLE_READER_TYPES:
            raise Conflict(m.PULL_ON_EXCLUSIVE)
        if sub.phase != m.PHASE_READY:
            raise Conflict(m.SUBSCRIPTION_NOT_READY)
        try:
            # An ordered subscription has one message in flight: asking for more would only wait.
            batch = 1 if sub.ordered else body.batch
            deliveries = await self.broker.pull(sub.stream, sub.consumer, batch, body.timeout_seconds)
        except BrokerError as exc:
            raise broker_failure("pull", exc) from exc
        self.record_delivered(project.id, topic, len(deliveries), sum(len(d.data) for d in deliveries))
        # The views are built from the broker's values, already in their declared types: constructed, not
        # validated again (a hundred models a pull). Fields left out stay unset, so `to_json` omits them.
        messages = []
        for delivery in deliveries:
            fields: dict[str, Any] = {} if auto_ack else {"ack_id": _b64url(delivery.token)}
            fields.update(
                id=m.message_id(delivery.sequence),
                data=base64.b64encode(delivery.data).decode(),
                attributes=delivery.attributes,
            )
            if delivery.key is not None:
                fields["key"] = delivery.key
            fields["publish_time"] = rfc3339(delivery.published_at)
            fields["delivery_attempt"] = delivery.delivery_count
            messages.append(views.PulledMessage.model_construct(**fields))
        if not auto_ack:
            return 200, views.PullResult.model_construct(messages=messages)
        try:
            acknowledged = await self.broker.ack([d.token for d in deliveries]) if deliveries else 0
        except BrokerError as exc:
            return 207, views.PullResult(messages=[], acknowledged=0,
                                         error=f"auto_ack failed, the messages will be redelivered: {exc}")
        return 200, views.PullResult.model_construct(messages=messages, acknowledged=acknowledged)

    async def acknowledge(
        self, principal: Principal, project_id: str, topic: str, name: str, body: AcknowledgeRequest
    ) -> views.AcknowledgeResult:
        _, sub = await self._project_subscription(principal, project_id, topic, name)
        tokens = []
        for ack_id in body.ack_ids:
            token = _unb64url(ack_id) if ack_id else None
            if token is None or not self.broker.token_belongs(token, sub.stream, sub.consumer):
                raise BadRequest(m.INVALID_ACK_IDS)
            tokens.append(token)
        try:
            acknowledged = await self.broker.ack(list(dict.fromkeys(tokens)))
        except BrokerError as exc:
            raise broker_failure("acknowledge", exc) from exc
        return views.AcknowledgeResult(acknowledged=acknowledged)


IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,200}")
IDEMPOTENCY_KEY_MESSAGE = "the Idempotency-Key header must be 1 to 200 visible ASCII characters"


def with_message_ids(messages: list[OutgoingMessage], key: str, principal: Principal) -> list[OutgoingMessage]:
    """The messages of one publish with their de-duplication ids, `<digest>:<index>`: the digest of the
    caller and `key`, so two callers (or two projects' keys) that choose the same key never drop each
    other's messages, and the index, so the messages of one request are each their own."""
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest(IDEMPOTENCY_KEY_MESSAGE)
    digest = hashlib.blake2b(f"{principal.rate_key}\0{key}".encode(), digest_size=16).hexdigest()
    return [dataclasses.replace(message, msg_id=f"{digest}:{index}") for index, message in enumerate(messages)]
