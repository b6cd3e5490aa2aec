"""A turn's work does not grow with the session: counted, never timed.

A counting wrapper around the session store counts the transcript events each turn reads and writes;
a counter on LangChain's message constructor counts the messages built per turn (what rebuilding or
deserializing the graph's state costs). Both are compared at the start of a 300-turn session and at its
end. Speed itself is measured by `benchmarks/long_session_bench.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.adapters.sqlite.sessions import SQLiteSessionStore
from caiplatform.ports.sessions import (
    Forgotten,
    Listing,
    Session,
    SessionStore,
    SessionSummary,
    UserSummary,
    new_event,
)
from caiplatform.testing.turn_checks import write_agent
from caiplatform.turns import Conversation, load_runner

if TYPE_CHECKING:
    from caiplatform.ports.sessions import SessionHead

pytestmark = pytest.mark.needs("agents")

# Answers with how many messages its state holds, so a test can see the state the graph ran on.
COUNTING_GRAPH = {"graph.py": """\
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph


    def echo(state):
        return {"messages": [AIMessage(content=f"{len(state['messages'])}: {state['messages'][-1].content}")]}


    builder = StateGraph(MessagesState)
    builder.add_node("echo", echo)
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    graph = builder.compile()
"""}

TURNS = 300


class CountingStore(SessionStore):
    """Delegates to a real store; counts the transcript events read back and written."""

    def __init__(self, inner: SessionStore):
        self.inner = inner
        self.read = 0
        self.written = 0

    def _seen(self, session: Session | None) -> Session | None:
        if session is not None:
            self.read += len(session.events)
        return session

    async def create(self, agent: str, user_id: str, session_id: str, *, state: dict[str, Any] | None = None) -> Session:
        return self._seen(await self.inner.create(agent, user_id, session_id, state=state))  # type: ignore[return-value]

    async def get(self, agent: str, session_id: str) -> Session | None:
        return self._seen(await self.inner.get(agent, session_id))

    async def append(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]], *,
                     state: dict[str, Any] | None = None) -> Session:
        self.written += len(events)
        return self._seen(await self.inner.append(agent, user_id, session_id, events, state=state))  # type: ignore[return-value]

    async def claim(self, agent: str, user_id: str, session_id: str) -> SessionHead:
        return await self.inner.claim(agent, user_id, session_id)

    async def extend(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]]) -> SessionHead:
        self.written += len(events)
        return await self.inner.extend(agent, user_id, session_id, events)

    async def list_users(self, agent: str, *, offset: int = 0, limit: int = 50) -> Listing[UserSummary]:
        return await self.inner.list_users(agent, offset=offset, limit=limit)

    async def list_sessions(self, agent: str, user_id: str, *, offset: int = 0, limit: int = 50) -> Listing[SessionSummary]:
        return await self.inner.list_sessions(agent, user_id, offset=offset, limit=limit)

    async def delete(self, agent: str, session_id: str) -> bool:
        return await self.inner.delete(agent, session_id)

    async def forget_user(self, agent: str, user_id: str) -> Forgotten:
        return await self.inner.forget_user(agent, user_id)


@pytest.fixture
def built(monkeypatch):
    """A counter of LangChain messages constructed (deserialized, rebuilt from the transcript or new)."""
    from langchain_core.messages import BaseMessage

    counter = {"n": 0}
    original = BaseMessage.__init__

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        counter["n"] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(BaseMessage, "__init__", counting)
    return counter


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    inner = InMemorySessionStore() if request.param == "memory" else SQLiteSessionStore(tmp_path / "sessions.sqlite3")
    return CountingStore(inner)


def _runner(tmp_path, name: str = "lg", **kwargs: Any):
    return load_runner("langgraph", write_agent(tmp_path / name, COUNTING_GRAPH), agent="echo", **kwargs)


async def test_turn_300_reads_writes_and_builds_what_turn_2_does(tmp_path, store, built):
    conv = Conversation(_runner(tmp_path), store)
    work: dict[int, tuple[int, int, int]] = {}
    for turn in range(1, TURNS + 1):
        read, written, made = store.read, store.written, built["n"]
        result = await conv.invoke(f"message {turn}", "long", "u1")
        assert result.output == f"{2 * turn - 1}: message {turn}"  # the graph saw the whole conversation
        work[turn] = (store.read - read, store.written - written, built["n"] - made)
    early, late = work[2], work[TURNS]
    assert late[0] == early[0] == 0, f"transcript events read per turn: {early[0]} at turn 2, {late[0]} at turn {TURNS}"
    assert late[1] == early[1] == 2  # the turn's own two events, appended
    assert late[2] <= early[2], f"messages built per turn: {early[2]} at turn 2, {late[2]} at turn {TURNS}"
    stored = await store.inner.get("echo", "long")
    assert stored is not None and len(stored.events) == 2 * TURNS


async def test_the_live_state_holds_one_checkpoint_a_session(tmp_path):
    runner = _runner(tmp_path)
    conv = Conversation(runner, InMemorySessionStore())
    saver = runner.graph.checkpointer

    def held() -> tuple[int, int, int]:
        return len(saver.storage["s"][""]), len(saver.blobs), sum(len(w) for w in saver.writes.values())

    for turn in range(50):
        await conv.invoke(f"m{turn}", "s", "u")
        if turn == 4:
            after_five = held()
    assert held() == after_five, "what the checkpointer holds for a session grew with the session"
    assert held()[0] <= 2  # the latest checkpoint and its parent, not one per step


async def test_evicted_and_stale_sessions_are_rebuilt_from_the_transcript(tmp_path, built):
    store = CountingStore(InMemorySessionStore())
    runner = _runner(tmp_path, live_sessions=2)
    conv = Conversation(runner, store)
    for sid in ("a", "b"):
        await conv.invoke("one", sid, "u")
        await conv.invoke("two", sid, "u")
    assert (await conv.invoke("one", "c", "u")).output == "1: one"  # "a" is evicted
    assert not runner.holds_session("a") and runner.holds_session("b") and runner.holds_session("c")
    read = store.read
    assert (await conv.invoke("three", "a", "u")).output == "5: three"  # rebuilt: 4 events + the new message
    assert store.read - read == 4
    # another replica answered a turn of "b": the live state is behind the transcript, so it is rebuilt
    other = [new_event("user", [{"text": "elsewhere"}], invocation_id="x", timestamp=store.inner.clock.now()),
             new_event("echo", [{"text": "answered elsewhere"}], invocation_id="x", timestamp=store.inner.clock.now())]
    await store.inner.append("echo", "u", "b", other)
    assert (await conv.invoke("four", "b", "u")).output == "7: four"
    # deleted and created again under the same id: nothing of the old conversation survives
    await store.inner.delete("echo", "b")
    await store.inner.append("echo", "u2", "b", [new_event("user", [{"text": "new owner"}], invocation_id="y",
                                                            timestamp=store.inner.clock.now())])
    assert (await conv.invoke("hello", "b", "u2")).output == "2: hello"
