"""The typed contract of the agent routes (issue 19): a field an operation does not know is a 400 that
names it and nothing is written; the library takes and returns models."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest
from caiplatform.models.agents import (
    AgentView,
    ConfigPatch,
    EmbedUpdate,
    EnvPatch,
    SecretsPatch,
    SecretsReplace,
    SourceFileWrite,
    TrafficSplit,
)
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload

from .agents_support import FUNCTION, deploy, tarball, wait_settled


@pytest.fixture
async def bot(client, world):
    await deploy(client, world.admin, "bot", framework="function")
    return await wait_settled(client, world.admin, "bot")


async def test_a_misspelled_field_is_a_400_naming_it_and_writes_nothing(client, world, bot):
    h = world.admin
    r = await client.patch("/v1/agents/bot/env", headers=h, json={"set": {"A": "1"}, "remvoe": ["B"]})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "remvoe"'
    assert (await client.get("/v1/agents/bot/env", headers=h)).json()["env"] == {}
    r = await client.put("/v1/agents/bot/files/x.py", headers=h, json={"content": "X = 1\n", "mode": "0644"})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "mode"'
    assert (await client.get("/v1/agents/bot/files/x.py", headers=h)).status_code == 404
    r = await client.post("/v1/agents/bot/set-traffic", headers=h,
                          json={"traffic": [{"revision_name": "bot-00001", "percent": 100, "tag": "x"}]})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "traffic.0.tag"'
    # the spec's own message where it names one
    r = await client.patch("/v1/agents/bot/config", headers=h, json={"timout_seconds": 5})
    assert r.status_code == 400 and r.json()["error"].startswith("unknown config field 'timout_seconds'")
    assert (await client.get("/v1/agents/bot/config", headers=h)).json()["config"] is None


def test_request_models_keep_the_spec_messages():
    for model, body, message in [
        (EnvPatch, {}, "nothing to do: provide 'set' and/or 'remove'"),
        (SecretsPatch, {"set": {"1A": "x"}}, "invalid secret key (must be a valid environment variable name): 1A"),
        (SecretsReplace, ["A"], "the body must be a JSON object mapping secret keys to values"),
        (ConfigPatch, {"scaling": {"min_scale": -1}}, "min_scale -1 is negative; min_scale must be zero or more"),
        (TrafficSplit, {"traffic": [{"revision_name": "a", "percent": 60}]},
         "traffic is required - send the complete split"),
        (EmbedUpdate, {"position": "top"}, "position must be left or right"),
        (SourceFileWrite, {}, "'content' is required and must be a string"),
    ]:
        with pytest.raises(BadRequest) as caught:
            model.parse(body)
        assert caught.value.message.startswith(message), (model, caught.value.message)
    assert ConfigPatch.parse({"config": {"scaling": {"min_scale": ""}}}).changes() == {"scaling": {"min_scale": ""}}
    assert EnvPatch.parse({"set": {"A": 1, "B": True}}).values() == {"A": "1", "B": "true"}
    assert SecretsReplace.parse({"A": "x", "B": ""}).values() == {"A": "x"}


async def test_the_library_takes_and_returns_models(platform, world):
    automation = Principal.automation()
    accepted = await platform.agents.deploy(automation, "default", DeployUpload(
        fields={"name": "lib", "framework": "function"}, code=tarball(FUNCTION)))
    assert accepted.agent == "lib" and accepted.build_id
    await platform.agents.wait_idle()
    view = await platform.agents.get(automation, "lib", None)
    assert isinstance(view, AgentView) and view.ready and view.kind == "function"
    assert "message" not in view.to_json() or view.message
    updated = await platform.agents.patch_env(automation, "lib", None, EnvPatch(set={"GREETING": "hi"}))
    assert updated.env == {"GREETING": "hi"}
    config = await platform.agents.patch_config(automation, "lib", None, ConfigPatch.parse({"timeout_seconds": 30}))
    assert config.config is not None and config.config.timeout_seconds == 30
    await platform.agents.wait_idle()
    revisions = await platform.agents.revisions(automation, "lib", None)
    assert [r.name for r in revisions.revisions][:1] == ["lib-00003"]
    page = await platform.agents.list(automation, "default")
    assert [a.name for a in page.page_items()] == ["lib"] and page.next_page_token == ""
