"""Conformance suite of the session store port.

Each test takes a `session_store` fixture: a fresh, empty `SessionStore` whose `clock` attribute is a
`caiplatform.clock.ManualClock` (tests move it to order users and sessions).
"""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

import pytest

from caiplatform.clock import Clock
from caiplatform.errors import BadRequest, Conflict
from caiplatform.pagination import PAGE_SIZE_MESSAGE
from caiplatform.ports.sessions import new_event

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


class _ClockedStore(Protocol):
    """What the helpers use of the fixture's `SessionStore`: its clock (a `ManualClock` in this suite)."""

    clock: Clock


def _user(store: _ClockedStore, text: str, inv: str = "inv-1") -> dict:
    return new_event("user", [{"text": text}], invocation_id=inv, timestamp=store.clock.now())


def _agent_turn(store: _ClockedStore, answer: str, inv: str = "inv-1") -> list[dict]:
    now = store.clock.now()
    return [
        new_event("bot", [{"text": "let me think", "thought": True}], invocation_id=inv, timestamp=now),
        new_event("bot", [{"function_call": {"id": "c1", "name": "lookup", "args": {"q": "ü", "n": [1, 2]}}}],
                  invocation_id=inv, timestamp=now),
        new_event("bot", [{"function_response": {"id": "c1", "name": "lookup", "response": {"result": "ok"}}}],
                  invocation_id=inv, timestamp=now),
        new_event("bot", [{"text": answer}], invocation_id=inv, timestamp=now),
    ]


async def test_append_creates_and_reads_back_in_order(session_store):
    events = [_user(session_store, "hello there"), *_agent_turn(session_store, "hi!")]
    stored = await session_store.append("bot", "u1", "s1", events)
    assert stored.user_id == "u1" and stored.session_id == "s1" and stored.agent == "bot"
    back = await session_store.get("bot", "s1")
    assert back is not None
    assert back.events == events
    assert [e["author"] for e in back.events] == ["user", "bot", "bot", "bot", "bot"]
    assert back.events[1]["content"]["parts"][0]["thought"] is True
    assert back.events[2]["content"]["parts"][0]["function_call"]["args"] == {"q": "ü", "n": [1, 2]}
    body = back.to_dict()
    assert body["session_id"] == "s1" and body["user_id"] == "u1" and body["event_count"] == 5
    assert RFC3339.match(body["created"]) and RFC3339.match(body["last_update"])
    for event in body["events"]:
        assert {"author", "timestamp", "invocation_id", "content"} <= set(event)
        assert RFC3339.match(event["timestamp"])


async def test_missing_session_reads_none_and_deletes_false(session_store):
    assert await session_store.get("bot", "nope") is None
    assert await session_store.delete("bot", "nope") is False


async def test_appends_accumulate_and_update_last_update(session_store):
    await session_store.append("bot", "u1", "s1", [_user(session_store, "one")])
    first = await session_store.get("bot", "s1")
    session_store.clock.advance(5)
    await session_store.append("bot", "u1", "s1", [_user(session_store, "two", "inv-2")])
    second = await session_store.get("bot", "s1")
    assert [e["content"]["parts"][0]["text"] for e in second.events] == ["one", "two"]
    assert second.created == first.created
    assert (second.last_update - first.last_update).total_seconds() == pytest.approx(5)


async def test_create_refuses_a_taken_id(session_store):
    created = await session_store.create("bot", "u1", "s1", state={"k": 1})
    assert created.events == [] and created.state == {"k": 1}
    with pytest.raises(Conflict):
        await session_store.create("bot", "u1", "s1")
    with pytest.raises(Conflict):
        await session_store.create("bot", "u2", "s1")


async def test_a_session_belongs_to_one_user(session_store):
    await session_store.append("bot", "u1", "s1", [_user(session_store, "mine")])
    with pytest.raises(Conflict, match="belongs to another user"):
        await session_store.append("bot", "u2", "s1", [_user(session_store, "theirs")])
    with pytest.raises(Conflict):
        await session_store.ensure("bot", "u2", "s1")
    assert (await session_store.ensure("bot", "u1", "s1")).user_id == "u1"
    fresh = await session_store.ensure("bot", "u3", "s3")
    assert fresh.events == [] and fresh.user_id == "u3"
    assert len((await session_store.get("bot", "s1")).events) == 1


async def test_state_merges(session_store):
    await session_store.append("bot", "u1", "s1", [], state={"a": 1, "b": {"x": [1]}})
    await session_store.append("bot", "u1", "s1", [], state={"b": "two"})
    assert (await session_store.get("bot", "s1")).state == {"a": 1, "b": "two"}


