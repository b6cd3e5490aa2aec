"""Project secret routes over HTTP (in-memory platform)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select

from caiplatform.db.models import AuditEntry
from caiplatform.ports.secrets import STORE_UNAVAILABLE_MESSAGE, STORE_UNCONFIGURED_MESSAGE, StoreHealth

pytestmark = pytest.mark.anyio


def base(world) -> str:
    return f"/v1/projects/{world.project_id}/secrets"


async def create(client, world, name="api-key", value="s3cr3t-value", headers=None):
    return await client.post(base(world), json={"name": name, "value": value}, headers=headers or world.member)


async def audit_rows(platform, project_id):
    return await platform.db.run(
        lambda s: [
            (r.action, r.target, r.detail, r.actor)
            for r in s.scalars(select(AuditEntry).where(AuditEntry.project_id == project_id).order_by(AuditEntry.id))
        ]
    )


async def test_create_then_rotate(client, world, platform):
    r = await create(client, world)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "api-key" and body["version"] == 1 and body["created"] is True and body["note"]
    r = await create(client, world, value="second")
    assert r.status_code == 200
    assert r.json()["version"] == 2 and r.json()["created"] is False
    actions = [a for a, *_ in await audit_rows(platform, world.project_id)]
    assert actions == ["project.secret.write", "project.secret.write"]


async def test_list_has_no_versions_and_no_values(client, world):
    await create(client, world, "b-secret", "value-b")
    await create(client, world, "a-secret", "value-a")
    await create(client, world, "a-secret", "value-a2")
    r = await client.get(base(world), headers=world.member)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"secrets", "path_prefix", "next_page_token"}
    assert world.project_id in body["path_prefix"]
    assert [s["name"] for s in body["secrets"]] == ["a-secret", "b-secret"]
    for item in body["secrets"]:
        assert set(item) == {"name", "current_version", "created_at", "updated_at"}
        assert item["created_at"].endswith("Z")
    assert body["secrets"][0]["current_version"] == 2
    assert "value-a" not in r.text


async def test_list_paginates(client, world):
    for i in range(3):
        await create(client, world, f"s{i}", "v")
    r = await client.get(base(world), params={"page_size": 2}, headers=world.member)
    assert [s["name"] for s in r.json()["secrets"]] == ["s0", "s1"]
    token = r.json()["next_page_token"]
    r = await client.get(base(world), params={"page_size": 2, "page_token": token}, headers=world.member)
    assert [s["name"] for s in r.json()["secrets"]] == ["s2"] and r.json()["next_page_token"] == ""
    r = await client.get(base(world), params={"page_size": 201}, headers=world.member)
    assert r.status_code == 400


async def test_secret_object_and_versions(client, world):
    await create(client, world, "db", "one")
    await create(client, world, "db", "two")
    r = await client.get(f"{base(world)}/db", headers=world.member)
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == "db" and body["current_version"] == 2
    assert [v["version"] for v in body["versions"]] == [1, 2]
    assert all(v["destroyed"] is False and v["created_at"] for v in body["versions"])
    assert "used_by" not in body  # absent, not empty, when unbound
    assert "one" not in r.text and "two" not in r.text
    r = await client.get(f"{base(world)}/db/versions", headers=world.member)
    assert r.status_code == 200
    assert set(r.json()) == {"name", "current_version", "versions"} and r.json()["current_version"] == 2
    assert (await client.get(f"{base(world)}/nope", headers=world.member)).status_code == 404
    assert (await client.get(f"{base(world)}/nope/versions", headers=world.member)).status_code == 404


@pytest.mark.parametrize(
    "name", ["", "-leading", "has space", "x" * 64, "dot.ted", "ünï"]
)
async def test_bad_names_are_400(client, world, name):
    r = await client.post(base(world), json={"name": name, "value": "v"}, headers=world.member)
    assert r.status_code == 400
    assert "name" in r.json()["error"]


async def test_name_limits(client, world):
    assert (await create(client, world, "x" * 63)).status_code == 201
    assert (await create(client, world, "A_b-9")).status_code == 201


async def test_value_rules(client, world):
    r = await client.post(base(world), json={"name": "v"}, headers=world.member)
    assert r.status_code == 400 and "value" in r.json()["error"]
    assert (await create(client, world, "v", "")).status_code == 400
    assert (await client.post(base(world), json={"name": "v", "value": 5}, headers=world.member)).status_code == 400
    assert (await create(client, world, "v", "x" * 65536)).status_code == 201
    r = await create(client, world, "v", "x" * 65537)
    assert r.status_code == 400 and "65536" in r.json()["error"]
    # multi-byte characters count in bytes
    assert (await create(client, world, "v", "é" * 32769)).status_code == 400


async def test_create_body_is_capped_at_128_kib(client, world):
    r = await create(client, world, "big", "x" * (129 * 1024))
    assert r.status_code == 413
    assert r.json()["error"] and r.json()["request_id"]


@pytest.mark.parametrize("name", ["crusoe-cloud-credential", "platform-cloud-credential"])
async def test_reserved_name_points_at_the_cloud_credential_routes(client, world, name):
    for r in (
        await create(client, world, name),
        await client.get(f"{base(world)}/{name}", headers=world.member),
        await client.post(f"{base(world)}/{name}:reveal", headers=world.admin),
    ):
        assert r.status_code == 404
        assert "reserved platform name" in r.json()["error"]
        assert "platform-cloud" in r.json()["error"]


async def test_delete_needs_project_admin_and_destroys_every_version(client, world, platform):
    await create(client, world, "gone", "a")
    await create(client, world, "gone", "b")
    r = await client.delete(f"{base(world)}/gone", headers=world.member)
    assert r.status_code == 403 and r.json()["error"] == "this action requires the project admin role"
    r = await client.delete(f"{base(world)}/gone", headers=world.admin)
    assert r.status_code == 200
    assert r.json()["name"] == "gone" and r.json()["deleted"] is True and r.json()["note"]
    assert (await client.get(f"{base(world)}/gone", headers=world.member)).status_code == 404
    assert (await client.delete(f"{base(world)}/gone", headers=world.admin)).status_code == 404
    # the name starts over at version 1
    assert (await create(client, world, "gone", "c")).status_code == 201
    assert ("project.secret.delete", "gone") in [(a, t) for a, t, *_ in await audit_rows(platform, world.project_id)]


async def test_reveal(client, world, platform):
    await create(client, world, "tok", "first-value")
    await create(client, world, "tok", "second-value")
    url = f"{base(world)}/tok:reveal"
    r = await client.post(url, headers=world.member)
    assert r.status_code == 403 and r.json()["error"] == "this action requires the project admin role"
    r = await client.post(url, headers=world.admin)
    assert r.status_code == 200
    assert r.json()["name"] == "tok" and r.json()["version"] == 2 and r.json()["value"] == "second-value"
    assert r.json()["note"]
    r = await client.post(url, json={"version": 1, "reason": "incident 42"}, headers=world.admin)
    assert (r.json()["version"], r.json()["value"]) == (1, "first-value")
    r = await client.post(url, json={"version": 0}, headers=world.admin)
    assert r.json()["version"] == 2
    r = await client.post(url, json={"version": "1"}, headers=world.admin)
    assert r.json()["version"] == 1
    r = await client.post(url, json={"version": "x"}, headers=world.admin)
    assert r.json()["version"] == 2
    # a malformed body reveals the current version
    r = await client.post(url, content=b"{not json", headers={**world.admin, "content-type": "application/json"})
    assert r.status_code == 200 and r.json()["version"] == 2
    r = await client.post(url, json={"version": 9}, headers=world.admin)
    assert r.status_code == 400 and r.json()["error"] == "tok has no version 9 (current is 2)"
    rows = [(a, t, d) for a, t, d, _ in await audit_rows(platform, world.project_id) if a == "project.secret.reveal"]
    assert len(rows) == 6
    assert "incident 42" in rows[1][2]
    assert all("value" not in d for *_, d in rows)


async def test_reveal_fails_closed_when_the_audit_cannot_be_written(client, world, platform, monkeypatch):
    await create(client, world, "tok", "never-shown")

    def broken(*args, **kwargs):
        raise RuntimeError("audit table is gone")

    monkeypatch.setattr(platform.secrets.audit, "record_strict", broken)
    r = await client.post(f"{base(world)}/tok:reveal", headers=world.admin)
    assert r.status_code == 503
    assert "audit" in r.json()["error"]
    assert "never-shown" not in r.text


async def test_issue_token_for_one_secret(client, world, platform):
    await create(client, world, "one", "v1")
    r = await client.post(f"{base(world)}/one:issue-token", headers=world.member)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"token", "ttl_seconds", "read", "note"}
    assert body["ttl_seconds"] == 300
    assert set(body["read"]) == {"addr", "path"} and body["read"]["path"].endswith("/one")
    r = await client.post(f"{base(world)}/one:issue-token", json={"ttl_seconds": 99999}, headers=world.member)
    assert r.json()["ttl_seconds"] == 3600
    r = await client.post(f"{base(world)}/one:issue-token", json={"ttl_seconds": 60}, headers=world.member)
    assert r.json()["ttl_seconds"] == 60
    # a workload key may not use the name-scoped form, even for its own project
    r = await client.post(f"{base(world)}/one:issue-token", headers=world.workload)
    assert r.status_code == 404
    assert (await client.post(f"{base(world)}/absent:issue-token", headers=world.member)).status_code == 404
    rows = [a for a, *_ in await audit_rows(platform, world.project_id)]
    assert rows.count("project.secret.issue-token") == 3


async def test_issue_project_token(client, world, platform):
    await create(client, world, "a", "A")
    url = f"/v1/projects/{world.project_id}/secrets:issue-token"
    r = await client.post(url, headers=world.member)
    assert r.status_code == 200 and r.json()["read"]["path"].endswith("/")
    r = await client.post(url, json={"ttl_seconds": 120}, headers=world.workload)
    assert r.status_code == 200 and r.json()["ttl_seconds"] == 120
    # the token reads directly from the store the response names
    token = r.json()
    backend = platform.secrets.backend
    value = await backend.read_with_token(token["token"], token["read"]["path"] + "a")
    assert value.value == "A"
    # another project's workload key, or a workload key on another route
    assert (await client.post(url, headers=world.other_workload)).status_code == 404
    assert (await client.post(url, headers=world.outsider)).status_code == 404
    assert (await client.post(url)).status_code == 401
    r = await client.get(base(world), headers=world.workload)
    assert r.status_code == 403 and "only mint a read token" in r.json()["error"]
    assert (await client.post(base(world), json={"name": "x", "value": "y"}, headers=world.workload)).status_code == 403


async def test_unknown_verbs_are_404_naming_the_supported_ones(client, world):
    await create(client, world, "s", "v")
    r = await client.post(f"{base(world)}/s:destroy", headers=world.admin)
    assert r.status_code == 404
    assert ":reveal" in r.json()["error"] and ":issue-token" in r.json()["error"]
    r = await client.post(f"/v1/projects/{world.project_id}/secrets:reveal", headers=world.admin)
    assert r.status_code == 404 and ":issue-token" in r.json()["error"]


async def test_access_rules(client, world):
    await create(client, world, "s", "v")
    assert (await client.get(base(world))).status_code == 401
    assert (await client.get(base(world), headers=world.outsider)).status_code == 404
    assert (await client.get(f"{base(world)}/s", headers=world.outsider)).status_code == 404
    assert (await client.get("/v1/projects/not-a-uuid/secrets", headers=world.member)).status_code == 400
    # a member of one project sees nothing of another
    other = f"/v1/projects/{world.other_project_id}/secrets"
    assert (await client.get(other, headers=world.member)).status_code == 404


async def test_projects_are_isolated(client, world):
    await create(client, world, "shared-name", "mine", headers=world.admin)
    r = await client.post(
        f"/v1/projects/{world.other_project_id}/secrets", json={"name": "shared-name", "value": "theirs"},
        headers=world.admin,
    )
    assert r.status_code == 201
    r = await client.post(f"{base(world)}/shared-name:reveal", headers=world.admin)
    assert r.json()["value"] == "mine"


async def test_store_health_gives_two_distinct_503s(client, world, platform):
    await create(client, world, "s", "v")
    backend = platform.secrets.backend
    backend.set_health(StoreHealth.UNCONFIGURED)
    r1 = await client.get(base(world), headers=world.member)
    backend.set_health(StoreHealth.SEALED)
    r2 = await client.get(base(world), headers=world.member)
    r3 = await create(client, world, "s", "w")
    backend.set_health(StoreHealth.UNREACHABLE)
    r4 = await client.get(f"{base(world)}/s", headers=world.member)
    assert [r.status_code for r in (r1, r2, r3, r4)] == [503] * 4
    assert r1.json()["error"] == STORE_UNCONFIGURED_MESSAGE
    assert r2.json()["error"] == r3.json()["error"] == r4.json()["error"] == STORE_UNAVAILABLE_MESSAGE
    assert r1.json()["error"] != r2.json()["error"]
    backend.set_health(StoreHealth.OK)
    assert (await client.get(base(world), headers=world.member)).status_code == 200


async def test_values_never_appear_in_reads_audit_or_logs(client, world, platform, caplog):
    caplog.set_level(logging.DEBUG)
    value = "VALUE-that-must-never-leak-7f3a"
    await create(client, world, "leaky", value)
    await create(client, world, "leaky", value + "-2")
    agent = platform.secrets.agents.add_agent(world.project_id, "helper")
    texts = []
    texts.append((await client.get(base(world), headers=world.member)).text)
    texts.append((await client.get(f"{base(world)}/leaky", headers=world.member)).text)
    texts.append((await client.get(f"{base(world)}/leaky/versions", headers=world.member)).text)
    pm = f"/v1/projects/{world.project_id}/agents/{agent.name}/secret-maps"
    texts.append((await client.put(f"{pm}/LEAKY", json={"secret_name": "leaky"}, headers=world.member)).text)
    texts.append((await client.post(f"{pm}:apply", headers=world.member)).text)
    texts.append((await client.get(f"/v1/projects/{world.project_id}/secret-maps", headers=world.member)).text)
    texts.append((await client.post(f"{base(world)}/leaky:issue-token", headers=world.member)).text)
    texts.extend(str(row) for row in await audit_rows(platform, world.project_id))
    texts.extend(record.getMessage() for record in caplog.records)
    assert texts and not any(value in t for t in texts)
    # ... yet apply really delivered it, and reveal really shows it
    assert platform.secrets.agents.secret_of(agent) == {"LEAKY": value + "-2"}
    assert (await client.post(f"{base(world)}/leaky:reveal", headers=world.admin)).json()["value"] == value + "-2"
