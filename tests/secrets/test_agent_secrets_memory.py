from __future__ import annotations

import pytest

from caiplatform.adapters.memory.agent_secrets import InMemoryAgentSecrets, Recorded

pytestmark = pytest.mark.anyio


async def test_records_writes_removals_and_rolls() -> None:
    store = InMemoryAgentSecrets()
    agent = store.add_agent("p1", "helper")
    assert await store.find_agent("p1", "helper") == agent
    assert await store.find_agent("p2", "helper") is None
    await store.set_keys(agent, {"A": "1", "B": "2"})
    assert await store.remove_keys(agent, ["A", "Z"]) == ["A"]
    assert await store.roll_revision(agent, "unbind A") is True
    assert store.secret_of(agent) == {"B": "2"}
    assert store.revisions_of(agent) == 1
    assert store.log == [
        Recorded("set", agent.id, ("A", "B")),
        Recorded("remove", agent.id, ("A", "Z")),
        Recorded("roll", agent.id, reason="unbind A"),
    ]


async def test_injected_failure_changes_nothing() -> None:
    store = InMemoryAgentSecrets()
    agent = store.add_agent("p1", "helper")
    store.fail_next("set")
    with pytest.raises(Exception, match="injected"):
        await store.set_keys(agent, {"A": "1"})
    assert store.secret_of(agent) == {} and store.log == []
    undeployed = store.add_agent("p1", "draft", deployed=False)
    assert await store.roll_revision(undeployed, "x") is False
