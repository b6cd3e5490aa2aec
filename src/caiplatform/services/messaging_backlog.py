"""Consumer lag as a metric: every `interval` seconds, each subscription's counts from the broker into
`cai_subscription_backlog` and `cai_subscription_unacknowledged` (docs/observability.md "Metrics").

A scrape is synchronous and must not wait on the broker (one call per subscription), so the counts are
sampled here, in the background, and the scrape reads the last round from memory (`Metrics.set_backlog`).
A round is one database read of the ready subscriptions (nothing more when there are none) and one
`consumer_stats` per subscription, `CONCURRENCY` at a time. A subscription the broker cannot answer for
keeps no series that round (a stale number would read as a real one).
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db import Database
from caiplatform.db.models import MessagingSubscription, Project
from caiplatform.domain import messaging as m
from caiplatform.metrics import Metrics
from caiplatform.periodic import PeriodicWork
from caiplatform.ports.broker import Broker, BrokerError

log = logging.getLogger(__name__)

#: Seconds between two rounds (`CAI_BACKLOG_INTERVAL`): Prometheus' usual scrape interval.
DEFAULT_INTERVAL = 15.0
#: Broker calls of one round in flight at once.
CONCURRENCY = 16

Key = tuple[str, str, str]  # (project short id, topic, subscription): bounded, like the topics themselves


class BacklogSampler(PeriodicWork):
    name = "subscription-backlog"

    def __init__(self, db: Database, broker: Broker, metrics: Metrics, interval: float = DEFAULT_INTERVAL):
        super().__init__(interval)
        self.db, self.broker, self.metrics = db, broker, metrics

    async def subscriptions(self) -> list[Key]:
        def read(session: Session) -> list[Key]:
            rows = session.execute(
                select(Project.short, MessagingSubscription.topic_name, MessagingSubscription.name)
                .join(Project, Project.id == MessagingSubscription.project_id)
                .where(MessagingSubscription.phase == m.PHASE_READY)
            )
            return [(short, topic, name) for short, topic, name in rows]

        return await self.db.run(read)

    async def round(self) -> None:
        keys = await self.subscriptions()
        rows: dict[Key, tuple[int, int]] = {}
        if keys:
            limit = asyncio.Semaphore(CONCURRENCY)

            async def sample(key: Key) -> None:
                short, topic, name = key
                async with limit:
                    try:
                        stats = await self.broker.consumer_stats(m.stream_name(short, topic), name)
                    except BrokerError as exc:
                        log.debug("backlog: no counts for %s/%s/%s: %s", short, topic, name, exc)
                        return
                if stats is not None:
                    rows[key] = (stats.pending + stats.ack_pending, stats.ack_pending)

            await asyncio.gather(*(sample(key) for key in keys))
        self.metrics.set_backlog(rows)
