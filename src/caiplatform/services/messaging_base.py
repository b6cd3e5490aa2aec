"""The messaging service's ground floor (document 3): what every layer of `TopicService` shares.

The service's state (database, gate, broker, counters, change hooks), the project gate, a topic's and a
subscription's rows read as the domain's values, and the broker's consumer settings of a subscription.
The layers on top, one concern each: `messaging_topics.py` (topics, quota, usage, the broker
credential), `messaging_subscriptions.py` (subscriptions), `messaging_delivery.py` (publish, pull,
acknowledge: the data path), and `messaging.py` (`TopicService`: the broker's reconcile and health).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.db.models import MessagingSubscription, MessagingTopic
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription, Topic, TopicCounters
from caiplatform.errors import InternalError, NotFound
from caiplatform.metrics import Metrics
from caiplatform.pagination import Pager
from caiplatform.ports.broker import Broker, BrokerError, ConsumerConfig, CredentialIssuer
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[tuple[str, str | None]]]  # ("ok" | "down" | "not configured", error)


def topic_of(row: Any, project: ProjectRef) -> Topic:
    return Topic(
        project_id=row.project_id,
        project_short=project.short,
        name=row.name,
        display_name=row.display_name or "",
        max_bytes=row.max_bytes,
        max_bytes_value=row.max_bytes_value,
        max_age_seconds=row.max_age_seconds or 0.0,
        discard=row.discard,
        phase=row.phase,
        created_at=row.created_at,
    )


def subscription_of(row: MessagingSubscription | Row[Any], project_short: str) -> Subscription:
    return Subscription(
        project_id=row.project_id,
        project_short=project_short,
        topic=row.topic_name,
        name=row.name,
        display_name=row.display_name or "",
        type=row.type,
        ack_deadline_seconds=row.ack_deadline_seconds,
        max_deliver=row.max_deliver,
        start_from=row.start_from,
        max_ack_pending=row.max_ack_pending,
        deliver_mode=row.deliver_mode,
        push_url=row.push_url or "",
        content_mode=row.content_mode,
        dead_letter_topic=row.dead_letter_topic or "",
        dead_letter_after_attempts=row.dead_letter_after_attempts,
        phase=row.phase,
        created_at=row.created_at,
    )


def consumer_config(sub: Subscription) -> ConsumerConfig:
    """Ordered types (key-shared, exclusive, failover) keep one message in flight, which keeps the order
    per key (and in total); exclusive and failover also have one active reader (pinned by the broker,
    taken over when it stops pulling); the push worker enforces `max_deliver`, so the broker redelivers
    forever."""
    return ConsumerConfig(
        stream=sub.stream,
        name=sub.consumer,
        ack_wait=float(sub.ack_deadline_seconds),
        max_ack_pending=1 if sub.ordered else sub.max_ack_pending,
        deliver_new=sub.start_from == "new",
        single_reader=sub.type in ("exclusive", "failover"),
    )


Provisioned = TypeVar("Provisioned", MessagingTopic, MessagingSubscription)


class MessagingBase:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        broker: Broker,
        *,
        budget_bytes: int = m.DEFAULT_BUDGET_BYTES,
        credentials: CredentialIssuer | None = None,
        checks: Mapping[str, HealthCheck] | None = None,
        metrics: Metrics | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.broker = broker
        self.budget_bytes = budget_bytes
        self.credentials_issuer = credentials
        self._checks = dict(checks or {})
        # cai_messages_published_total and the push worker's cai_push_deliveries_total (docs/observability.md)
        self.prometheus = metrics or Metrics()
        self._counters: dict[tuple[str, str], TopicCounters] = {}
        # Called (awaited, in the request) after subscriptions change: the push worker re-reads them.
        self.on_subscriptions_changed: list[Callable[[], Awaitable[None]]] = []
        # Called after a topic is created or deleted: the embedded broker re-grants project users.
        self.on_topics_changed: list[Callable[[], Awaitable[None]]] = []

    async def _topics_changed(self) -> None:
        for hook in self.on_topics_changed:
            try:
                await hook()
            except Exception:  # noqa: BLE001 - the topic exists; credentials catch up at the next change
                log.exception("a topic-change hook failed")

    async def _subscriptions_changed(self) -> None:
        for hook in self.on_subscriptions_changed:
            try:
                await hook()
            except Exception:  # noqa: BLE001 - the change is done; the worker's next refresh catches up
                log.exception("a subscription-change hook failed")

    def set_broker(self, broker: Broker) -> None:
        self.broker = broker

    # ------------------------------------------------------------------------------------ helpers

    async def _project(self, principal: Principal, project_id: str, *, admin: bool = False) -> ProjectRef:
        """The project gate (a malformed project id is 404 in document 3's messaging)."""
        return await self.access.project_ref(principal, project_id, Role.ADMIN if admin else Role.MEMBER,
                                             bad_id=NotFound)

    @staticmethod
    def _topic_row(session: Session, project_id: str, name: str) -> MessagingTopic | None:
        if not m.valid_name(name):
            return None
        return session.scalar(
            select(MessagingTopic).where(MessagingTopic.project_id == project_id, MessagingTopic.name == name)
        )

    @staticmethod
    def _sub_row(session: Session, topic: MessagingTopic, name: str) -> MessagingSubscription | None:
        if not m.valid_name(name):
            return None
        return session.scalar(
            select(MessagingSubscription).where(
                MessagingSubscription.topic_id == topic.id, MessagingSubscription.name == name
            )
        )

    async def _topic(self, project: ProjectRef, name: str) -> Topic:
        row = await self.db.run(lambda s: self._topic_row(s, project.id, name))
        if row is None:
            raise NotFound(m.TOPIC_NOT_FOUND)
        return topic_of(row, project)

    def counters(self, project_id: str, topic: str) -> TopicCounters:
        return self._counters.setdefault((project_id, topic), TopicCounters())

    def record_delivered(self, project_id: str, topic: str, count: int, n_bytes: int) -> None:
        counters = self.counters(project_id, topic)
        counters.delivered += count
        counters.delivered_bytes += n_bytes

    async def _made_on_broker(self, model: type[Provisioned], row_id: Any,
                              make: Callable[[], Awaitable[object]], what: str) -> None:
        """The broker's side of a row just inserted (a topic's stream, a subscription's consumer): made, then
        the row is ready; if the broker refuses, the row goes and the caller gets a 500."""
        try:
            await make()
        except BrokerError as exc:
            await self.db.run(lambda s: s.delete(s.get(model, row_id)))
            raise InternalError(f"could not create the {what} on the broker: {exc}") from exc

        def ready(session: Session) -> None:
            stored = session.get(model, row_id)
            if stored is not None:
                stored.phase = m.PHASE_READY

        await self.db.run(ready)
