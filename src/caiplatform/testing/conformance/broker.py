"""Conformance suite of the broker port.

Each test takes a `broker_kit` fixture with:
- `broker`: the adapter under test;
- `name(suffix)`: a stream name unique to this test (the kit deletes its streams afterwards);
- `await advance(seconds)`: let that much broker time pass (move a manual clock, or sleep);
- `replica()`: another reader process on the same broker (the same object where one process is all
  there is, as in memory), closed by the kit.
"""

from __future__ import annotations

import asyncio

import pytest

from caiplatform.ports.broker import (
    ConsumerConfig,
    OutgoingMessage,
    PublishFailed,
    StreamConfig,
    StreamFull,
)

MiB = 1024 * 1024


async def _stream(kit, suffix: str = "t", **kw) -> StreamConfig:
    name = kit.name(suffix)
    config = StreamConfig(name=name, subject=name.replace("-", "."), max_bytes=kw.pop("max_bytes", MiB), **kw)
    await kit.broker.create_stream(config)
    return config


async def _pull_at_least(b, stream: str, consumer: str, count: int) -> list:
    """Pull (10 at a time, 1 s each) until `count` messages came; an empty pull before that fails."""
    got = await b.pull(stream, consumer, 10, 1.0)
    while len(got) < count:
        more = await b.pull(stream, consumer, 10, 1.0)
        assert more, "messages went missing"
        got += more
    return got


def _msgs(*texts: str, key: str | None = None) -> list[OutgoingMessage]:
    return [OutgoingMessage(t.encode(), {"n": t}, key) for t in texts]


async def test_publish_pull_ack_roundtrip(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=5))
    seqs = await b.publish(s.name, s.subject, _msgs("a", "b", "c", key="k"))
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    got = await _pull_at_least(b, s.name, "c1", 3)
    assert [d.data for d in got] == [b"a", b"b", b"c"]
    assert [d.sequence for d in got] == seqs
    assert got[0].attributes == {"n": "a"} and got[0].key == "k" and got[0].delivery_count == 1
    assert all(b.token_belongs(d.token, s.name, "c1") for d in got)
    assert not b.token_belongs(got[0].token, s.name, "other")
    assert await b.ack([d.token for d in got]) == 3
    await asyncio.sleep(0.05)
    stats = await b.consumer_stats(s.name, "c1")
    assert stats.ack_pending == 0 and stats.pending == 0 and stats.delivered >= 3
    assert await b.pull(s.name, "c1", 10, 0.1) == []
    # interest retention: acknowledged by every consumer means gone
    assert (await b.stream_stats(s.name)).messages == 0


async def test_pull_waits_for_first_message(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=5))

    async def later() -> None:
        await asyncio.sleep(0.2)
        await b.publish(s.name, s.subject, _msgs("late"))

    task = asyncio.create_task(later())
    got = await b.pull(s.name, "c1", 5, 3.0)
    await task
    assert [d.data for d in got] == [b"late"]


async def test_without_consumers_messages_are_not_retained(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    seqs = await b.publish(s.name, s.subject, _msgs("x"))
    assert len(seqs) == 1
    assert (await b.stream_stats(s.name)).messages == 0


async def test_redelivery_after_ack_wait_counts_attempts(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=1))
    await b.publish(s.name, s.subject, _msgs("again"))
    first = await b.pull(s.name, "c1", 1, 1.0)
    assert first[0].delivery_count == 1
    assert await b.pull(s.name, "c1", 1, 0.1) == []
    await broker_kit.advance(1.2)
    second = await b.pull(s.name, "c1", 1, 2.0)
    assert [d.data for d in second] == [b"again"] and second[0].delivery_count == 2
    await b.ack([second[0].token])


async def test_in_progress_restarts_the_ack_deadline(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=1))
    await b.publish(s.name, s.subject, _msgs("slow"))
    [held] = await b.pull(s.name, "c1", 1, 1.0)
    for _ in range(3):  # 2.1 s in all, twice the ack deadline, each step within it
        await broker_kit.advance(0.7)
        await b.in_progress(held.token)
    assert await b.pull(s.name, "c1", 1, 0.3) == []  # not redelivered while in progress
    assert await b.ack([held.token]) == 1
    await broker_kit.advance(1.2)
    assert await b.pull(s.name, "c1", 1, 0.3) == []  # acknowledged after all that: gone