async def test_agents_are_isolated(session_store):
    await session_store.append("bot", "u1", "s1", [_user(session_store, "x")])
    assert await session_store.get("other", "s1") is None
    assert (await session_store.list_users("other")).items == []
    await session_store.append("other", "u9", "s1", [_user(session_store, "y")])
    assert (await session_store.get("bot", "s1")).user_id == "u1"


async def test_user_summaries(session_store):
    t0 = session_store.clock.now()
    await session_store.append("bot", "alice", "a1", [_user(session_store, "a1")])
    session_store.clock.advance(10)
    await session_store.append("bot", "bob", "b1", [_user(session_store, "b1")])
    session_store.clock.advance(10)
    await session_store.append("bot", "alice", "a2", [_user(session_store, "a2")])
    listing = await session_store.list_users("bot")
    assert not listing.more
    assert [u.user_id for u in listing.items] == ["alice", "bob"]
    alice = listing.items[0]
    assert alice.session_count == 2
    assert alice.first_seen == t0
    assert (alice.last_seen - t0).total_seconds() == pytest.approx(20)
    body = alice.to_dict()
    assert set(body) == {"user_id", "first_seen", "last_seen", "session_count"}
    assert RFC3339.match(body["first_seen"]) and RFC3339.match(body["last_seen"])


async def test_session_summaries(session_store):
    await session_store.append("bot", "alice", "a1", [_user(session_store, "  first   question  "),
                                                      *_agent_turn(session_store, "ans")])
    session_store.clock.advance(1)
    await session_store.append("bot", "alice", "a2", [_user(session_store, "x" * 500)])
    await session_store.append("bot", "bob", "b1", [_user(session_store, "bob's")])
    listing = await session_store.list_sessions("bot", "alice")
    assert [s.session_id for s in listing.items] == ["a1", "a2"] and not listing.more
    a1, a2 = listing.items
    assert a1.event_count == 5 and a1.preview == "first question"
    assert 0 < len(a2.preview) <= 120
    body = a1.to_dict()
    assert set(body) == {"session_id", "created", "last_update", "event_count", "preview"}
    assert RFC3339.match(body["created"]) and RFC3339.match(body["last_update"])
    assert (await session_store.list_sessions("bot", "nobody")).items == []


async def test_paging_is_stable_and_complete(session_store):
    for i in range(5):
        await session_store.append("bot", f"user-{i}", f"s-{i}", [_user(session_store, str(i))])
        await session_store.append("bot", "many", f"m-{i}", [_user(session_store, str(i))])
        session_store.clock.advance(1)
    seen, offset = [], 0
    while True:
        page = await session_store.list_users("bot", offset=offset, limit=2)
        seen += [u.user_id for u in page.items]
        offset += 2
        if not page.more:
            break
    assert seen == ["many", "user-0", "user-1", "user-2", "user-3", "user-4"]
    first = await session_store.list_sessions("bot", "many", offset=0, limit=3)
    rest = await session_store.list_sessions("bot", "many", offset=3, limit=3)
    assert first.more and not rest.more
    assert [s.session_id for s in first.items + rest.items] == [f"m-{i}" for i in range(5)]
    exact = await session_store.list_sessions("bot", "many", offset=0, limit=5)
    assert len(exact.items) == 5 and not exact.more
    past = await session_store.list_users("bot", offset=50, limit=200)
    assert past.items == [] and not past.more


async def test_limits_outside_1_to_200_are_refused(session_store):
    for bad in (0, 201, -1):
        with pytest.raises(BadRequest, match=PAGE_SIZE_MESSAGE):
            await session_store.list_users("bot", limit=bad)
        with pytest.raises(BadRequest, match=PAGE_SIZE_MESSAGE):
            await session_store.list_sessions("bot", "u", limit=bad)
    await session_store.list_users("bot", limit=200)


