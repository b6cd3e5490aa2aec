"""The broker port on NATS JetStream (nats-py).

The model maps onto JetStream's own features: a topic is a file-stored stream with interest retention
(a message lives while a consumer owes an acknowledgement) and `max_bytes` / `max_age` / `discard`
limits; a subscription is a durable pull consumer (`ack_wait`, `max_ack_pending`, deliver policy,
`max_deliver`); a delivery's token is JetStream's own acknowledgement subject, which acknowledges from
any connection, so any API replica can acknowledge what another one handed out.

A single-reader consumer (exclusive, failover) is, on a server with priority groups (2.11 and later), a
consumer with one priority group and the `pinned_client` policy: the server serves one client (the pin
id it hands out with the first message) until that client has stopped pulling for the pinned TTL, then
pins the next one. nats-py has no helper for it, so those pulls are raw `CONSUMER.MSG.NEXT` requests
carrying the group and this process's pin id. Each `JetStreamBroker` is one reader (one API replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NotFoundError

from caiplatform import json_input
from caiplatform.ports.broker import (
    Broker,
    BrokerError,
    BrokerUnavailable,
    ConsumerConfig,
    ConsumerStats,
    Delivery,
    OutgoingMessage,
    PublishFailed,
    StreamConfig,
    StreamFull,
    StreamNotFound,
    StreamStats,
)

ATTRIBUTES_HEADER = "Cai-Attributes"
KEY_HEADER = "Cai-Key"
MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream's de-duplication id
PIN_HEADER = "Nats-Pin-Id"
# W3C trace context of the publish, written only while tracing is on (`OutgoingMessage.trace`); never one of
# the headers above, which the platform's own values always win over.
TRACE_HEADERS = ("traceparent", "tracestate")
TRACE_HEADER_MAX = 512  # W3C's tracestate is at most 32 members; a longer header is not a trace context
PIN_GROUP = "cai"  # the single priority group of a single-reader consumer
PRIORITY_GROUPS_SINCE = (2, 11)
# After the first message of a pull, how long to wait for the server to hand over what else it has.
REST_OF_BATCH_WAIT = 0.05
# How long a published batch may wait for all its acknowledgements (nats-py's `publish` waits 2 s a message).
PUBLISH_ACK_WAIT = 5.0
# A plain acknowledgement of a stored message, as the server writes it; any other answer (an error, a
# duplicate, a domain) is read as JSON.
_PLAIN_PUB_ACK = re.compile(rb'\{"stream":"[^"\\]*", ?"seq":([0-9]{1,19})\}')


def _ack_metadata(msg: Msg) -> tuple[int, int, datetime]:
    """(stream sequence, delivery count, publish time) from the ack subject of a delivered message:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`, or the form with domain and
    account hash in front of the stream. Read straight from the subject, which costs a fraction of
    nats-py's `Msg.metadata` (that parse was a third of a 100-message pull)."""
    parts = msg.reply.split(".")
    if len(parts) == 9:
        delivered, sequence, timestamp = parts[4], parts[5], parts[7]
    elif len(parts) in (11, 12):
        delivered, sequence, timestamp = parts[6], parts[7], parts[9]
    else:
        meta = msg.metadata
        return meta.sequence.stream, meta.num_delivered, meta.timestamp or datetime.now(UTC)
    return int(sequence), int(delivered), datetime.fromtimestamp(int(timestamp) / 1e9, UTC)


def _stream_config(config: StreamConfig) -> api.StreamConfig:
    return api.StreamConfig(
        name=config.name,
        subjects=[config.subject],
        retention=api.RetentionPolicy.INTEREST,
        storage=api.StorageType.FILE,
        max_bytes=config.max_bytes,
        max_age=config.max_age or 0,
        discard=api.DiscardPolicy.NEW if config.discard == "new" else api.DiscardPolicy.OLD,
        duplicate_window=config.id_window,
        num_replicas=1,
    )


def _consumer_config(config: ConsumerConfig) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        durable_name=config.name,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=config.ack_wait,
        max_ack_pending=config.max_ack_pending,
        deliver_policy=api.DeliverPolicy.NEW if config.deliver_new else api.DeliverPolicy.ALL,
        max_deliver=config.max_deliver or -1,
    )


def _pinned_consumer_request(config: ConsumerConfig) -> bytes:
    """A `CONSUMER.CREATE` body with the priority-group fields nats-py's ConsumerConfig does not know."""
    body = _consumer_config(config).as_dict()
    body.update(
        name=config.name,
        priority_groups=[PIN_GROUP],
        priority_policy="pinned_client",
        priority_timeout=int(config.takeover_after * 1e9),
    )
    return json.dumps({"stream_name": config.stream, "config": body}).encode()


def _is_full(err: APIError) -> bool:
    text = (err.description or "").lower()
    return "maximum" in text and "exceeded" in text


class JetStreamBroker(Broker):
    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 connect_timeout: float = 5.0, **_: Any):
        self.url = url
        self._user = user
        self._password = password
        self._connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self._lock = asyncio.Lock()
        # (stream, consumer) -> whether it is a pinned single-reader consumer; and this reader's pin ids.
        self._pinned: dict[tuple[str, str], bool] = {}
        self._pins: dict[tuple[str, str], str] = {}

    @property
    def address(self) -> str:
        return self.url

    async def _client(self) -> NatsClient:
        if self._nc is not None and not self._nc.is_closed:
            return self._nc
        if not self.url:
            raise BrokerError("the platform's NATS server is not started yet")
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                options: dict[str, Any] = {}
                if self._user:
                    options.update(user=self._user, password=self._password)
                try:
                    self._nc = await nats.connect(
                        servers=[self.url], name="caiplatform", connect_timeout=self._connect_timeout,
                        max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True, **options,
                    )
                except Exception as exc:  # noqa: BLE001 - reported as a broker failure
                    raise BrokerUnavailable(f"could not connect to NATS at {self.url}: {exc}") from exc
        return self._nc

    async def pins_single_reader(self) -> bool:
        """Whether the connected server has priority groups with pinned clients (NATS 2.11 and later)."""
        version = (await self._client()).connected_server_version
        return (version.major, version.minor) >= PRIORITY_GROUPS_SINCE

    async def _api(self, subject: str, body: bytes = b"") -> dict[str, Any]:
        """A raw JetStream API request, for what nats-py has no helper for."""
        nc = await self._client()
        try:
            reply = await nc.request(f"$JS.API.{subject}", body, timeout=self._connect_timeout)
        except Exception as exc:  # noqa: BLE001 - timeouts and connection loss
            raise BrokerUnavailable(f"JetStream API {subject} failed: {exc or type(exc).__name__}") from exc
        answer = json.loads(reply.data or b"{}")
        error = answer.get("error")
        if error:
            if error.get("err_code") == 10059:
                raise StreamNotFound(error.get("description") or "stream not found")
            raise BrokerError(error.get("description") or f"JetStream API {subject} failed")
        return answer

    async def _js(self) -> Any:
        return (await self._client()).jetstream(timeout=self._connect_timeout)

    # ------------------------------------------------------------------ streams

    async def create_stream(self, config: StreamConfig) -> None:
        js = await self._js()
        try:
            await js.add_stream(_stream_config(config))
        except APIError as exc:
            if exc.err_code == 10058:  # stream name already in use with a different configuration
                await js.update_stream(_stream_config(config))
                return
            raise BrokerError(f"could not create stream {config.name}: {exc.description}") from exc

    async def update_stream(self, config: StreamConfig) -> None:
        js = await self._js()
        try:
            await js.update_stream(_stream_config(config))
        except NotFoundError as exc:
            raise StreamNotFound(f"stream {config.name} not found") from exc
        except APIError as exc:
            raise BrokerError(f"could not update stream {config.name}: {exc.description}") from exc

    async def delete_stream(self, name: str) -> bool:
        js = await self._js()
        try:
            return bool(await js.delete_stream(name))
        except NotFoundError:
            return False

    async def stream_stats(self, name: str) -> StreamStats | None:
        js = await self._js()
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            return None
        return StreamStats(info.state.messages, info.state.bytes, info.state.consumer_count)

    async def publish(self, stream: str, subject: str, messages: list[OutgoingMessage]) -> list[int]:
        """The whole batch goes out at once and its acknowledgements are awaited together: one wait per
        batch, as a raw client batches with `publish_async`. (nats-py's own `publish_async` loses the
        server's refusals, such as a full stream, in its reply callback, so the replies come to an inbox of
        this batch instead.) The messages leave in request order on the one connection, so JetStream
        stores them in that order; a partial failure reports the stored prefix up to the first refusal."""
        nc = await self._client()
        if not nc.is_connected:
            # The client would buffer the message and send it once reconnected, after this publish was
            # reported failed: refuse at once instead, so a failed publish never lands later.
            raise PublishFailed([], BrokerUnavailable(f"not connected to NATS at {self.url} (reconnecting)"))
        # One future for the whole batch, set when the last answer arrives: a future per message and
        # `asyncio.wait` over them cost a callback per message on the loop (docs/performance.md).
        count = len(messages)
        replies: list[Msg | None] = [None] * count
        missing = [count]
        all_answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        inbox = nc.new_inbox()

        async def on_reply(msg: Msg) -> None:
            index = msg.subject.rsplit(".", 1)[1]
            if index.isdigit() and int(index) < count and replies[int(index)] is None:
                replies[int(index)] = msg
                missing[0] -= 1
                if not missing[0] and not all_answered.done():
                    all_answered.set_result(None)

        plain: dict[str, str] = {api.Header.EXPECTED_STREAM: stream}  # nats-py only reads the headers
        try:
            subscription = await nc.subscribe(f"{inbox}.*", cb=on_reply)
            try:
                for index, message in enumerate(messages):
                    headers = plain
                    if message.attributes or message.key is not None or message.msg_id is not None or message.trace:
                        headers = dict(plain)
                        if message.trace:
                            headers.update((k, v) for k, v in message.trace.items() if k in TRACE_HEADERS)
                        if message.msg_id is not None:
                            headers[MSG_ID_HEADER] = message.msg_id
                        if message.attributes:
                            headers[ATTRIBUTES_HEADER] = json.dumps(message.attributes, separators=(",", ":"))
                        if message.key is not None:
                            headers[KEY_HEADER] = json.dumps(message.key)
                    await nc.publish(subject, message.data, reply=f"{inbox}.{index}", headers=headers)
                if count:
                    await asyncio.wait((all_answered,), timeout=PUBLISH_ACK_WAIT)
            finally:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - connection loss while sending
            raise PublishFailed([], BrokerUnavailable(f"publish failed: {exc or type(exc).__name__}")) from exc
        finally:
            all_answered.cancel()
        sequences: list[int] = []
        for reply in replies:
            sequences.append(self._stored_sequence(reply, stream, sequences))
        return sequences

    @staticmethod
    def _stored_sequence(msg: Msg | None, stream: str, before: list[int]) -> int:
        """The sequence JetStream stored one message under, or `PublishFailed` with those `before` it."""
        if msg is None:
            raise PublishFailed(before, BrokerUnavailable("publish failed: nats: timeout"))
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            raise PublishFailed(before, StreamNotFound(f"stream {stream} not found"))
        plain = _PLAIN_PUB_ACK.fullmatch(msg.data)
        if plain is not None:
            return int(plain[1])
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                APIError.from_error(answer["error"])  # raises the typed error
            return int(answer["seq"])
        except NotFoundError as exc:
            raise PublishFailed(before, StreamNotFound(f"stream {stream} not found")) from exc
        except APIError as exc:
            cause = StreamFull(exc.description or "maximum bytes exceeded") if _is_full(exc) else BrokerError(
                exc.description or str(exc)
            )
            raise PublishFailed(before, cause) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise PublishFailed(before, BrokerError(f"publish failed: unexpected answer {msg.data[:200]!r}")) from exc

    # ------------------------------------------------------------------ consumers

    async def create_consumer(self, config: ConsumerConfig) -> None:
        if config.single_reader and await self.pins_single_reader():
            try:
                await self._api(f"CONSUMER.CREATE.{config.stream}.{config.name}", _pinned_consumer_request(config))
            except StreamNotFound:
                raise StreamNotFound(f"stream {config.stream} not found") from None
            except BrokerError as exc:
                raise BrokerError(f"could not create consumer {config.name}: {exc}") from exc
            self._pinned[(config.stream, config.name)] = True
            return
        self._pinned[(config.stream, config.name)] = False
        js = await self._js()
        try:
            await js.add_consumer(config.stream, _consumer_config(config))
        except NotFoundError as exc:
            raise StreamNotFound(f"stream {config.stream} not found") from exc
        except APIError as exc:
            raise BrokerError(f"could not create consumer {config.name}: {exc.description}") from exc

    async def update_consumer(self, config: ConsumerConfig) -> None:
        # JetStream's create is create-or-update for a durable consumer's mutable fields.
        await self.create_consumer(config)

    async def delete_consumer(self, stream: str, name: str) -> bool:
        self._pinned.pop((stream, name), None)
        self._pins.pop((stream, name), None)
        js = await self._js()
        try:
            return bool(await js.delete_consumer(stream, name))
        except NotFoundError:
            return False

    async def consumer_stats(self, stream: str, name: str) -> ConsumerStats | None:
        js = await self._js()
        try:
            info = await js.consumer_info(stream, name)
        except NotFoundError:
            return None
        delivered = info.delivered.consumer_seq if info.delivered else 0
        return ConsumerStats(
            info.num_pending or 0, info.num_ack_pending or 0, delivered or 0, info.num_redelivered or 0,
            info.num_waiting or 0,
        )

    async def _is_pinned(self, stream: str, consumer: str) -> bool:
        """Whether a consumer (perhaps made by another replica) is a pinned single-reader consumer."""
        key = (stream, consumer)
        if key not in self._pinned:
            if not await self.pins_single_reader():
                return False
            try:
                info = await self._api(f"CONSUMER.INFO.{stream}.{consumer}")
            except BrokerError as exc:
                raise BrokerError(f"cannot read consumer {consumer}: {exc}") from exc
            self._pinned[key] = info.get("config", {}).get("priority_policy") == "pinned_client"
        return self._pinned[key]

    async def _next(self, stream: str, consumer: str, request: dict[str, Any], wait: float) -> list[Msg]:
        """One raw pull request: its messages, until a status ends it or `wait` ends. The messages are
        gathered by the subscription's callback and awaited once, not one `next_msg` (a task and a
        timer each) per message."""
        key = (stream, consumer)
        nc = await self._client()
        if not nc.is_connected:
            raise BrokerUnavailable(f"not connected to NATS at {self.url} (reconnecting)")
        pin = self._pins.get(key)
        if pin:
            request = {**request, "id": pin}
        batch = request["batch"]
        msgs: list[Msg] = []
        ended: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            if ended.done():
                return
            headers = msg.headers
            status = headers.get("Status") if headers else None
            if status is None:
                if headers and headers.get(PIN_HEADER):
                    self._pins[key] = headers[PIN_HEADER]
                msgs.append(msg)
                if len(msgs) >= batch:
                    ended.set_result(None)
                return
            if status == "423":  # another reader holds the pin now: ours is stale, pull as a newcomer
                self._pins.pop(key, None)
            elif status not in ("404", "408", "409"):  # no messages, expired, or request ended
                description = headers.get("Description", "") if headers else ""
                ended.set_result(f"{status} {description}".strip())
                return
            ended.set_result(None)

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=on_msg)
        try:
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", json.dumps(request).encode(),
                             reply=inbox)
            try:
                failure = await asyncio.wait_for(ended, max(wait, 0.001))
            except TimeoutError:  # the future is cancelled: what arrives from now on is ignored
                failure = None
            if failure:
                raise BrokerError(f"cannot read consumer {consumer}: {failure}")
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return msgs

    async def _pull_raw(self, stream: str, consumer: str, max_messages: int, timeout: float,
                        group: str | None) -> list[Msg]:
        """Raw `CONSUMER.MSG.NEXT` requests (with the priority `group` of a pinned consumer). The client
        waits for the server's end of each request (its 404 or 408), never giving up first: a request
        the client abandoned could still be handed a message, which would then count as a delivery
        attempt that no reader saw, until the ack deadline brought it back.

        A consumer without a group first asks with `no_wait` and a short `expires`: the server hands over
        what it has at once (or the first messages to arrive within the wait) and ends the request, one
        round trip for a backlog. Only when that brings nothing does the long poll below follow."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, REST_OF_BATCH_WAIT)
        extra = {"group": group} if group else {}
        if group is None:
            msgs = await self._next(stream, consumer, self._rest_request(max_messages), REST_OF_BATCH_WAIT + 1.0)
            if msgs or loop.time() >= deadline:
                return msgs
        while True:
            left = max(deadline - loop.time(), 0.01)
            had_pin = (stream, consumer) in self._pins
            msgs = await self._next(stream, consumer, {"batch": 1, "expires": int(left * 1e9), **extra}, left + 1.0)
            if msgs or not had_pin or (stream, consumer) in self._pins or loop.time() >= deadline:
                break  # retried only when the pin turned out stale, as a newcomer for the time left
        if msgs and max_messages > 1:
            request = self._rest_request(max_messages - 1) if group is None else {
                # Not `no_wait`, which a pinned consumer at `max_ack_pending` leaves open (it would
                # swallow the next redelivery): a short-lived request.
                "batch": max_messages - 1, "expires": int(REST_OF_BATCH_WAIT * 1e9), **extra}
            msgs += await self._next(stream, consumer, request, REST_OF_BATCH_WAIT + 1.0)
        return msgs

    @staticmethod
    def _rest_request(batch: int) -> dict[str, Any]:
        """What is there now, up to `batch`: with `no_wait` and `expires` the server ends the request as
        soon as it has handed over any messages (404/408), or at `expires` when none came."""
        return {"batch": batch, "no_wait": True, "expires": int(REST_OF_BATCH_WAIT * 1e9)}

    async def pull(self, stream: str, consumer: str, max_messages: int, timeout: float) -> list[Delivery]:
        key = (stream, consumer)
        cached = key in self._pinned
        try:
            return await self._pull(stream, consumer, max_messages, timeout)
        except BrokerError as exc:
            # Another replica may have re-made the consumer with or without its priority group since this
            # one looked: the server then refuses the request's shape. Look again, once.
            if not cached or "priority" not in str(exc).lower():
                raise
            self._pinned.pop(key, None)
            self._pins.pop(key, None)
            return await self._pull(stream, consumer, max_messages, timeout)

    async def _pull(self, stream: str, consumer: str, max_messages: int, timeout: float) -> list[Delivery]:
        group = PIN_GROUP if await self._is_pinned(stream, consumer) else None
        try:
            msgs = await self._pull_raw(stream, consumer, max_messages, timeout, group)
        except BrokerError:
            raise
        except Exception as exc:  # noqa: BLE001 - every client failure is a broker failure here
            raise BrokerUnavailable(f"cannot read consumer {consumer}: {exc or type(exc).__name__}") from exc
        return [self._delivery(msg) for msg in msgs]

    @staticmethod
    def _delivery(msg: Msg) -> Delivery:
        headers = msg.headers or {}
        # A holder of the direct broker credential writes these headers too: take only what is well formed.
        attributes = _header_json(headers, ATTRIBUTES_HEADER)
        if not (isinstance(attributes, dict) and all(isinstance(v, str) for v in attributes.values())):
            attributes = {}
        key = _header_json(headers, KEY_HEADER)
        key = key if isinstance(key, str) else None
        sequence, delivered, published = _ack_metadata(msg)
        trace = None
        if "traceparent" in headers:  # what the propagator cannot parse it ignores: a direct client's too
            trace = {k: headers[k] for k in TRACE_HEADERS if k in headers and len(headers[k]) <= TRACE_HEADER_MAX}
        return Delivery(msg.reply, sequence, msg.data, attributes, key, published, delivered, trace)

    # ------------------------------------------------------------------ acknowledgements

    def token_belongs(self, token: str, stream: str, consumer: str) -> bool:
        parts = token.split(".")
        if len(parts) < 9 or parts[0] != "$JS" or parts[1] != "ACK":
            return False
        if len(parts) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
            return parts[2] == stream and parts[3] == consumer and all(p.isdigit() for p in parts[4:])
        # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
        return len(parts) in (11, 12) and parts[4] == stream and parts[5] == consumer

    async def _send(self, token: str, payload: bytes) -> None:
        nc = await self._client()
        await nc.publish(token, payload)

    async def ack(self, tokens: list[str]) -> int:
        nc = await self._client()
        for token in tokens:
            await nc.publish(token, b"+ACK")
        # nats-py annotates `timeout: int` but passes it to asyncio.wait_for, which takes a float.
        await nc.flush(timeout=self._connect_timeout)  # type: ignore[arg-type]
        return len(tokens)

    async def nak(self, token: str, delay: float = 0.0) -> None:
        payload = b"-NAK" if delay <= 0 else b"-NAK " + json.dumps({"delay": int(delay * 1e9)}).encode()
        await self._send(token, payload)

    async def term(self, token: str) -> None:
        await self._send(token, b"+TERM")

    async def in_progress(self, token: str) -> None:
        await self._send(token, b"+WPI")
        # Flushed: it only helps if it reaches the server before the deadline it restarts.
        await (await self._client()).flush(timeout=self._connect_timeout)  # type: ignore[arg-type]

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until JetStream answers its API (it recovers its streams for a moment after a start)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await (await self._js()).account_info()
                return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                if loop.time() >= deadline:
                    raise BrokerError(f"JetStream at {self.url} is not ready: {exc or type(exc).__name__}") from exc
                await asyncio.sleep(0.1)

    async def ping(self) -> None:
        nc = await self._client()
        try:
            await nc.flush(timeout=2)
        except Exception as exc:  # noqa: BLE001
            raise BrokerError(f"NATS at {self.url} does not answer: {exc or type(exc).__name__}") from exc

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            try:
                await asyncio.wait_for(self._nc.drain(), 2.0)  # a server that is gone must not hold shutdown
            except Exception:  # noqa: BLE001 - closing anyway
                with contextlib.suppress(Exception):
                    await self._nc.close()
        self._nc = None


def _header_json(headers: dict[str, str], name: str) -> Any:
    try:
        return json_input.decode(headers[name]) if name in headers else None
    except json_input.JSONInputError:
        return None
