"""Topics (create, read, change, delete, a deleted project's purge) and the project's views of them
(quota, usage, the broker credential): `TopicManagement`, a layer of `TopicService`."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.db.models import MessagingSubscription, MessagingTopic, Project
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Topic, TopicCounters
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound, Unavailable
from caiplatform.models import messaging as views
from caiplatform.models.messaging import TopicCreate, TopicPatch, is_int
from caiplatform.pagination import Page, page_body
from caiplatform.ports.broker import BrokerError, StreamConfig
from caiplatform.principal import Principal
from caiplatform.services.access import ProjectRef
from caiplatform.services.messaging_base import MessagingBase, topic_of
from caiplatform.services.purge import remove_each

log = logging.getLogger(__name__)


class TopicManagement(MessagingBase):
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
        items = [await self._topic_json(topic_of(row, project)) for row in page.items]
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
        topic = topic_of(row, project)
        created = topic.to_json(await self._topic_state(topic, 0))
        stream = StreamConfig(topic.stream, topic.subject, max_value, max_age, discard)
        await self._made_on_broker(MessagingTopic, row.id, lambda: self.broker.create_stream(stream), "topic")
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
        topic = topic_of(row, project)
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
            return [topic_of(row, ProjectRef.of(project)) for row in rows]

        topics = await self.db.run(read)
        if not topics:
            return 0
        removed = await remove_each("topic", topics, lambda t: t.name, lambda t: self._remove_topic(t, None))
        await self._topics_changed()
        await self._subscriptions_changed()
        return removed

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
                    stats = await self.broker.stream_stats(topic_of(row, project).stream)
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
            topic = topic_of(row, project)
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
