"""Subscriptions (create, read, change, delete) and their delivery settings: `SubscriptionManagement`,
a layer of `TopicService`."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.db.models import MessagingSubscription
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound
from caiplatform.models import messaging as views
from caiplatform.models.messaging import SubscriptionCreate, SubscriptionDeliver, SubscriptionPatch
from caiplatform.pagination import Page, page_body
from caiplatform.ports.broker import BrokerError
from caiplatform.principal import Principal
from caiplatform.services.access import ProjectRef
from caiplatform.services.messaging_base import MessagingBase, consumer_config, subscription_of

log = logging.getLogger(__name__)


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


class SubscriptionManagement(MessagingBase):
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
        await self._made_on_broker(MessagingSubscription, row.id,
                                   lambda: self.broker.create_consumer(consumer_config(sub)), "subscription")
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
