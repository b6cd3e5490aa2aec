"""Push delivery: every push subscription's messages POSTed to `deliver.push.url` as CloudEvents.

Each serving process runs one `PushWorker`. It pulls from the subscription's durable consumer like
any reader, so several replicas share the work and the broker hands each message to one of them
(at-least-once overall). Any 2xx acknowledges; anything else (a redirect included, never followed)
refuses the delivery with a delay of 1 s doubling up to 60 s, which the broker honours (`nak`), until
`dead_letter.after_attempts` (or a smaller `max_deliver`); then the message is republished to the
dead-letter topic with `cai-dead-letter-*` attributes, or dropped when none is set.

Push URLs name services in the project's namespace (`http://<service>.<namespace>[.svc[.cluster.local]]`),
which do not resolve by DNS on one machine: `PushTargets` maps such a host to a base URL (and optionally
an httpx transport); the serverless area registers its services there. Unregistered hosts are dialled
as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx

from caiplatform import json_input, tracing
from caiplatform.clock import Clock, rfc3339
from caiplatform.domain import messaging as m
from caiplatform.domain.messaging import Subscription, Topic
from caiplatform.ports.broker import BrokerError, Delivery, OutgoingMessage
from caiplatform.services.messaging import TopicService

log = logging.getLogger(__name__)


_HEADER_SAFE = "!#$&'*+-.^_`|~"
# Printable ASCII but space, `"` and `%`: what the CloudEvents HTTP binding leaves unencoded in a header.
_VALUE_SAFE = "!#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


@dataclass(frozen=True)
class PushRoute:
    base_url: str
    transport: httpx.AsyncBaseTransport | None = None


class PushTargets:
    """The resolver hook: in-cluster service hosts → where to reach them on this machine."""

    def __init__(self) -> None:
        self._routes: dict[str, PushRoute] = {}

    def register(self, service: str, namespace: str, base_url: str,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._routes[f"{service}.{namespace}".lower()] = PushRoute(base_url.rstrip("/"), transport)

    def unregister(self, service: str, namespace: str) -> None:
        self._routes.pop(f"{service}.{namespace}".lower(), None)

    def resolve(self, url: str) -> tuple[str, httpx.AsyncBaseTransport | None]:
        parts = urlsplit(url)
        key = m.service_key(parts.hostname or "")
        route = self._routes.get(key) if key else None
        if route is None:
            return url, None
        target = route.base_url + (parts.path or "/")
        if parts.query:
            target += "?" + parts.query
        return target, route.transport


def _payload(data: bytes) -> tuple[Any, str]:
    """The event's data and content type: JSON stays JSON, UTF-8 text stays text, the rest is bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data, "application/octet-stream"
    if text:
        try:
            return json_input.decode(text), "application/json"
        except json_input.JSONInputError:
            pass
    return text, "text/plain; charset=utf-8"


def build_cloudevent(sub: Subscription, delivery: Delivery) -> tuple[dict[str, str], bytes]:
    """Headers and body of one push request in the subscription's content mode."""
    if TYPE_CHECKING:  # type-checked against the 2.x paths; 1.x has the same API under the old ones
        from cloudevents.v1.conversion import to_binary, to_structured
        from cloudevents.v1.http import CloudEvent
    else:
        try:  # cloudevents 2.x keeps the 1.x API under `cloudevents.v1`
            from cloudevents.v1.conversion import to_binary, to_structured
            from cloudevents.v1.http import CloudEvent
        except ImportError:  # cloudevents 1.x; imported here so the platform starts without it
            from cloudevents.conversion import to_binary, to_structured
            from cloudevents.http import CloudEvent

    data, content_type = _payload(delivery.data)
    attributes = {
        "type": m.CLOUDEVENT_TYPE,
        "source": f"//pubsub/projects/{sub.project_short}/topics/{sub.topic}",
        "id": m.message_id(delivery.sequence),
        "subject": f"topics/{sub.topic}",
        "time": rfc3339(delivery.published_at),
        "datacontenttype": content_type,
        "subscription": sub.name,
        "deliveryattempt": str(delivery.delivery_count),
    }
    if delivery.key is not None:
        attributes["partitionkey"] = delivery.key
    event = CloudEvent(attributes, data)
    if sub.content_mode == "cloudevents-binary":
        headers, body = to_binary(event)
        # The CloudEvents HTTP binding percent-encodes header values beyond printable ASCII (a message
        # key may be any text); a raw one cannot be sent at all.
        headers = {k.lower(): quote(v, safe=_VALUE_SAFE) for k, v in headers.items()}
        headers["content-type"] = content_type
        for name, value in delivery.attributes.items():
            # HTTP header names are tokens and values one line: anything else is percent-encoded.
            headers[f"ce-attr-{quote(name.lower(), safe=_HEADER_SAFE)}"] = quote(value, safe=_VALUE_SAFE)
        return headers, delivery.data
    headers, body = to_structured(event)
    envelope = json.loads(body)
    if delivery.attributes:
        envelope["attributes"] = delivery.attributes
    return {"content-type": "application/cloudevents+json; charset=utf-8"}, json.dumps(envelope).encode()


