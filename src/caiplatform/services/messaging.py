"""TopicService: the messaging API's rules (document 3), over the broker port.

Members list and read topics and subscriptions, publish, pull, acknowledge and read quota and usage;
project admins also create, edit and delete topics and subscriptions and read the broker credential.
Topics and subscriptions are recorded in the database (fields, storage claim, phase) and live on the
broker as streams and durable consumers (`caiplatform.ports.broker`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Select, and_, bindparam, func, select
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import MessagingSubscription, MessagingTopic, Project, ProjectMember
from caiplatform.db.prepared import PreparedRead
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription, Topic, TopicCounters
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound, Unavailable
from caiplatform.metrics import Metrics
from caiplatform.models import messaging as views
from caiplatform.models.messaging import (
    AcknowledgeRequest,
    PublishRequest,
    PullRequest,
    SubscriptionCreate,
    SubscriptionDeliver,
    SubscriptionPatch,
    TopicCreate,
    TopicPatch,
    is_int,
)
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.broker import (
    Broker,
    BrokerError,
    BrokerUnavailable,
    ConsumerConfig,
    CredentialIssuer,
    OutgoingMessage,
    PublishFailed,
    StreamConfig,
    StreamFull,
)
from caiplatform.principal import Principal
from caiplatform.services.access import GATE_COLUMNS, GATE_MEMBER_JOIN, Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.messaging_tracing import traced_publish
from caiplatform.services.purge import remove_each

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[tuple[str, str | None]]]  # ("ok" | "down" | "not configured", error)


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


def push_url_problem(url: str, namespace: str) -> str | None:
    """Why a push URL is not allowed, or None. Scheme `http` only; host exactly `<service>.<namespace>`,
    `<service>.<namespace>.svc` or `<service>.<namespace>.svc.cluster.local`; no userinfo."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme != "http":
        return f'scheme must be "http" (got "{parts.scheme}")'
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "userinfo (user:password@) is not allowed"
    key = m.service_key(parts.hostname or "")
    service, _, host_namespace = (key or "").partition(".")
    if key is None or host_namespace != namespace or not m.NAME_PATTERN.match(service or "-"):
        return (
            f"host must be <service>.{namespace}, <service>.{namespace}.svc or "
            f"<service>.{namespace}.svc.cluster.local (a service in this project's own namespace)"
        )
    return None


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


def _topic_of(row: Any, project: ProjectRef) -> Topic:
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


