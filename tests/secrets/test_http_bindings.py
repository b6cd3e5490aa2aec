"""Bindings over HTTP: the four checks, reserved names (API and database), put/list/unbind/apply."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from caiplatform.db.models import AuditEntry
from caiplatform.db.models.secrets import RESERVED_ENV_NAMES, SecretBinding
from caiplatform.ports.secrets import StoreHealth

pytestmark = pytest.mark.anyio


def maps(world, agent="helper") -> str:
    return f"/v1/projects/{world.project_id}/agents/{agent}/secret-maps"


async def secret(client, world, name, value):
    r = await client.post(f"/v1/projects/{world.project_id}/secrets", json={"name": name, "value": value},
                          headers=world.member)
    assert r.status_code in (200, 201), r.text


@pytest.fixture
def helper(agents, world):
    return agents.add_agent(world.project_id, "helper")


async def actions(platform, project_id):
    return await platform.db.run(
        lambda s: [(r.action, r.target) for r in s.scalars(
            select(AuditEntry).where(AuditEntry.project_id == project_id).order_by(AuditEntry.id))]
    )


async def test_bind_track_newest_and_pinned(client, world, helper, platform):
    await secret(client, world, "db-pass", "one")
    await secret(client, world, "db-pass", "two")
    r = await client.put(f"{maps(world)}/DB_PASSWORD", json={"secret_name": "db-pass"}, headers=world.member)
    assert r.status_code == 200, r.text
    b = r.json()["binding"]
    assert r.json()["note"]
    assert b["env_name"] == "DB_PASSWORD" and b["secret_name"] == "db-pass" and b["pinned_to"] == "latest"
    assert b["agent_id"] == helper.id and b["agent_slug"] == "helper" and "version" not in b
    assert b["id"] and b["created_at"] and b["updated_at"]
    r = await client.put(f"{maps(world)}/OLD_PASSWORD", json={"secret_name": "db-pass", "version": 1},
                         headers=world.member)
    assert r.json()["binding"]["pinned_to"] == "1" and r.json()["binding"]["version"] == 1
    # re-putting updates in place
    r2 = await client.put(f"{maps(world)}/DB_PASSWORD", json={"secret_name": "db-pass", "version": None},
                          headers=world.member)
    assert r2.json()["binding"]["id"] == b["id"]
    # used_by on the secret object; version omitted when tracking the newest
    obj = (await client.get(f"/v1/projects/{world.project_id}/secrets/db-pass", headers=world.member)).json()
    used = {u["env_name"]: u for u in obj["used_by"]}
    assert set(used) == {"DB_PASSWORD", "OLD_PASSWORD"}
    assert "version" not in used["DB_PASSWORD"] and used["OLD_PASSWORD"]["version"] == 1
    assert set(used["DB_PASSWORD"]) == {"id", "agent_id", "agent_slug", "env_name", "created_at", "updated_at"}
    # lists
    r = await client.get(maps(world), headers=world.member)
    assert r.json()["agent"] == "helper"
    assert [x["env_name"] for x in r.json()["bindings"]] == ["DB_PASSWORD", "OLD_PASSWORD"]
    r = await client.get(f"/v1/projects/{world.project_id}/secret-maps", headers=world.member)
    assert set(r.json()) == {"bindings", "next_page_token"} and len(r.json()["bindings"]) == 2
    assert [a for a, _ in await actions(platform, world.project_id)].count("project.secret.bind") == 3


async def test_checks_come_in_the_spec_order(client, world, helper, platform):
    await secret(client, world, "s", "v1")
    await secret(client, world, "s", "v2")
    await platform.secrets.backend.destroy_versions(world.project_id, "s", [1])

    async def put(env, body):
        r = await client.put(f"{maps(world)}/{env}", json=body, headers=world.member)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    # (1) before (2): bad env name and missing secret → the env name error, listing reserved names
    e = await put("1BAD", {"secret_name": "missing"})
    assert "^[A-Za-z_][A-Za-z0-9_]*$" in e and "MODEL_API_KEY" in e and "PYTHONPATH" in e
    e = await put("PATH", {"secret_name": "missing"})
    assert "reserved" in e and "LD_PRELOAD" in e
    # (2) before (3)
    e = await put("OK_NAME", {"secret_name": "missing", "version": 7})
    assert e == "secret missing does not exist in this project"
    # (3) before (4)
    e = await put("OK_NAME", {"secret_name": "s", "version": 9})
    assert e == "s has no version 9 (current is 2)"
    # (4)
    e = await put("OK_NAME", {"secret_name": "s", "version": 1})
    assert "destroyed" in e
    # a version must be a positive integer
    await put("OK_NAME", {"secret_name": "s", "version": "abc"})
    await put("OK_NAME", {"secret_name": "s", "version": 0})
    # a version given as a digit string is accepted
    r = await client.put(f"{maps(world)}/OK_NAME", json={"secret_name": "s", "version": "2"}, headers=world.member)
    assert r.status_code == 200 and r.json()["binding"]["pinned_to"] == "2"


@pytest.mark.parametrize("env", RESERVED_ENV_NAMES)
async def test_every_reserved_env_name_is_refused(client, world, helper, env):
    await secret(client, world, "s", "v")
    r = await client.put(f"{maps(world)}/{env}", json={"secret_name": "s"}, headers=world.member)
    assert r.status_code == 400 and env in r.json()["error"]


def test_nineteen_reserved_names():
    assert len(set(RESERVED_ENV_NAMES)) == 19


async def test_database_refuses_reserved_env_names(platform, world):
    def insert(session):
        session.add(SecretBinding(
            project_id=world.project_id, agent_id="a", agent_slug="a", env_name="BAO_TOKEN", secret_name="s",
            created_at=platform.clock.now(), updated_at=platform.clock.now(),
        ))

    with pytest.raises(sa.exc.IntegrityError):
        await platform.db.run(insert)


async def test_binding_needs_an_agent_and_a_body(client, world, helper):
    await secret(client, world, "s", "v")
    r = await client.put(f"{maps(world, 'nobody')}/X", json={"secret_name": "s"}, headers=world.member)
    assert r.status_code == 404 and r.json()["error"] == "unknown agent: nobody"
    r = await client.put(f"{maps(world)}/X", json={}, headers=world.member)
    assert r.status_code == 400 and "secret_name" in r.json()["error"]
    r = await client.put(f"{maps(world)}/X", content=b"x" * (8 * 1024 + 1), headers=world.member)
    assert r.status_code == 413
    assert (await client.get(maps(world, "nobody"), headers=world.member)).status_code == 404
    assert (await client.put(f"{maps(world)}/X", json={"secret_name": "s"}, headers=world.outsider)).status_code == 404


async def test_deleting_a_bound_secret_is_409(client, world, helper):
    await secret(client, world, "db-pass", "v")
    await client.put(f"{maps(world)}/DB_PASSWORD", json={"secret_name": "db-pass"}, headers=world.member)
    r = await client.delete(f"/v1/projects/{world.project_id}/secrets/db-pass", headers=world.admin)
    assert r.status_code == 409
    assert r.json()["error"].startswith("db-pass is still bound by 1 binding(s): helper/DB_PASSWORD")
    await client.delete(f"{maps(world)}/DB_PASSWORD", headers=world.member)
    r = await client.delete(f"/v1/projects/{world.project_id}/secrets/db-pass", headers=world.admin)
    assert r.status_code == 200


async def test_apply_writes_everything_and_rolls_a_revision(client, world, helper, agents, platform):
    await secret(client, world, "a", "A1")
    await secret(client, world, "a", "A2")
    await secret(client, world, "b", "B1")
    await client.put(f"{maps(world)}/A_NEW", json={"secret_name": "a"}, headers=world.member)
    await client.put(f"{maps(world)}/A_OLD", json={"secret_name": "a", "version": 1}, headers=world.member)
    await client.put(f"{maps(world)}/B", json={"secret_name": "b"}, headers=world.member)
    r = await client.post(f"{maps(world)}:apply", headers=world.member)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["agent"] == "helper" and body["revision_rolled"] is True and body["note"]
    assert body["applied"] == [
        {"env_name": "A_NEW", "secret_name": "a", "version": 2, "applied": True},
        {"env_name": "A_OLD", "secret_name": "a", "version": 1, "applied": True},
        {"env_name": "B", "secret_name": "b", "version": 1, "applied": True},
    ]
    assert agents.secret_of(helper) == {"A_NEW": "A2", "A_OLD": "A1", "B": "B1"}
    assert agents.revisions_of(helper) == 1
    # each read audited
    assert [a for a, _ in await actions(platform, world.project_id)].count("project.secret.apply") == 3
    # a rotation reaches the agent only on the next apply
    await secret(client, world, "a", "A3")
    assert agents.secret_of(helper)["A_NEW"] == "A2"
    await client.post(f"{maps(world)}:apply", headers=world.member)
    assert agents.secret_of(helper)["A_NEW"] == "A3"


async def test_apply_is_all_or_nothing_with_424(client, world, helper, agents, platform):
    await secret(client, world, "good", "GOOD-VALUE-xyz")
    await secret(client, world, "bad", "x1")
    await secret(client, world, "bad", "x2")
    await client.put(f"{maps(world)}/GOOD", json={"secret_name": "good"}, headers=world.member)
    await client.put(f"{maps(world)}/BAD", json={"secret_name": "bad", "version": 1}, headers=world.member)
    await platform.secrets.backend.destroy_versions(world.project_id, "bad", [1])
    r = await client.post(f"{maps(world)}:apply", headers=world.member)
    assert r.status_code == 424
    body = r.json()
    assert body["error"] and body["request_id"]
    rows = {row["env_name"]: row for row in body["applied"]}
    assert all(row["applied"] is False for row in rows.values())
    assert "error" in rows["BAD"] and "error" not in rows["GOOD"]
    assert agents.secret_of(helper) == {} and agents.revisions_of(helper) == 0
    assert "GOOD-VALUE-xyz" not in r.text


async def test_apply_with_the_store_sealed_is_424_and_writes_nothing(client, world, helper, agents, platform):
    await secret(client, world, "s", "v")
    await client.put(f"{maps(world)}/S", json={"secret_name": "s"}, headers=world.member)
    platform.secrets.backend.set_health(StoreHealth.SEALED)
    r = await client.post(f"{maps(world)}:apply", headers=world.member)
    assert r.status_code == 424 and "sealed" in r.json()["applied"][0]["error"]
    assert agents.secret_of(helper) == {}


async def test_apply_with_no_bindings_changes_nothing(client, world, helper, agents):
    r = await client.post(f"{maps(world)}:apply", headers=world.member)
    assert r.status_code == 200
    assert r.json()["applied"] == [] and r.json()["revision_rolled"] is False
    assert agents.log == []
    r = await client.post(f"{maps(world)}:sync", headers=world.member)
    assert r.status_code == 404 and ":apply" in r.json()["error"]


async def test_unbind_revokes_immediately_even_while_sealed(client, world, helper, agents, platform):
    await secret(client, world, "s", "v")
    await client.put(f"{maps(world)}/TOKEN", json={"secret_name": "s"}, headers=world.member)
    await client.put(f"{maps(world)}/KEEP", json={"secret_name": "s"}, headers=world.member)
    await client.post(f"{maps(world)}:apply", headers=world.member)
    assert agents.secret_of(helper) == {"TOKEN": "v", "KEEP": "v"}
    platform.secrets.backend.set_health(StoreHealth.SEALED)
    r = await client.delete(f"{maps(world)}/TOKEN", headers=world.member)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "agent": "helper", "env_name": "TOKEN", "deleted": True, "revoked": True, "revision_rolled": True,
        "note": r.json()["note"],
    }
    assert agents.secret_of(helper) == {"KEEP": "v"}
    assert agents.revisions_of(helper) == 2
    assert [x["env_name"] for x in (await client.get(maps(world), headers=world.member)).json()["bindings"]] == ["KEEP"]
    assert (await client.delete(f"{maps(world)}/TOKEN", headers=world.member)).status_code == 404
    assert ("project.secret.unbind", "helper/TOKEN") in await actions(platform, world.project_id)


async def test_unbind_that_cannot_revoke_says_to_rotate(client, world, helper, agents):
    await secret(client, world, "s", "v")
    await client.put(f"{maps(world)}/TOKEN", json={"secret_name": "s"}, headers=world.member)
    agents.fail_next("remove")
    r = await client.delete(f"{maps(world)}/TOKEN", headers=world.member)
    assert r.status_code == 200
    body = r.json()
    assert body["deleted"] is True and body["revoked"] is False and body["revision_rolled"] is False
    assert "exposed" in body["note"] and "rotate" in body["note"]
    assert (await client.get(maps(world), headers=world.member)).json()["bindings"] == []