class PushWorker:
    def __init__(self, topics: TopicService, targets: PushTargets, clock: Clock | None = None, *,
                 refresh_interval: float | None = 2.0, pull_timeout: float = 1.0, batch: int = 10):
        self.topics = topics
        self.targets = targets
        self.clock = clock or Clock()
        self.refresh_interval = refresh_interval
        self.pull_timeout = pull_timeout
        self.batch = batch
        self._subs: dict[tuple[str, str], tuple[Subscription, Topic | None]] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._clients: dict[int, httpx.AsyncClient] = {}
        topics.on_subscriptions_changed.append(self.refresh)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start delivering. With a `refresh_interval` the worker also re-reads the subscriptions
        periodically (changes made through another replica); without one it relies on this process's
        change hook alone, which an in-memory database (one shared connection) requires."""
        await self.refresh()
        if self._supervisor is None and self.refresh_interval:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="push-supervisor")

    async def close(self) -> None:
        if self.refresh in self.topics.on_subscriptions_changed:
            self.topics.on_subscriptions_changed.remove(self.refresh)
        tasks = [t for t in [self._supervisor, *self._tasks.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._supervisor = None
        self._tasks.clear()
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def refresh(self) -> None:
        """Re-read the push subscriptions and start or stop their delivery loops."""
        current = {(s.stream, s.consumer): (s, dead) for s, dead in await self.topics.push_subscriptions()}
        self._subs = current
        for key, task in list(self._tasks.items()):
            if key not in current or task.done():
                task.cancel()
                self._tasks.pop(key)
        for key in current:
            if key not in self._tasks:
                self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key), name=f"push-{key[0]}/{key[1]}")

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval or 2.0)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - keep delivering; the next refresh retries
                log.exception("push worker: could not read the push subscriptions")

    async def _run(self, key: tuple[str, str]) -> None:
        while key in self._subs:
            sub, _ = self._subs[key]
            try:
                batch = 1 if sub.ordered else self.batch  # one in flight: a bigger batch would only wait
                deliveries = await self.topics.broker.pull(sub.stream, sub.consumer, batch, self.pull_timeout)
            except BrokerError as exc:
                log.warning("push worker: pull from %s/%s failed: %s", sub.stream, sub.consumer, exc)
                await asyncio.sleep(self.pull_timeout)
                continue
            if not deliveries:
                continue
            sub, dead = self._subs.get(key, (sub, None))
            if sub.ordered:
                for delivery in deliveries:
                    await self._handle_logged(sub, dead, delivery)
            else:
                await asyncio.gather(*(self._handle_logged(sub, dead, d) for d in deliveries))

    async def _handle_logged(self, sub: Subscription, dead: Topic | None, delivery: Delivery) -> None:
        """`handle`, with a failure of its own (not the endpoint's) logged: the message is left to come
        back after the ack deadline, and the loop goes on."""
        try:
            if tracing.tracer() is None:
                outcome = await self.handle(sub, dead, delivery)
            else:  # the publish's trace (the message carries it), else one of its own; the endpoint
                # gets the delivery's traceparent (`post`)
                with tracing.span(f"process {sub.topic}", {
                        "messaging.system": "nats", "messaging.operation.name": "process",
                        "messaging.operation.type": "process",
                        "messaging.destination.name": sub.topic, "messaging.consumer.group.name": sub.name,
                        "messaging.message.id": m.message_id(delivery.sequence),
                        "caiplatform.push.attempt": delivery.delivery_count,
                        "caiplatform.project": sub.project_short}, kind="CONSUMER", root=True,
                        carrier=delivery.trace) as current:
                    outcome = await self.handle(sub, dead, delivery)
                    current.set_attribute("caiplatform.push.outcome", outcome)
            self.topics.prometheus.observe_push(sub.project_short, sub.topic, outcome)
        except Exception:  # noqa: BLE001 - never end the subscription's delivery loop
            log.exception("push: delivering %s of %s/%s failed", m.message_id(delivery.sequence), sub.topic, sub.name)

    # ------------------------------------------------------------------ one delivery

    def _client(self, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        key = id(transport)
        client = self._clients.get(key)
        if client is None:
            client = httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False)
            self._clients[key] = client
        return client

    async def post(self, sub: Subscription, delivery: Delivery) -> tuple[bool, str]:
        """One POST; (acknowledged, why not). Reads at most 64 KiB of the answer."""
        headers, body = build_cloudevent(sub, delivery)
        tracing.inject(headers)  # the push endpoint continues the delivery's trace (nothing when off)
        url, transport = self.targets.resolve(sub.push_url)
        client = self._client(transport)
        deadline = float(sub.ack_deadline_seconds)
        try:
            # The deadline bounds the whole request (httpx's timeout bounds each read and write alone).
            async with asyncio.timeout(deadline), client.stream("POST", url, headers=headers, content=body,
                                                                timeout=deadline) as response:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= m.PUSH_RESPONSE_READ_LIMIT:
                        break
                status = response.status_code
                location = response.headers.get("location", "")
        except (httpx.HTTPError, httpx.StreamError) as exc:
            return False, f"{type(exc).__name__}: {exc}"[:500]
        except TimeoutError:
            return False, f"no answer within the ack deadline ({sub.ack_deadline_seconds} s)"
        if 200 <= status < 300:
            return True, ""
        if 300 <= status < 400:
            return False, f"HTTP {status}: redirect to {location or '(no location)'} not followed"
        return False, f"HTTP {status}"

    async def _keep_in_progress(self, sub: Subscription, delivery: Delivery) -> None:
        """Restart the delivery's ack deadline every half deadline while its POST runs: the POST may take
        the whole deadline (its timeout), and its acknowledgement then arrives after it; without this the
        broker would hand the message to another replica meanwhile. A killed replica stops sending, so
        the message is redelivered one deadline after its last sign of life."""
        interval = sub.ack_deadline_seconds / 2
        while True:
            await asyncio.sleep(interval)
            try:
                await self.topics.broker.in_progress(delivery.token)
            except BrokerError as exc:  # the broker redelivers after the deadline: at least once still holds
                log.warning("push: could not extend the deadline of %s: %s", m.message_id(delivery.sequence), exc)

    async def handle(self, sub: Subscription, dead: Topic | None, delivery: Delivery) -> str:
        """Deliver one message; returns `acked`, `retry`, `dead-lettered` or `dropped`."""
        keeper = asyncio.create_task(self._keep_in_progress(sub, delivery))
        try:
            ok, reason = await self.post(sub, delivery)
        finally:
            keeper.cancel()
        broker = self.topics.broker
        if ok:
            await broker.ack([delivery.token])
            self.topics.record_delivered(sub.project_id, sub.topic, 1, len(delivery.data))
            return "acked"
        log.info("push: attempt %d of %s to %s/%s failed: %s", delivery.delivery_count,
                 m.message_id(delivery.sequence), sub.topic, sub.name, reason)
        limit = sub.dead_letter_after_attempts
        if sub.max_deliver:
            limit = min(limit, sub.max_deliver)
        if delivery.delivery_count < limit:
            await broker.nak(delivery.token, m.backoff_delay(delivery.delivery_count))
            return "retry"
        if dead is None:
            log.warning("push: dropping %s of %s/%s after %d attempts (%s)", m.message_id(delivery.sequence),
                        sub.topic, sub.name, delivery.delivery_count, reason)
            await broker.term(delivery.token)
            return "dropped"
        attributes = dict(delivery.attributes)
        attributes.update({
            f"{m.DEAD_LETTER_PREFIX}subscription": sub.name,
            f"{m.DEAD_LETTER_PREFIX}topic": sub.topic,
            f"{m.DEAD_LETTER_PREFIX}message-id": m.message_id(delivery.sequence),
            f"{m.DEAD_LETTER_PREFIX}attempts": str(delivery.delivery_count),
            f"{m.DEAD_LETTER_PREFIX}reason": reason,
            f"{m.DEAD_LETTER_PREFIX}publish-time": rfc3339(delivery.published_at),
            f"{m.DEAD_LETTER_PREFIX}time": rfc3339(self.clock.now()),
        })
        try:
            status, _ = await self.topics.publish_to(dead, [OutgoingMessage(delivery.data, attributes, delivery.key)])
        except Exception as exc:  # noqa: BLE001 - parking failed: keep the message and try again later
            log.warning("push: dead-letter publish to %s failed: %s", dead.name, exc)
            status = 500
        if status != 200:
            await broker.nak(delivery.token, m.backoff_delay(delivery.delivery_count))
            return "retry"
        await broker.term(delivery.token)
        return "dead-lettered"