class TopicService:
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
        return _topic_of(row, project)

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
        return project, _topic_of(row, project)

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

    async def _subscription(self, project: ProjectRef, topic: str, name: str) -> Subscription:
        def read(session: Session) -> MessagingSubscription | None:
            row = self._topic_row(session, project.id, topic)
            if row is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            return self._sub_row(session, row, name)

        row = await self.db.run(read)
        if row is None:
            raise NotFound(m.SUBSCRIPTION_NOT_FOUND)
        return subscription_of(row, project.short)

    def counters(self, project_id: str, topic: str) -> TopicCounters:
        return self._counters.setdefault((project_id, topic), TopicCounters())

    def record_delivered(self, project_id: str, topic: str, count: int, n_bytes: int) -> None:
        counters = self.counters(project_id, topic)
        counters.delivered += count
        counters.delivered_bytes += n_bytes

    def _budget_of(self, session: Session, project_id: str) -> int:
        project = session.get(Project, project_id)
        configured = (project.settings or {}).get("pubsub_budget_bytes") if project is not None else None
        return int(configured) if is_int(configured) and configured > 0 else self.budget_bytes

    def _check_budget(self, session: Session, project_id: str, extra: int, *, excluding: str | None = None) -> None:
        limit = self._budget_of(session, project_id)
        rows = session.execute(
            select(MessagingTopic.name, MessagingTopic.max_bytes_value).where(MessagingTopic.project_id == project_id)
        ).all()
        claimed = sum(v for name, v in rows if name != excluding)
        needed = extra
        if claimed + needed > limit:
            available = max(limit - claimed, 0)
            raise Conflict(
                "this topic does not fit in the project's messaging storage budget: the budget is "
                f"{m.human_bytes(limit)}, {m.human_bytes(claimed)} is already claimed by {len(rows)} "
                f"topic{'s' if len(rows) != 1 else ''} (each topic claims its max_bytes), and this topic "
                f"needs {m.human_bytes(needed)} with only {m.human_bytes(available)} available; delete a "
                "topic, lower a max_bytes, or ask the operator to raise the quota"
            )

    async def _topic_state(self, topic: Topic, n_subscriptions: int) -> dict[str, Any]:
        counters = self.counters(topic.project_id, topic.name)
        stored = 0
        ready = topic.phase == m.PHASE_READY
        if ready:
            try:
                stats = await self.broker.stream_stats(topic.stream)
            except BrokerError:
                stats = None
            stored = stats.bytes if stats else 0
        state: dict[str, Any] = {"phase": topic.phase, "ready": ready}
        if not ready:
            state["message"] = "the topic is being created on the broker"
        state.update(
            published=counters.published,
            delivered=counters.delivered,
            published_bytes=counters.published_bytes,
            delivered_bytes=counters.delivered_bytes,
            storage_bytes=stored,
            backlog_bytes=stored,
            subscriptions=n_subscriptions,
            producers=0,
        )
        return state

    async def _sub_state(self, sub: Subscription) -> dict[str, Any]:
        try:
            stats = await self.broker.consumer_stats(sub.stream, sub.consumer)
        except BrokerError:
            stats = None
        ready = sub.phase == m.PHASE_READY and stats is not None
        state: dict[str, Any] = {
            "phase": m.PHASE_READY if ready else m.PHASE_PENDING,
            "ready": ready,
            "address": f"jetstream://{sub.stream}/{sub.consumer}",
            "active_type": sub.type,
            "backlog": (stats.pending + stats.ack_pending) if stats else 0,
            "unacknowledged": stats.ack_pending if stats else 0,
            "delivered": stats.delivered if stats else 0,
            # Readers with a pull waiting at the broker; the push worker is one of them while it pulls, so
            # a push subscription counts it once, pulling or between two pulls.
            "consumers": max(stats.waiting if stats else 0, 1 if sub.deliver_mode == "push" else 0),
            "redeliver_rate": round(stats.redelivered / stats.delivered, 4) if stats and stats.delivered else 0.0,
        }
        return state

    async def _count_subs(self, project_id: str, topic: str) -> int:
        return await self.db.run(
            lambda s: s.scalar(
                select(func.count()).select_from(MessagingSubscription).where(
                    MessagingSubscription.project_id == project_id, MessagingSubscription.topic_name == topic
                )
            )
            or 0
        )

    async def _topic_json(self, topic: Topic) -> dict[str, Any]:
        return topic.to_json(await self._topic_state(topic, await self._count_subs(topic.project_id, topic.name)))

    async def _audit(self, project: ProjectRef, principal: Principal, action: str, target: str, detail: Any = None) -> None:
        await self.db.run(lambda s: self.audit.record(s, project.id, principal, action, target, detail))

    # ------------------------------------------------------------------------------------ topics

    async def list_topics(
        self, principal: Principal, project_id: str, *, page_size: Any = None, page_token: str | None = None
    ) -> views.TopicList:
        project = await self._project(principal, project_id)
        request = self.pager.request(f"topics:{project.id}", page_size, page_token)
        rows = await self.db.run(
            lambda s: list(
                s.scalars(
                    select(MessagingTopic).where(MessagingTopic.project_id == project.id).order_by(MessagingTopic.name)
                )
            )
        )
        page = self.pager.page(rows, request)
        items = [await self._topic_json(_topic_of(row, project)) for row in page.items]
        return views.TopicList.of(page_body("topics", Page(items, page.next_page_token, page.extra),
                                            omit_empty_token=True))

    async def create_topic(self, principal: Principal, project_id: str, body: TopicCreate) -> views.Topic:
        """201: the topic, `Pending` until the broker has its stream (which `create` waits for)."""
        project = await self._project(principal, project_id, admin=True)
        name = body.name
        max_text = body.max_bytes or m.DEFAULT_MAX_BYTES
        max_value = m.parse_bytes(max_text) or 0
        max_age, discard = body.max_age_seconds or 0.0, body.discard or "old"
        now = self.clock.now()

        def insert(session: Session) -> MessagingTopic:
            if self._topic_row(session, project.id, name) is not None:
                raise Conflict(m.TOPIC_EXISTS)
            count = session.scalar(
                select(func.count()).select_from(MessagingTopic).where(MessagingTopic.project_id == project.id)
            )
            if (count or 0) >= m.MAX_TOPICS_PER_PROJECT:
                raise Conflict(m.TOPIC_LIMIT)
            self._check_budget(session, project.id, max_value)
            row = MessagingTopic(
                project_id=project.id, name=name, display_name=body.display_name or "", max_bytes=max_text,
                max_bytes_value=max_value, max_age_seconds=max_age, discard=discard,
                phase=m.PHASE_PENDING, created_at=now, updated_at=now,
            )
            session.add(row)
            session.flush()
            self.audit.record(session, project.id, principal, "pubsub.topic.create", name,
                              {"max_bytes": max_text, "discard": discard})
            return row

        try:
            row = await self.db.run(insert)
        except IntegrityError:  # a concurrent create of the same name won the insert
            raise Conflict(m.TOPIC_EXISTS) from None
        topic = _topic_of(row, project)
        created = topic.to_json(await self._topic_state(topic, 0))
        try:
            await self.broker.create_stream(
                StreamConfig(topic.stream, topic.subject, max_value, max_age, discard)
            )
        except BrokerError as exc:
            await self.db.run(lambda s: s.delete(s.get(MessagingTopic, row.id)))
            raise InternalError(f"could not create the topic on the broker: {exc}") from exc

        def ready(session: Session) -> None:
            stored = session.get(MessagingTopic, row.id)
            if stored is not None:
                stored.phase = m.PHASE_READY

        await self.db.run(ready)
        self._counters[(project.id, name)] = TopicCounters()
        await self._topics_changed()
        return views.Topic.of(created)

    async def get_topic(self, principal: Principal, project_id: str, name: str) -> views.Topic:
        project = await self._project(principal, project_id)
        return views.Topic.of(await self._topic_json(await self._topic(project, name)))

    async def update_topic(self, principal: Principal, project_id: str, name: str, body: TopicPatch) -> views.Topic:
        project = await self._project(principal, project_id, admin=True)
        await self._topic(project, name)
        if body.name not in (None, name):
            raise BadRequest("topic name is immutable")
        changes: dict[str, Any] = {}
        if body.display_name is not None:
            changes["display_name"] = body.display_name
        if body.max_bytes is not None:
            changes["max_bytes"] = (body.max_bytes, body.max_bytes_value)
        if body.max_age_seconds is not None:
            changes["max_age"] = body.max_age_seconds
        if body.discard is not None:
            changes["discard"] = body.discard

        def apply(session: Session) -> tuple[MessagingTopic, dict[str, Any]]:
            row = self._topic_row(session, project.id, name)
            if row is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            before = {"max_bytes": (row.max_bytes, row.max_bytes_value), "max_age": row.max_age_seconds,
                      "discard": row.discard, "display_name": row.display_name}
            if "max_bytes" in changes:
                text, value = changes["max_bytes"]
                if value > row.max_bytes_value:
                    self._check_budget(session, project.id, value, excluding=name)
                row.max_bytes, row.max_bytes_value = text, value
            if "max_age" in changes:
                row.max_age_seconds = changes["max_age"]
            if "discard" in changes:
                row.discard = changes["discard"]
            if "display_name" in changes:
                row.display_name = changes["display_name"]
            row.updated_at = self.clock.now()
            self.audit.record(session, project.id, principal, "pubsub.topic.update", name,
                              {k: v for k, v in changes.items() if k != "max_bytes"} | (
                                  {"max_bytes": changes["max_bytes"][0]} if "max_bytes" in changes else {}))
            return row, before

        row, before = await self.db.run(apply)
        topic = _topic_of(row, project)
        try:
            await self.broker.update_stream(
                StreamConfig(topic.stream, topic.subject, topic.max_bytes_value, topic.max_age_seconds, topic.discard)
            )
        except BrokerError as exc:

            def revert(session: Session) -> None:
                stored = session.get(MessagingTopic, row.id)
                if stored is not None:
                    stored.max_bytes, stored.max_bytes_value = before["max_bytes"]
                    stored.max_age_seconds = before["max_age"]
                    stored.discard = before["discard"]
                    stored.display_name = before["display_name"]

            await self.db.run(revert)
            raise InternalError(f"could not update the topic on the broker: {exc}") from exc
        return views.Topic.of(await self._topic_json(topic))

    async def delete_topic(self, principal: Principal, project_id: str, name: str) -> views.PubsubDeletion:
        """202 `{name, status: deleting}`: the stream and every subscription go with it."""
        project = await self._project(principal, project_id, admin=True)
        await self._remove_topic(await self._topic(project, name), principal)
        await self._topics_changed()
        await self._subscriptions_changed()
        return views.PubsubDeletion(name=name, status="deleting")

    async def _remove_topic(self, topic: Topic, principal: Principal | None) -> None:
        """The records of the topic and its subscriptions, then its stream (the consumers go with it);
        the caller runs the change hooks. `principal` None: the platform acts (a project delete)."""

        def remove(session: Session) -> None:
            row = self._topic_row(session, topic.project_id, topic.name)
            if row is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            for sub in session.scalars(select(MessagingSubscription).where(MessagingSubscription.topic_id == row.id)):
                session.delete(sub)
            session.delete(row)
            self.audit.record(session, topic.project_id, principal, "pubsub.topic.delete", topic.name, None)

        await self.db.run(remove)
        try:
            await self.broker.delete_stream(topic.stream)
        except BrokerError:
            log.exception("deleting stream %s; the record is gone, the stream stays until retried", topic.stream)
        self._counters.pop((topic.project_id, topic.name), None)

    async def purge_project(self, project_id: str) -> int:
        """Remove every topic of a project being deleted (for the projects area), with its subscriptions,
        stream and consumers; push delivery to them stops. Returns how many topics were removed."""

        def read(session: Session) -> list[Topic]:
            project = session.get(Project, project_id)
            if project is None:
                return []
            rows = session.scalars(select(MessagingTopic).where(MessagingTopic.project_id == project_id)
                                   .order_by(MessagingTopic.name))
            return [_topic_of(row, ProjectRef.of(project)) for row in rows]

        topics = await self.db.run(read)
        if not topics:
            return 0
        removed = await remove_each("topic", topics, lambda t: t.name, lambda t: self._remove_topic(t, None))
        await self._topics_changed()
        await self._subscriptions_changed()
        return removed

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

    # ------------------------------------------------------------------------------------ subscriptions

    async def _dead_letter_exists(self, project: ProjectRef, topic: str) -> bool:
        return await self.db.run(lambda s: self._topic_row(s, project.id, topic) is not None)

    async def _apply_subscription_fields(
        self, project: ProjectRef, sub: Subscription, body: SubscriptionCreate | SubscriptionPatch, *, creating: bool
    ) -> None:
        """Write the given fields onto `sub` (every field on create, the given ones on PATCH), with the rules
        that need the subscription or the project (the model has checked the rest)."""
        if body.display_name is not None:
            sub.display_name = body.display_name
        if creating:
            if body.type is not None:
                sub.type = body.type
            if body.start_from is not None:
                sub.start_from = body.start_from
        else:
            for key, current in (("topic", sub.topic), ("type", sub.type), ("start_from", sub.start_from),
                                 ("name", sub.name)):
                if getattr(body, key) not in (None, current):
                    raise BadRequest(f"{key} is immutable; create a new subscription to change it")
        if body.ack_deadline_seconds is not None:
            sub.ack_deadline_seconds = body.ack_deadline_seconds
        if body.max_deliver is not None:
            sub.max_deliver = body.max_deliver
        if body.max_ack_pending is not None:
            sub.max_ack_pending = body.max_ack_pending or m.DEFAULT_MAX_ACK_PENDING
        if body.deliver is not None or creating:
            self._apply_deliver(project, sub, body.deliver or SubscriptionDeliver(), creating=creating)
        dead = body.dead_letter
        if dead is not None:
            if dead.topic is not None:
                if dead.topic == "":
                    # `{topic: ''}` clears the whole block; an `after_attempts` sent beside it still applies.
                    sub.dead_letter_topic = ""
                    sub.dead_letter_after_attempts = m.DEFAULT_AFTER_ATTEMPTS
                else:
                    if dead.topic == sub.topic:
                        raise BadRequest(m.DEAD_LETTER_SAME_TOPIC)
                    if not await self._dead_letter_exists(project, dead.topic):
                        raise BadRequest(f'dead_letter.topic "{dead.topic}" does not exist in this project; create it first')
                    sub.dead_letter_topic = dead.topic
            if dead.after_attempts is not None:
                sub.dead_letter_after_attempts = dead.after_attempts

    @staticmethod
    def _apply_deliver(project: ProjectRef, sub: Subscription, deliver: SubscriptionDeliver, *, creating: bool) -> None:
        """On PATCH, omitted parts of `deliver` keep their values (the mode, the push URL, the content mode)."""
        was_push = not creating and sub.deliver_mode == "push"
        mode = deliver.mode or ("pull" if creating else sub.deliver_mode)
        if mode == "pull" and sub.type == "exclusive":
            raise BadRequest("an exclusive subscription cannot be read through the pull API (use push or a direct client)")
        push = deliver.push
        if mode == "pull":
            if push is not None and push.model_fields_set:
                raise BadRequest('deliver.push is set but deliver.mode is "pull"')
            sub.deliver_mode, sub.push_url, sub.content_mode = "pull", "", "cloudevents-structured"
            return
        url = push.url if push is not None else None
        if not url and was_push:
            url = sub.push_url
        if not url:
            raise BadRequest('deliver.mode is "push" but deliver.push.url is missing')
        problem = push_url_problem(url, project.namespace)
        if problem:
            raise BadRequest(f"deliver.push.url is not allowed: {problem}")
        content_mode: str | None = push.content_mode if push is not None else None
        if not content_mode:
            content_mode = sub.content_mode if was_push else "cloudevents-structured"
        sub.deliver_mode, sub.push_url, sub.content_mode = "push", url, content_mode

    async def list_subscriptions(
        self, principal: Principal, project_id: str, topic_name: str, *, page_size: Any = None,
        page_token: str | None = None,
    ) -> views.SubscriptionList:
        project = await self._project(principal, project_id)
        request = self.pager.request(f"subscriptions:{project.id}:{topic_name}", page_size, page_token)

        def read(session: Session) -> list[MessagingSubscription]:
            row = self._topic_row(session, project.id, topic_name)
            if row is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            return list(
                session.scalars(
                    select(MessagingSubscription).where(MessagingSubscription.topic_id == row.id)
                    .order_by(MessagingSubscription.name)
                )
            )

        page = self.pager.page(await self.db.run(read), request)
        items: list[dict[str, Any]] = []
        for row in page.items:
            sub = subscription_of(row, project.short)
            items.append(sub.to_json(await self._sub_state(sub)))
        return views.SubscriptionList.of(page_body("subscriptions", Page(items, page.next_page_token, page.extra),
                                                   omit_empty_token=True))

    async def create_subscription(
        self, principal: Principal, project_id: str, topic_name: str, body: SubscriptionCreate
    ) -> views.Subscription:
        project = await self._project(principal, project_id, admin=True)
        topic = await self._topic(project, topic_name)
        name = body.name
        if body.topic not in (None, "", topic_name):
            raise BadRequest("topic in the body must match the topic in the path")
        sub = Subscription(project.id, project.short, topic_name, name, created_at=self.clock.now())
        await self._apply_subscription_fields(project, sub, body, creating=True)
        if topic.phase != m.PHASE_READY:
            raise Conflict(m.TOPIC_NOT_READY)
        now = sub.created_at

        def insert(session: Session) -> MessagingSubscription:
            topic_row = self._topic_row(session, project.id, topic_name)
            if topic_row is None:
                raise NotFound(m.TOPIC_NOT_FOUND)
            if self._sub_row(session, topic_row, name) is not None:
                raise Conflict(m.SUBSCRIPTION_EXISTS)
            count = session.scalar(
                select(func.count()).select_from(MessagingSubscription).where(
                    MessagingSubscription.topic_id == topic_row.id
                )
            )
            if (count or 0) >= 100:
                raise Conflict("a topic holds at most 100 subscriptions; delete one first")
            row = MessagingSubscription(
                project_id=project.id, topic_id=topic_row.id, topic_name=topic_name, name=name,
                display_name=sub.display_name, type=sub.type, ack_deadline_seconds=sub.ack_deadline_seconds,
                max_deliver=sub.max_deliver, start_from=sub.start_from, max_ack_pending=sub.max_ack_pending,
                deliver_mode=sub.deliver_mode, push_url=sub.push_url, content_mode=sub.content_mode,
                dead_letter_topic=sub.dead_letter_topic, dead_letter_after_attempts=sub.dead_letter_after_attempts,
                phase=m.PHASE_PENDING, created_at=now, updated_at=now,
            )
            session.add(row)
            session.flush()
            self.audit.record(session, project.id, principal, "pubsub.subscription.create", f"{topic_name}/{name}",
                              {"type": sub.type, "mode": sub.deliver_mode})
            return row

        try:
            row = await self.db.run(insert)
        except IntegrityError:  # a concurrent create of the same name won the insert
            raise Conflict(m.SUBSCRIPTION_EXISTS) from None
        try:
            await self.broker.create_consumer(consumer_config(sub))
        except BrokerError as exc:
            await self.db.run(lambda s: s.delete(s.get(MessagingSubscription, row.id)))
            raise InternalError(f"could not create the subscription on the broker: {exc}") from exc

        def ready(session: Session) -> None:
            stored = session.get(MessagingSubscription, row.id)
            if stored is not None:
                stored.phase = m.PHASE_READY

        await self.db.run(ready)
        sub.phase = m.PHASE_READY
        await self._subscriptions_changed()
        return views.Subscription.of(sub.to_json(await self._sub_state(sub)))

    async def get_subscription(self, principal: Principal, project_id: str, topic: str, name: str) -> views.Subscription:
        project = await self._project(principal, project_id)
        sub = await self._subscription(project, topic, name)
        return views.Subscription.of(sub.to_json(await self._sub_state(sub)))

    async def update_subscription(
        self, principal: Principal, project_id: str, topic: str, name: str, body: SubscriptionPatch
    ) -> views.Subscription:
        project = await self._project(principal, project_id, admin=True)
        sub = await self._subscription(project, topic, name)
        await self._apply_subscription_fields(project, sub, body, creating=False)

        def apply(session: Session) -> None:
            topic_row = self._topic_row(session, project.id, topic)
            row = self._sub_row(session, topic_row, name) if topic_row is not None else None
            if row is None:
                raise NotFound(m.SUBSCRIPTION_NOT_FOUND)
            for field_name in ("display_name", "ack_deadline_seconds", "max_deliver", "max_ack_pending",
                               "deliver_mode", "push_url", "content_mode", "dead_letter_topic",
                               "dead_letter_after_attempts"):
                setattr(row, field_name, getattr(sub, field_name))
            row.updated_at = self.clock.now()
            self.audit.record(session, project.id, principal, "pubsub.subscription.update", f"{topic}/{name}",
                              body.given())

        # The broker first: if it refuses, the record keeps its old values (all or nothing).
        try:
            await self.broker.update_consumer(consumer_config(sub))
        except BrokerError as exc:
            raise InternalError(f"could not update the subscription on the broker: {exc}") from exc
        await self.db.run(apply)
        await self._subscriptions_changed()
        return views.Subscription.of(sub.to_json(await self._sub_state(sub)))

    async def delete_subscription(self, principal: Principal, project_id: str, topic: str, name: str) -> views.PubsubDeletion:
        project = await self._project(principal, project_id, admin=True)
        sub = await self._subscription(project, topic, name)

        def remove(session: Session) -> None:
            topic_row = self._topic_row(session, project.id, topic)
            row = self._sub_row(session, topic_row, name) if topic_row is not None else None
            if row is None:
                raise NotFound(m.SUBSCRIPTION_NOT_FOUND)
            session.delete(row)
            self.audit.record(session, project.id, principal, "pubsub.subscription.delete", f"{topic}/{name}", None)

        await self.db.run(remove)
        try:
            await self.broker.delete_consumer(sub.stream, sub.consumer)
        except BrokerError:
            log.exception("deleting consumer %s/%s", sub.stream, sub.consumer)
        await self._subscriptions_changed()
        return views.PubsubDeletion(name=name, status="deleting")

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

    # ------------------------------------------------------------------------------------ project views

    async def _rows(self, project: ProjectRef) -> list[MessagingTopic]:
        return await self.db.run(
            lambda s: list(
                s.scalars(select(MessagingTopic).where(MessagingTopic.project_id == project.id).order_by(MessagingTopic.name))
            )
        )

    async def quota(self, principal: Principal, project_id: str) -> views.PubsubQuota:
        project = await self._project(principal, project_id)
        rows = await self._rows(project)
        limit = await self.db.run(lambda s: self._budget_of(s, project.id))
        allocated = sum(r.max_bytes_value for r in rows)
        stored = 0
        for row in rows:
            if row.phase == m.PHASE_READY:
                try:
                    stats = await self.broker.stream_stats(_topic_of(row, project).stream)
                except BrokerError:
                    stats = None
                stored += stats.bytes if stats else 0
        available = max(limit - allocated, 0)
        return views.PubsubQuota.of({
            "limit_bytes": limit,
            "allocated_bytes": allocated,
            "backlog_bytes": stored,
            "storage_bytes": stored,
            "available_bytes": available,
            "human": f"{m.human_bytes(allocated)} of {m.human_bytes(limit)} claimed by {len(rows)} "
                     f"topic{'s' if len(rows) != 1 else ''}; {m.human_bytes(available)} available",
            "topics": len(rows),
            "provisioned": any(r.phase == m.PHASE_READY for r in rows),
        })

    async def usage(self, principal: Principal, project_id: str) -> views.PubsubUsage:
        project = await self._project(principal, project_id)
        rows = await self._rows(project)
        topics = []
        keys = ("published", "delivered", "published_bytes", "delivered_bytes", "storage_bytes", "backlog_bytes",
                "subscriptions")
        for row in rows:
            topic = _topic_of(row, project)
            state = await self._topic_state(topic, await self._count_subs(project.id, row.name))
            topics.append({"name": row.name, **{k: state[k] for k in keys}})
        totals = {k: sum(t[k] for t in topics) for k in keys}
        return views.PubsubUsage.of({
            "project": project.id,
            "topics": topics,
            "totals": totals,
            "caveat": "counters are cumulative since the serving process last loaded each topic and reset when "
                      "it restarts; storage and backlog come from the broker and may lag",
        })

    async def credentials(self, principal: Principal, project_id: str) -> views.BrokerCredentialView:
        project = await self._project(principal, project_id, admin=True)
        rows = await self._rows(project)
        if not any(r.phase == m.PHASE_READY for r in rows):
            raise Unavailable(
                "this project is not provisioned on the broker yet: it is provisioned with its first topic; "
                "create a topic, then fetch the credential"
            )
        if self.credentials_issuer is None:
            raise Unavailable("the broker credential is not available on this platform: no broker signing key is loaded")
        credential = await self.credentials_issuer(project)
        body: dict[str, Any] = {"service_url": credential.service_url}
        if credential.external_endpoint:
            body["external_endpoint"] = credential.external_endpoint
            body["external_service_url"] = credential.external_endpoint
            body["reachable_scope"] = "vpc"
        body["token"] = credential.token
        body["topic_prefix"] = m.subject_prefix(project.short)
        body["note"] = credential.note
        return views.BrokerCredentialView.of(body)

    # ------------------------------------------------------------------------------------ broker support

    async def reconcile(self) -> None:
        """At start: make the broker hold every recorded topic and subscription (a create interrupted
        between record and stream, or a broker that lost its store), then mark them ready."""

        def read(session: Session) -> list[tuple[str, MessagingTopic, list[MessagingSubscription]]]:
            out = []
            for row in session.scalars(select(MessagingTopic)):
                project = session.get(Project, row.project_id)
                subs = list(session.scalars(select(MessagingSubscription).where(MessagingSubscription.topic_id == row.id)))
                if project is not None:
                    out.append((project.short, row, subs))
            return out

        for short, row, subs in await self.db.run(read):
            topic = _topic_of(row, ProjectRef(row.project_id, "", "", "", short))
            try:
                await self.broker.create_stream(
                    StreamConfig(topic.stream, topic.subject, topic.max_bytes_value, topic.max_age_seconds, topic.discard)
                )
                for sub_row in subs:
                    await self.broker.create_consumer(consumer_config(subscription_of(sub_row, short)))
            except BrokerError:
                log.exception("could not reconcile topic %s on the broker", topic.stream)
                continue
            ids = [row.id] + [sub.id for sub in subs]

            def mark(session: Session, ids: list[str] = ids) -> None:
                for stored_topic in session.scalars(
                    select(MessagingTopic).where(MessagingTopic.id.in_(ids), MessagingTopic.phase != m.PHASE_READY)
                ):
                    stored_topic.phase = m.PHASE_READY
                for stored_sub in session.scalars(
                    select(MessagingSubscription).where(
                        MessagingSubscription.id.in_(ids), MessagingSubscription.phase != m.PHASE_READY
                    )
                ):
                    stored_sub.phase = m.PHASE_READY

            await self.db.run(mark)

    async def broker_layout(self) -> dict[str, list[str]]:
        """`{project short: [its stream names]}` for every topic on the broker (credentials are cut to it)."""

        def read(session: Session) -> dict[str, list[str]]:
            layout: dict[str, list[str]] = {}
            rows = session.execute(select(Project.short, MessagingTopic.name).join(
                MessagingTopic, MessagingTopic.project_id == Project.id))
            for short, name in rows:
                layout.setdefault(short, []).append(m.stream_name(short, name))
            return layout

        return await self.db.run(read)

    async def push_subscriptions(self) -> list[tuple[Subscription, Topic | None]]:
        """Every push subscription with its dead-letter topic (None when unset or gone)."""

        def read(session: Session) -> list[tuple[Subscription, Topic | None]]:
            out = []
            rows = session.scalars(
                select(MessagingSubscription).where(MessagingSubscription.deliver_mode == "push",
                                                    MessagingSubscription.phase == m.PHASE_READY)
            )
            for row in rows:
                project = session.get(Project, row.project_id)
                if project is None:
                    continue
                ref = ProjectRef.of(project)
                sub = subscription_of(row, ref.short)
                dead = self._topic_row(session, ref.id, sub.dead_letter_topic) if sub.dead_letter_topic else None
                out.append((sub, _topic_of(dead, ref) if dead is not None else None))
            return out

        return await self.db.run(read)

    # ------------------------------------------------------------------------------------ health

    async def health(self) -> tuple[int, views.PubsubHealth]:
        """`{status, dependencies: {kubernetes, database, broker, session-key}}`, 200 or 503."""
        dependencies: dict[str, Any] = {}
        critical = {"kubernetes": False, "database": True, "broker": True, "session-key": True}
        ok = True
        for name in ("kubernetes", "database", "broker", "session-key"):
            check = self._checks.get(name)
            if name == "broker":
                try:
                    await self.broker.ping()
                    status, error = "ok", None
                except Exception as exc:  # noqa: BLE001 - reported, not raised
                    status, error = "down", str(exc) or type(exc).__name__
            elif check is None:
                status, error = "not configured", None
            else:
                status, error = await check()
            entry: dict[str, Any] = {"status": status}
            if error:
                entry["error"] = error
            entry["critical"] = critical[name]
            dependencies[name] = entry
            if critical[name] and status != "ok":
                ok = False
        return (200 if ok else 503), views.PubsubHealth.of({"status": "ok" if ok else "degraded",
                                                            "dependencies": dependencies})


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
