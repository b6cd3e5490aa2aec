"""The typed contract of the secret routes (issue 19): unknown fields are refused and write nothing; the
lenient bodies stay lenient; the route answers exactly the store's model."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest
from caiplatform.models.secrets import BindingPut, SecretIssueToken, SecretReveal, SecretWrite

from .test_http_bindings import maps, secret

pytestmark = pytest.mark.anyio


@pytest.fixture
def helper(agents, world):
    return agents.add_agent(world.project_id, "helper")


async def test_a_misspelled_field_is_refused_by_name_and_nothing_is_stored(client, world):
    base = f"/v1/projects/{world.project_id}/secrets"
    r = await client.post(base, json={"name": "k", "value": "v", "valeu": "v2"}, headers=world.member)
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "valeu"'
    assert (await client.get(f"{base}/k", headers=world.member)).status_code == 404
    assert (await client.get(base, headers=world.member)).json()["secrets"] == []


async def test_the_spec_messages_come_before_unknown_fields(client, world):
    base = f"/v1/projects/{world.project_id}/secrets"
    r = await client.post(base, json={"name": "bad name", "value": "v", "extra": 1}, headers=world.member)
    assert r.status_code == 400 and r.json()["error"].startswith("missing or invalid 'name'")
    r = await client.post(base, json={"name": "k", "value": ""}, headers=world.member)
    assert r.json()["error"] == "missing or empty 'value' (a non-empty string is required)"


async def test_a_binding_with_an_unknown_field_is_refused_and_not_saved(client, world, helper):
    await secret(client, world, "s", "v")
    r = await client.put(f"{maps(world)}/K", json={"secret_name": "s", "pinned": 1}, headers=world.member)
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "pinned"'
    assert (await client.get(maps(world), headers=world.member)).json()["bindings"] == []


async def test_token_bodies_refuse_unknown_fields_but_a_malformed_body_is_the_default(client, world):
    await secret(client, world, "s", "v")
    url = f"/v1/projects/{world.project_id}/secrets:issue-token"
    r = await client.post(url, json={"ttl": 90}, headers=world.member)
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "ttl"'
    r = await client.post(url, content=b"{not json", headers=world.member)
    assert r.status_code == 200 and r.json()["ttl_seconds"] == 300


def test_the_request_models_carry_the_spec_rules():
    with pytest.raises(BadRequest, match="65536"):
        SecretWrite(name="k", value="x" * 65537)
    assert SecretIssueToken.parse({"ttl_seconds": 99999}).ttl_seconds == 3600
    assert SecretIssueToken().ttl_seconds == 300
    assert BindingPut.parse({"secret_name": "s", "version": "latest"}).version is None
    assert BindingPut.parse({"secret_name": "s", "version": "3"}).version == 3
    with pytest.raises(BadRequest, match="positive integer"):
        BindingPut.parse({"secret_name": "s", "version": 0})
    # a malformed reveal body reveals the current version: nothing in it is refused
    assert SecretReveal.parse({"version": "x", "reason": 5, "other": True}) == SecretReveal(version=0, reason="")
    assert SecretReveal.parse({"version": "2", "reason": "audit"}).version == 2
