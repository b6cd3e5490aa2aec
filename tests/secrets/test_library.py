"""The same rules through the library, without HTTP."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project
from caiplatform.errors import BadRequest, Forbidden, NotFound, Unauthenticated
from caiplatform.models.secrets import BindingPut, Secret, SecretIssueToken, SecretWrite, SecretWritten
from caiplatform.platform import Platform
from caiplatform.principal import CredentialKind, Principal, PrincipalKind

pytestmark = pytest.mark.anyio


@pytest.fixture
async def lib(settings, clock):
    from caiplatform.adapters.memory.agent_secrets import InMemoryAgentSecrets

    p = Platform.in_memory(settings.model_copy(update={"admin_email": None, "admin_password": None}), clock=clock)
    p.secrets.set_agents(InMemoryAgentSecrets())  # record what the store asks of agents
    await p.start()
    yield p
    await p.aclose()


async def test_library_rules(lib):
    store = lib.secrets
    pid = await lib.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    automation = Principal.automation()
    created = await store.put(automation, pid, SecretWrite(name="k", value="v"))
    assert isinstance(created, SecretWritten) and created.created and created.version == 1
    assert not (await store.put(automation, pid, SecretWrite(name="k", value="w"))).created
    got = await store.get(automation, pid, "k")
    assert isinstance(got, Secret) and got.current_version == 2 and [v.version for v in got.versions] == [1, 2]
    with pytest.raises(BadRequest):
        SecretWrite(name="bad name", value="v")
    with pytest.raises(BadRequest):  # the spec's message, from the model as from the route
        SecretWrite.parse({"name": "k", "value": "v", "valeu": "typo"})
    with pytest.raises(NotFound):
        await store.get(automation, pid, "crusoe-cloud-credential")
    with pytest.raises(Unauthenticated):
        await store.list(Principal.anonymous(), pid)
    workload = Principal(kind=PrincipalKind.WORKLOAD, credential=CredentialKind.WORKLOAD_KEY, project_id=pid)
    with pytest.raises(Forbidden):
        await store.list(workload, pid)
    token = await store.issue_project_token(workload, pid, SecretIssueToken.parse({"ttl_seconds": "90"}))
    assert token.ttl_seconds == 90 and token.read.path
    agent = store.agents.add_agent(pid, "bot")
    await store.bind(automation, pid, "bot", "K", BindingPut(secret_name="k"))
    applied = await store.apply(automation, pid, "bot")
    assert applied.applied[0].version == 2 and store.agents.secret_of(agent) == {"K": "w"}
    assert await store.values_for_deploy(None, agent) == {"K": "w"}
    assert await store.values_for_deploy(None, store.agents.add_agent(pid, "unbound")) == {}
    assert await store.purge_project(pid) == 1
    assert (await store.list(automation, pid)).secrets == []
    assert (await store.list_bindings(automation, pid)).bindings == []