async def test_delete_updates_the_indexes(session_store):
    await session_store.append("bot", "alice", "a1", [_user(session_store, "one")])
    session_store.clock.advance(10)
    await session_store.append("bot", "alice", "a2", [_user(session_store, "two")])
    session_store.clock.advance(10)
    await session_store.append("bot", "bob", "b1", [_user(session_store, "three")])
    assert await session_store.delete("bot", "a1") is True
    assert await session_store.get("bot", "a1") is None
    assert await session_store.delete("bot", "a1") is False
    users = {u.user_id: u for u in (await session_store.list_users("bot")).items}
    assert users["alice"].session_count == 1
    assert users["alice"].first_seen == (await session_store.get("bot", "a2")).created
    assert [s.session_id for s in (await session_store.list_sessions("bot", "alice")).items] == ["a2"]
    assert await session_store.delete("bot", "b1") is True
    assert [u.user_id for u in (await session_store.list_users("bot")).items] == ["alice"]
    # the id is free again, for anyone
    await session_store.append("bot", "carol", "a1", [_user(session_store, "new")])
    assert (await session_store.get("bot", "a1")).user_id == "carol"
    assert len((await session_store.get("bot", "a1")).events) == 1


async def test_concurrent_appends_lose_nothing(session_store):
    async def one(i: int) -> None:
        await session_store.append("bot", "u1", "busy", [_user(session_store, f"m{i}"), _user(session_store, f"n{i}")])

    await asyncio.gather(*(one(i) for i in range(20)))
    session = await session_store.get("bot", "busy")
    texts = [e["content"]["parts"][0]["text"] for e in session.events]
    assert len(texts) == 40
    for i in range(20):  # each append stays contiguous
        assert texts[texts.index(f"m{i}") + 1] == f"n{i}"
    summary = (await session_store.list_sessions("bot", "u1")).items[0]
    assert summary.event_count == 40


async def test_claim_creates_refuses_others_and_does_not_touch(session_store):
    head = await session_store.claim("bot", "u1", "c1")
    assert (head.user_id, head.event_count) == ("u1", 0)
    created = await session_store.get("bot", "c1")
    assert created is not None and created.user_id == "u1" and created.events == []
    assert head.created == created.created
    with pytest.raises(Conflict):
        await session_store.claim("bot", "u2", "c1")
    await session_store.append("bot", "u1", "c1", [_user(session_store, "one")])
    before = await session_store.get("bot", "c1")
    session_store.clock.advance(5)
    again = await session_store.claim("bot", "u1", "c1")
    assert (again.event_count, again.created, again.version) == (1, before.created, (before.created, 1))
    assert (await session_store.get("bot", "c1")).last_update == before.last_update  # a claim is a read


async def test_extend_appends_like_append_and_answers_the_head(session_store):
    head = await session_store.extend("bot", "u1", "x1", [_user(session_store, "one")])
    assert (head.user_id, head.event_count) == ("u1", 1)
    session_store.clock.advance(3)
    turn = _agent_turn(session_store, "two")
    head = await session_store.extend("bot", "u1", "x1", turn)
    assert head.event_count == 5
    stored = await session_store.get("bot", "x1")
    assert head.created == stored.created and stored.last_update > stored.created
    assert [e["content"]["parts"][0].get("text") for e in stored.events][0] == "one"
    assert stored.events[1:] == turn
    summary = (await session_store.list_sessions("bot", "u1")).items[0]
    assert (summary.event_count, summary.preview) == (5, "one")
    with pytest.raises(Conflict):
        await session_store.extend("bot", "u2", "x1", [_user(session_store, "theirs")])
    assert len((await session_store.get("bot", "x1")).events) == 5



async def test_forget_user_removes_every_session_of_that_user_only(session_store):
    await session_store.append("bot", "alice", "a1", [_user(session_store, "alice one"), *_agent_turn(session_store, "x")])
    session_store.clock.advance(1)
    await session_store.append("bot", "bob", "b1", [_user(session_store, "bob one")])
    session_store.clock.advance(1)
    await session_store.append("bot", "alice", "a2", [_user(session_store, "alice two")], state={"k": 1})
    await session_store.append("other", "alice", "o1", [_user(session_store, "elsewhere")])

    gone = await session_store.forget_user("bot", "alice")
    assert (gone.sessions, gone.events) == (2, 6)
    assert await session_store.get("bot", "a1") is None and await session_store.get("bot", "a2") is None
    assert [u.user_id for u in (await session_store.list_users("bot")).items] == ["bob"]
    assert (await session_store.list_sessions("bot", "alice")).items == []
    assert len((await session_store.get("bot", "b1")).events) == 1
    assert (await session_store.get("other", "o1")).user_id == "alice"  # another agent keeps its own

    again = await session_store.forget_user("bot", "alice")  # idempotent
    assert (again.sessions, again.events) == (0, 0)
    # the same session id starts afresh for the user afterwards
    head = await session_store.claim("bot", "alice", "a1")
    assert head.event_count == 0
