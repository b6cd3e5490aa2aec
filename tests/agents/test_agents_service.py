"""The agents service through the library (no HTTP): the directory the invoke path uses, bindings from
the secrets area reaching a real agent, and the same rules as the routes."""

from __future__ import annotations

import pytest

from caiplatform.errors import Conflict, Forbidden, NotFound, Unauthenticated
from caiplatform.models.agents import ConfigPatch, SecretsReplace
from caiplatform.models.secrets import BindingPut, SecretWrite
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload

from .agents_support import FUNCTION, tarball


def _upload(name: str, framework: str = "function") -> DeployUpload:
    return DeployUpload(fields={"name": name, "framework": framework}, code=tarball(FUNCTION))


@pytest.fixture
def automation():
    return Principal.automation()


async def test_directory_for_the_invoke_path(platform, world, automation):
    agents = platform.agents
    await agents.deploy(automation, "default", _upload("dir"))
    await agents.deploy(automation, "other", _upload("dup"))
    await agents.deploy(automation, "default", _upload("dup"))
    await agents.wait_idle()
    anonymous = Principal.anonymous()
    target = await agents.invoke_target(anonymous, "dir", None)
    assert target.agent == "dir" and target.kind == "function" and target.project_id == world.project_id
    assert target.workload.name == "dir" and target.workload.project_short == world.project_short
    with pytest.raises(NotFound, match="unknown agent: nope"):
        await agents.invoke_target(anonymous, "nope", None)
    with pytest.raises(Conflict, match=r"\?project="):
        await agents.invoke_target(anonymous, "dup", None)
    assert (await agents.invoke_target(anonymous, "dup", "other")).project_id == world.other_project_id
    with pytest.raises(Unauthenticated):
        await agents.manage_target(anonymous, "dir", None)
    member = await platform.auth.authenticate(world.member["Authorization"].split()[1])
    with pytest.raises(Forbidden):  # deployed with the automation token: no recorded owner
        await agents.manage_target(member, "dir", None)
    assert (await agents.manage_target(automation, "dir", "default")).agent_id == target.agent_id
    assert await agents.embed_target("emb_nothing") is None


async def test_bindings_reach_the_agent_and_roll_a_revision(platform, world, automation):
    await platform.agents.deploy(automation, "default", _upload("bound"))
    await platform.agents.wait_idle()
    await platform.secrets.put(automation, world.project_id, SecretWrite(name="api-key", value="v1"))
    await platform.secrets.bind(automation, world.project_id, "bound", "API_KEY", BindingPut(secret_name="api-key"))
    applied = await platform.secrets.apply(automation, world.project_id, "bound")
    assert applied.applied[0].version == 1
    keys = await platform.agents.secret_keys(automation, "bound", "default")
    assert keys.keys == ["API_KEY"]
    await platform.agents.wait_idle()
    view = await platform.agents.get(automation, "bound", "default")
    assert view.latest_revision == "bound-00002" and view.ready
    # A redeploy puts the bound values in again; a delete forgets the bindings.
    await platform.agents.redeploy(automation, "bound", "default")
    await platform.agents.wait_idle()
    assert (await platform.agents.secret_keys(automation, "bound", "default")).keys == ["API_KEY"]
    await platform.agents.delete(automation, "bound", "default")
    assert (await platform.secrets.list_bindings(automation, world.project_id)).bindings == []


async def test_audit_rows_name_the_actor(platform, world):
    from sqlalchemy import select

    from caiplatform.db.models import AuditEntry

    member = await platform.auth.authenticate(world.member["Authorization"].split()[1])
    await platform.agents.deploy(member, "default", _upload("audited"))
    await platform.agents.wait_idle()
    await platform.agents.patch_config(member, "audited", None, ConfigPatch(timeout_seconds=10))
    await platform.agents.delete(member, "audited", None)
    rows = await platform.db.run(lambda s: [(a.action, a.actor) for a in s.scalars(select(AuditEntry).where(AuditEntry.target == "audited"))])
    assert ("agent.deploy", "member@example.com") in rows and ("agent.config", "member@example.com") in rows
    assert ("agent.delete", "member@example.com") in rows


async def test_purge_project_deletes_every_agent(platform, world, automation):
    await platform.agents.deploy(automation, "other", _upload("one"))
    await platform.agents.deploy(automation, "other", _upload("two"))
    await platform.agents.wait_idle()
    assert await platform.agents.purge_project(world.other_project_id) == 2
    assert (await platform.agents.list(automation, "other")).agents == []


async def test_hooks_for_the_identity_area(platform, world, automation):
    from caiplatform.db.models import PlatformSetting

    member = await platform.auth.authenticate(world.member["Authorization"].split()[1])
    await platform.agents.deploy(member, "default", _upload("owned"))
    await platform.agents.deploy(automation, "default", _upload("orphan"))
    await platform.agents.wait_idle()
    assert await platform.agents.project_agent_names(world.project_id) == ["orphan", "owned"]
    assert await platform.agents.user_agents(member.user_id) == [(world.project_id, "owned")]
    assert [v.name for v in await platform.agents.unowned_agents()] == ["orphan"]
    # A new platform model key rolls every agent without a key of its own.
    await platform.agents.put_secrets(automation, "owned", "default", SecretsReplace({"MODEL_API_KEY": "own"}))
    await platform.agents.wait_idle()
    await platform.db.run(lambda s: s.add(PlatformSetting(key="model_api_key", value="platform-key")))
    assert await platform.agents.model_key_changed("platform-key") == []
    await platform.agents.wait_idle()
    assert (await platform.agents.get(automation, "orphan", None)).latest_revision == "orphan-00002"
    owned = await platform.agents.get(automation, "owned", None)
    assert owned.latest_revision == "owned-00002", owned.message
    target = await platform.agents.manage_target(automation, "orphan", None)
    endpoint = await platform.runtime.acquire(target.workload, timeout=5)
    async with endpoint.client() as http:
        assert (await http.get("/env/MODEL_API_KEY")).json()["value"] == "platform-key"
    await endpoint.release()
