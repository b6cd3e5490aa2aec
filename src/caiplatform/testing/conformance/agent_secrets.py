"""Conformance suite for the agent-secret port (`caiplatform.ports.agent_secrets.AgentSecrets`).

Use from a test module that provides the fixture `agent_world`: an `AgentWorld` whose `adapter` is the
port under test, `project_id` a project agents can live in, `add(name, deployed)` creates an agent the
adapter knows (deployed: it has a revision that can be rolled) and `secret_of(ref)` reads its secret.

Then `from caiplatform.testing.conformance.agent_secrets import *` collects the tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets

pytestmark = pytest.mark.anyio


@dataclass
class AgentWorld:
    adapter: AgentSecrets
    project_id: str
    add: Callable[[str, bool], Awaitable[AgentRef]]
    secret_of: Callable[[AgentRef], Awaitable[dict[str, str]]]


async def test_agents_are_found_by_project_and_name_and_by_id(agent_world: AgentWorld) -> None:
    agent = await agent_world.add("helper", True)
    assert await agent_world.adapter.find_agent(agent_world.project_id, "helper") == agent
    assert await agent_world.adapter.find_agent(agent_world.project_id, "nobody") is None
    assert await agent_world.adapter.find_agent("00000000-0000-0000-0000-000000000000", "helper") is None
    assert await agent_world.adapter.get_agent(agent.id) == agent
    assert await agent_world.adapter.get_agent("00000000-0000-0000-0000-000000000000") is None


async def test_set_keys_merges_and_remove_keys_reports_what_was_there(agent_world: AgentWorld) -> None:
    agent = await agent_world.add("keys", True)
    await agent_world.adapter.set_keys(agent, {"A": "1", "B": "2"})
    await agent_world.adapter.set_keys(agent, {"B": "3", "C": "4"})
    assert await agent_world.secret_of(agent) == {"A": "1", "B": "3", "C": "4"}
    assert await agent_world.adapter.remove_keys(agent, ["A", "Z"]) == ["A"]
    assert await agent_world.secret_of(agent) == {"B": "3", "C": "4"}


async def test_roll_needs_a_deployed_revision(agent_world: AgentWorld) -> None:
    deployed = await agent_world.add("rolled", True)
    assert await agent_world.adapter.roll_revision(deployed, "bind K") is True
    pending = await agent_world.add("pending", False)
    assert await agent_world.adapter.roll_revision(pending, "bind K") is False
