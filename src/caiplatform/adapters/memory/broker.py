"""In-process broker with JetStream's semantics: interest retention, byte and age limits with discard
old/new, durable consumers with ack wait, max_ack_pending, delivery counts and delayed redelivery.

Deadlines read the injected clock, so redelivery and push backoff are tested by moving a clock.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from caiplatform.clock import Clock
from caiplatform.ports.broker import (
    Broker,
    BrokerError,
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

POLL_INTERVAL = 0.01


@dataclass
class _Message:
    sequence: int
    data: bytes
    attributes: dict[str, str]
    key: str | None
    published_at: datetime
    stored_at: float
    size: int
    trace: dict[str, str] | None = None


@dataclass
class _Pending:
    count: int
    due: float  # clock.monotonic() after which it is redelivered


@dataclass
class _Consumer:
    config: ConsumerConfig
    cursor: int  # next stream sequence not yet delivered
    start: int  # messages before a `start_from: new` consumer existed are owed nothing by it
    pending: dict[int, _Pending] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    delivered: int = 0
    waiting: int = 0


@dataclass
class _Stream:
    config: StreamConfig
    messages: dict[int, _Message] = field(default_factory=dict)
    last_sequence: int = 0
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    # msg_id -> (sequence, clock.monotonic() when stored), in the order stored: the duplicate window
    seen: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(m.size for m in self.messages.values())


class InMemoryBroker(Broker):
    def __init__(self, clock: Clock | None = None, **_: object):
        self.clock = clock or Clock()
        self._streams: dict[str, _Stream] = {}
        self._instance = secrets.token_hex(4)

    @property
    def address(self) -> str:
        return "memory://broker"

    # ------------------------------------------------------------------ helpers

    def _stream(self, name: str) -> _Stream:
        stream = self._streams.get(name)
        if stream is None:
            raise StreamNotFound(f"stream {name} not found")
        return stream

    def _expire(self, stream: _Stream) -> None:
        if stream.config.max_age > 0:
            cutoff = self.clock.monotonic() - stream.config.max_age
            for seq in [s for s, m in stream.messages.items() if m.stored_at <= cutoff]:
                self._remove(stream, seq)

    def _remove(self, stream: _Stream, seq: int) -> None:
        stream.messages.pop(seq, None)
        for consumer in stream.consumers.values():
            consumer.pending.pop(seq, None)
            consumer.acked.discard(seq)

    def _reclaim(self, stream: _Stream, seq: int) -> None:
        """Interest retention: drop a message once every consumer has acknowledged it."""
        if all(seq in c.acked or seq < c.start for c in stream.consumers.values()):
            self._remove(stream, seq)

    # ------------------------------------------------------------------ streams

    async def create_stream(self, config: StreamConfig) -> None:
        existing = self._streams.get(config.name)
        if existing is not None:
            existing.config = config
            return
        self._streams[config.name] = _Stream(config)

    async def update_stream(self, config: StreamConfig) -> None:
        stream = self._stream(config.name)
        stream.config = config
        while stream.messages and stream.bytes > config.max_bytes:
            self._remove(stream, min(stream.messages))

    async def delete_stream(self, name: str) -> bool:
        return self._streams.pop(name, None) is not None

    async def stream_stats(self, name: str) -> StreamStats | None:
        stream = self._streams.get(name)
        if stream is None:
            return None
        self._expire(stream)
        return StreamStats(len(stream.messages), stream.bytes, len(stream.consumers))

    async def publish(self, stream_name: str, subject: str, messages: list[OutgoingMessage]) -> list[int]:
        stream = self._stream(stream_name)
        if subject != stream.config.subject:
            raise BrokerError(f"no stream matches subject {subject}")
        self._expire(stream)
        self._forget_ids(stream)
        sequences: list[int] = []
        for message in messages:
            if message.msg_id is not None and message.msg_id in stream.seen:
                sequences.append(stream.seen[message.msg_id][0])  # a duplicate: JetStream's answer
                continue
            size = len(message.data) + len(json.dumps(message.attributes)) + len(message.key or "") + len(subject)
            if stream.bytes + size > stream.config.max_bytes:
                if stream.config.discard == "new":
                    raise PublishFailed(sequences, StreamFull("maximum bytes exceeded"))
                while stream.messages and stream.bytes + size > stream.config.max_bytes:
                    self._remove(stream, min(stream.messages))
            stream.last_sequence += 1
            seq = stream.last_sequence
            # Interest retention: nobody owes an ack, nothing is kept. Like JetStream, a `discard: old`
            # stream accepts a message larger than itself and keeps none of it.
            if stream.consumers and size <= stream.config.max_bytes:
                stream.messages[seq] = _Message(
                    seq, message.data, dict(message.attributes), message.key, self.clock.now(),
                    self.clock.monotonic(), size, message.trace,
                )
            if message.msg_id is not None:
                stream.seen[message.msg_id] = (seq, self.clock.monotonic())
            sequences.append(seq)
        return sequences

    def _forget_ids(self, stream: _Stream) -> None:
        """Drop the ids stored longer ago than the stream's duplicate window (the oldest come first)."""
        cutoff = self.clock.monotonic() - stream.config.id_window
        for msg_id, (_, stored_at) in list(stream.seen.items()):
            if stored_at > cutoff:
                break
            del stream.seen[msg_id]

    # ------------------------------------------------------------------ consumers

    async def create_consumer(self, config: ConsumerConfig) -> None:
        stream = self._stream(config.stream)
        existing = stream.consumers.get(config.name)
        if existing is not None:
            existing.config = config
            return
        cursor = stream.last_sequence + 1 if config.deliver_new else 1
        stream.consumers[config.name] = _Consumer(config, cursor, cursor)

    async def update_consumer(self, config: ConsumerConfig) -> None:
        stream = self._stream(config.stream)
        consumer = stream.consumers.get(config.name)
        if consumer is None:
            raise BrokerError(f"consumer {config.name} not found")
        consumer.config = config

    async def delete_consumer(self, stream_name: str, name: str) -> bool:
        stream = self._streams.get(stream_name)
        if stream is None or stream.consumers.pop(name, None) is None:
            return False
        for seq in list(stream.messages):
            self._reclaim(stream, seq)
        return True

    async def consumer_stats(self, stream_name: str, name: str) -> ConsumerStats | None:
        stream = self._streams.get(stream_name)
        consumer = stream.consumers.get(name) if stream else None
        if stream is None or consumer is None:
            return None
        self._expire(stream)
        pending = sum(1 for seq in stream.messages if seq >= consumer.cursor)
        redelivered = sum(1 for p in consumer.pending.values() if p.count > 1)
        return ConsumerStats(pending, len(consumer.pending), consumer.delivered, redelivered, consumer.waiting)

    def _take(self, stream: _Stream, consumer: _Consumer, limit: int) -> list[Delivery]:
        self._expire(stream)
        now = self.clock.monotonic()
        out: list[Delivery] = []
        config = consumer.config
        due = sorted(seq for seq, p in consumer.pending.items() if p.due <= now)
        for seq in due:
            if len(out) >= limit:
                break
            message = stream.messages.get(seq)
            if message is None:
                consumer.pending.pop(seq, None)
                continue
            entry = consumer.pending[seq]
            if config.max_deliver and entry.count >= config.max_deliver:
                continue
            entry.count += 1
            entry.due = now + config.ack_wait
            out.append(self._delivery(stream, consumer, message, entry.count))
        while len(out) < limit and len(consumer.pending) < config.max_ack_pending:
            candidates = [seq for seq in stream.messages if seq >= consumer.cursor]
            if not candidates:
                break
            seq = min(candidates)
            consumer.cursor = seq + 1
            consumer.pending[seq] = _Pending(1, now + config.ack_wait)
            out.append(self._delivery(stream, consumer, stream.messages[seq], 1))
        return out

    def _delivery(self, stream: _Stream, consumer: _Consumer, message: _Message, count: int) -> Delivery:
        consumer.delivered += 1
        token = f"mem.{self._instance}.{stream.config.name}.{consumer.config.name}.{message.sequence}.{count}"
        return Delivery(token, message.sequence, message.data, dict(message.attributes), message.key,
                        message.published_at, count, message.trace)

    async def pull(self, stream_name: str, consumer_name: str, max_messages: int, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while True:
            stream = self._stream(stream_name)
            consumer = stream.consumers.get(consumer_name)
            if consumer is None:
                raise BrokerError(f"consumer {consumer_name} not found")
            taken = self._take(stream, consumer, max_messages)
            if taken or loop.time() >= deadline:
                return taken
            consumer.waiting += 1
            try:
                await asyncio.sleep(min(POLL_INTERVAL, max(deadline - loop.time(), 0)))
            finally:
                consumer.waiting -= 1

    # ------------------------------------------------------------------ acknowledgements

    def _parse(self, token: str) -> tuple[_Stream, _Consumer, int] | None:
        parts = token.split(".")
        if len(parts) != 6 or parts[0] != "mem" or parts[1] != self._instance:
            return None
        stream = self._streams.get(parts[2])
        consumer = stream.consumers.get(parts[3]) if stream else None
        if stream is None or consumer is None or not parts[4].isdigit():
            return None
        return stream, consumer, int(parts[4])

    def token_belongs(self, token: str, stream: str, consumer: str) -> bool:
        parts = token.split(".")
        return (
            len(parts) == 6 and parts[0] == "mem" and parts[2] == stream and parts[3] == consumer
            and parts[4].isdigit() and parts[5].isdigit()
        )

    async def ack(self, tokens: list[str]) -> int:
        done = 0
        for token in tokens:
            parsed = self._parse(token)
            if parsed is None:
                continue
            stream, consumer, seq = parsed
            consumer.pending.pop(seq, None)
            if seq in stream.messages:
                consumer.acked.add(seq)
                self._reclaim(stream, seq)
            done += 1
        return done

    def _redeliver_in(self, token: str, delay: Callable[[_Consumer], float]) -> None:
        """Move an unacknowledged delivery's next delivery to `delay(consumer)` seconds from now."""
        parsed = self._parse(token)
        if parsed is None:
            return
        _, consumer, seq = parsed
        entry = consumer.pending.get(seq)
        if entry is not None:
            entry.due = self.clock.monotonic() + delay(consumer)

    async def nak(self, token: str, delay: float = 0.0) -> None:
        self._redeliver_in(token, lambda _consumer: delay)

    async def in_progress(self, token: str) -> None:
        self._redeliver_in(token, lambda consumer: consumer.config.ack_wait)

    async def term(self, token: str) -> None:
        parsed = self._parse(token)
        if parsed is None:
            return
        stream, consumer, seq = parsed
        consumer.pending.pop(seq, None)
        consumer.acked.add(seq)
        self._reclaim(stream, seq)

    async def ping(self) -> None:
        return None