async def test_nak_with_delay_redelivers_after_the_delay(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=30))
    await b.publish(s.name, s.subject, _msgs("retry"))
    first = await b.pull(s.name, "c1", 1, 1.0)
    await b.nak(first[0].token, delay=1.0)
    assert await b.pull(s.name, "c1", 1, 0.2) == []
    await broker_kit.advance(1.1)
    again = await b.pull(s.name, "c1", 1, 2.0)
    assert again and again[0].delivery_count == 2
    await b.term(again[0].token)
    await broker_kit.advance(0.1)
    assert await b.pull(s.name, "c1", 1, 0.2) == []


async def test_max_deliver_stops_redelivery(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=30, max_deliver=2))
    await b.publish(s.name, s.subject, _msgs("twice"))
    for attempt in (1, 2):
        got = await b.pull(s.name, "c1", 1, 1.0)
        assert got and got[0].delivery_count == attempt
        await b.nak(got[0].token)
        await broker_kit.advance(0.05)
    assert await b.pull(s.name, "c1", 1, 0.3) == []


async def test_max_ack_pending_limits_in_flight(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=30, max_ack_pending=1))
    await b.publish(s.name, s.subject, _msgs("1", "2", "3", key="k"))
    order = []
    for _ in range(3):
        got = await b.pull(s.name, "c1", 10, 1.0)
        assert len(got) == 1, "one message in flight at a time keeps per-key order"
        order.append(got[0].data)
        await b.ack([got[0].token])
        await broker_kit.advance(0.05)
    assert order == [b"1", b"2", b"3"]


async def test_discard_new_refuses_when_full(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit, max_bytes=4096, discard="new")
    await b.create_consumer(ConsumerConfig(s.name, "c1"))
    big = OutgoingMessage(b"x" * 1500)
    with pytest.raises(PublishFailed) as info:
        await b.publish(s.name, s.subject, [big, big, big, big])
    assert isinstance(info.value.cause, StreamFull)
    assert 1 <= len(info.value.sequences) < 4


async def test_discard_old_drops_oldest(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit, max_bytes=4096, discard="old")
    await b.create_consumer(ConsumerConfig(s.name, "c1"))
    for i in range(5):
        await b.publish(s.name, s.subject, [OutgoingMessage(str(i).encode() * 1500)])
    stats = await b.stream_stats(s.name)
    assert stats.bytes <= 4096 and 1 <= stats.messages < 5
    got = await b.pull(s.name, "c1", 10, 1.0)
    assert got[-1].data == b"4" * 1500 and got[0].data != b"0" * 1500


async def test_start_from_new_skips_earlier_messages(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "keeper"))
    await b.publish(s.name, s.subject, _msgs("old"))
    await b.create_consumer(ConsumerConfig(s.name, "fresh", deliver_new=True))
    await b.publish(s.name, s.subject, _msgs("new"))
    assert [d.data for d in await b.pull(s.name, "fresh", 10, 1.0)] == [b"new"]
    assert [d.data for d in await b.pull(s.name, "keeper", 10, 1.0)][:1] == [b"old"]


async def test_update_and_delete(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.update_stream(StreamConfig(s.name, s.subject, 2 * MiB, max_age=3600, discard="new"))
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=5))
    await b.update_consumer(ConsumerConfig(s.name, "c1", ack_wait=10, max_ack_pending=5))
    assert (await b.stream_stats(s.name)).consumers == 1
    assert await b.delete_consumer(s.name, "c1") is True
    assert await b.consumer_stats(s.name, "c1") is None
    assert await b.delete_stream(s.name) is True
    assert await b.stream_stats(s.name) is None
    assert await b.delete_stream(s.name) is False


async def test_two_readers_share_without_duplicates(broker_kit):
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=30))
    await b.publish(s.name, s.subject, _msgs(*[str(i) for i in range(20)]))
    seen: list[bytes] = []
    for _ in range(10):
        a, c = await asyncio.gather(b.pull(s.name, "c1", 3, 0.3), b.pull(s.name, "c1", 3, 0.3))
        seen += [d.data for d in a + c]
        await b.ack([d.token for d in a + c])
        if len(seen) >= 20:
            break
    assert sorted(seen, key=int) == [str(i).encode() for i in range(20)]


