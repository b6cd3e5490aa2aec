"""TopicService: the messaging API's rules (document 3), over the broker port.

Members list and read topics and subscriptions, publish, pull, acknowledge and read quota and usage;
project admins also create, edit and delete topics and subscriptions and read the broker credential.
Topics and subscriptions are recorded in the database (fields, storage claim, phase) and live on the
broker as streams and durable consumers (`caiplatform.ports.broker`).

One service in layers, one concern each: `messaging_base.py` (state, the project gate, rows as values),
`messaging_topics.py` (topics, quota, usage, credential), `messaging_subscriptions.py` (subscriptions),
`messaging_delivery.py` (publish, pull, acknowledge); here the broker's side (reconcile at start, the
credential's layout, the push worker's list) and health. The push worker is `messaging_push.py`.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db.models import MessagingSubscription, MessagingTopic, Project
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription, Topic
from caiplatform.models import messaging as views
from caiplatform.ports.broker import BrokerError, StreamConfig
from caiplatform.services.access import ProjectRef
from caiplatform.services.messaging_base import (
    consumer_config,
    subscription_of,
    topic_of,
)
from caiplatform.services.messaging_delivery import MessageDelivery
from caiplatform.services.messaging_subscriptions import SubscriptionManagement
from caiplatform.services.messaging_topics import TopicManagement

log = logging.getLogger(__name__)


class TopicService(TopicManagement, SubscriptionManagement, MessageDelivery):
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
            topic = topic_of(row, ProjectRef(row.project_id, "", "", "", short))
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
                out.append((sub, topic_of(dead, ref) if dead is not None else None))
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