async def test_one_active_reader_and_takeover(broker_kit):
    """`max_ack_pending=1` (how exclusive and failover subscriptions run): while one reader holds a
    message nobody else gets anything; when it dies without acknowledging, another takes over in order."""
    b = broker_kit.broker
    s = await _stream(broker_kit)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=1, max_ack_pending=1, single_reader=True))
    await b.publish(s.name, s.subject, _msgs("first", "second"))
    held = await b.pull(s.name, "c1", 5, 1.0)  # reader A, which then dies
    assert [d.data for d in held] == [b"first"]
    assert await b.pull(s.name, "c1", 5, 0.2) == []  # reader B waits: one active reader
    await broker_kit.advance(1.2)
    taken = await b.pull(s.name, "c1", 5, 2.0)
    assert [d.data for d in taken] == [b"first"] and taken[0].delivery_count == 2
    await b.ack([taken[0].token])
    await broker_kit.advance(0.05)
    assert [d.data for d in await b.pull(s.name, "c1", 5, 1.0)] == [b"second"]


async def test_a_message_larger_than_the_topic(broker_kit):
    b = broker_kit.broker
    new = await _stream(broker_kit, "new", max_bytes=1024, discard="new")
    await b.create_consumer(ConsumerConfig(new.name, "c1"))
    with pytest.raises(PublishFailed) as info:
        await b.publish(new.name, new.subject, [OutgoingMessage(b"x" * 2000)])
    assert isinstance(info.value.cause, StreamFull) and info.value.sequences == []
    old = await _stream(broker_kit, "old", max_bytes=1024, discard="old")
    await b.create_consumer(ConsumerConfig(old.name, "c1"))
    assert len(await b.publish(old.name, old.subject, [OutgoingMessage(b"x" * 2000)])) == 1
    assert (await b.stream_stats(old.name)).messages == 0


async def test_single_reader_takeover_by_another_replica(broker_kit):
    """Exclusive and failover: replica A reads; B gets nothing while A holds a message; A stops pulling
    (dies holding "1"); B takes over in total order; where the broker pins readers, A coming back gets
    nothing while B keeps pulling."""
    a = broker_kit.broker
    b = broker_kit.replica()
    s = await _stream(broker_kit)
    config = ConsumerConfig(s.name, "c1", ack_wait=1, max_ack_pending=1, single_reader=True)
    await a.create_consumer(config)
    await a.publish(s.name, s.subject, _msgs("1", "2", "3"))
    assert [d.data for d in await a.pull(s.name, "c1", 5, 1.0)] == [b"1"]  # A holds "1", then dies
    assert await b.pull(s.name, "c1", 5, 0.3) == []
    await broker_kit.advance(config.takeover_after + 0.3)
    order, attempts = [], []
    for _ in range(3):
        got = await b.pull(s.name, "c1", 5, 2.0)
        assert len(got) == 1, "one message in flight keeps the total order"
        order.append(got[0].data)
        attempts.append(got[0].delivery_count)
        await b.ack([got[0].token])
        await broker_kit.advance(0.05)
    assert order == [b"1", b"2", b"3"] and attempts == [2, 1, 1]
    await a.publish(s.name, s.subject, _msgs("4"))
    if await a.pins_single_reader():
        assert await a.pull(s.name, "c1", 5, 0.3) == [], "B holds the pin while it keeps pulling"
    got = await b.pull(s.name, "c1", 5, 2.0)
    assert [d.data for d in got] == [b"4"]
    await b.ack([got[0].token])


async def test_a_message_id_is_stored_once_within_the_duplicate_window(broker_kit):
    """A retried publish (same `msg_id`s) stores nothing again and answers the stored sequences; a message
    that was not in the first attempt is stored; past the window the same id is a new message."""
    b = broker_kit.broker
    window = 1.0
    s = await _stream(broker_kit, duplicate_window=window)
    await b.create_consumer(ConsumerConfig(s.name, "c1", ack_wait=30))

    def batch(*texts: str) -> list[OutgoingMessage]:
        return [OutgoingMessage(t.encode(), {}, None, f"req-1:{t}") for t in texts]

    first = await b.publish(s.name, s.subject, batch("a", "b"))
    again = await b.publish(s.name, s.subject, batch("a", "b", "c"))
    assert again[:2] == first and again[2] > first[1]
    got = await _pull_at_least(b, s.name, "c1", 3)
    assert [d.data for d in got] == [b"a", b"b", b"c"]
    await b.ack([d.token for d in got])
    assert await b.pull(s.name, "c1", 10, 0.2) == []  # nothing twice
    # JetStream forgets an id within two windows of storing it (its purge runs once a window)
    await broker_kit.advance(window * 2.5)
    later = await b.publish(s.name, s.subject, batch("a"))
    assert later[0] > again[2]
    redo = await b.pull(s.name, "c1", 10, 1.0)
    assert [d.data for d in redo] == [b"a"]
