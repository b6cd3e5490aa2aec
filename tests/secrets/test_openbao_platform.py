"""The secret routes against a real OpenBao: tokens, workload reads, sealed and stopped stores, PostgreSQL."""

from __future__ import annotations

import secrets

import httpx
import hvac
import pytest
import sqlalchemy as sa

from caiplatform import workload
from caiplatform.adapters.openbao.secrets import OpenBaoSecretBackend
from caiplatform.db import Database
from caiplatform.db.models.secrets import SecretBinding
from caiplatform.ports.secrets import (
    STORE_UNAVAILABLE_MESSAGE,
    STORE_UNCONFIGURED_MESSAGE,
    UnconfiguredSecretBackend,
)
from caiplatform.testing import engines

pytestmark = pytest.mark.anyio


def _use(platform, addr: str, token: str) -> OpenBaoSecretBackend:
    backend = OpenBaoSecretBackend(addr, token, prefix=f"cai-http-{secrets.token_hex(5)}/projects")
    platform.secrets.set_backend(backend)
    return backend


class Routed(httpx.AsyncBaseTransport):
    """The platform in-process (ASGI), everything else (the store) over real HTTP."""

    def __init__(self, app_transport: httpx.AsyncBaseTransport):
        self.app = app_transport
        self.real = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "testserver":
            return await self.app.handle_async_request(request)
        return await self.real.handle_async_request(request)


async def test_routes_and_workload_reads_against_openbao(client, world, platform, openbao):
    _use(platform, openbao.addr, openbao.root_token)
    base = f"/v1/projects/{world.project_id}/secrets"
    assert (await client.post(base, json={"name": "db", "value": "v1"}, headers=world.member)).status_code == 201
    assert (await client.post(base, json={"name": "db", "value": "v2"}, headers=world.member)).status_code == 200
    await client.post(base, json={"name": "other", "value": "o"}, headers=world.member)
    listed = (await client.get(base, headers=world.member)).json()
    assert [s["name"] for s in listed["secrets"]] == ["db", "other"]
    assert listed["path_prefix"].startswith("secret/data/")
    assert (await client.post(f"{base}/db:reveal", json={"version": 1}, headers=world.admin)).json()["value"] == "v1"

    # a name-scoped token reads its secret from OpenBao directly, and nothing else
    tok = (await client.post(f"{base}/db:issue-token", json={"ttl_seconds": 9999}, headers=world.member)).json()
    assert tok["ttl_seconds"] == 3600 and tok["read"]["addr"] == openbao.addr
    bao = hvac.Client(url=tok["read"]["addr"], token=tok["token"])
    assert bao.adapter.get(f"/v1/{tok['read']['path']}")["data"]["data"]["value"] == "v2"
    with pytest.raises(hvac.exceptions.Forbidden):
        bao.adapter.get(f"/v1/{listed['path_prefix']}other")

    # the workload helper with the project's workload key, as a deployed workload would
    transport = Routed(client._transport)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        config = workload.WorkloadConfig(
            api_url="http://testserver", project_id=world.project_id,
            project_key=world.workload["Authorization"].removeprefix("Bearer "), ttl_seconds=120,
        )
        async with workload.ainvocation(config, client=http) as reader:
            assert await workload.aget_secret("db") == "v2"
            assert await workload.aget_secret("other") == "o"
            assert await workload.aget_secret("db", 1) == "v1"
            assert reader.tokens_minted == 1


async def test_sealed_and_stopped_openbao_give_the_503s(client, world, platform, agents):
    server = engines.start_openbao_dev()
    try:
        _use(platform, server.addr, server.root_token)
        base = f"/v1/projects/{world.project_id}/secrets"
        assert (await client.post(base, json={"name": "s", "value": "v"}, headers=world.member)).status_code == 201
        helper = agents.add_agent(world.project_id, "helper")
        maps = f"/v1/projects/{world.project_id}/agents/helper/secret-maps"
        await client.put(f"{maps}/S", json={"secret_name": "s"}, headers=world.member)
        assert (await client.post(f"{maps}:apply", headers=world.member)).status_code == 200
        assert agents.secret_of(helper) == {"S": "v"}

        hvac.Client(url=server.addr, token=server.root_token).sys.seal()
        sealed = await client.get(base, headers=world.member)
        assert sealed.status_code == 503 and sealed.json()["error"] == STORE_UNAVAILABLE_MESSAGE
        # unbinding still revokes while the store is sealed
        r = await client.delete(f"{maps}/S", headers=world.member)
        assert r.status_code == 200 and r.json()["revoked"] is True
        assert agents.secret_of(helper) == {}

        server.stop()
        stopped = await client.get(f"{base}/s", headers=world.member)
        assert stopped.status_code == 503 and stopped.json()["error"] == STORE_UNAVAILABLE_MESSAGE

        platform.secrets.set_backend(UnconfiguredSecretBackend())
        unconfigured = await client.get(base, headers=world.member)
        assert unconfigured.status_code == 503 and unconfigured.json()["error"] == STORE_UNCONFIGURED_MESSAGE
        assert STORE_UNCONFIGURED_MESSAGE != STORE_UNAVAILABLE_MESSAGE
    finally:
        server.stop()


async def test_token_minting_unsupported_is_501(client, world, platform, openbao):
    root = hvac.Client(url=openbao.addr, token=openbao.root_token)
    prefix = f"cai-http-{secrets.token_hex(5)}/projects"
    policy = f"kv-only-{secrets.token_hex(4)}"
    root.sys.create_or_update_policy(
        policy,
        f'path "secret/data/{prefix}/*" {{ capabilities = ["create", "read", "update"] }}\n'
        f'path "secret/metadata/{prefix}/*" {{ capabilities = ["read", "list", "update"] }}\n',
    )
    limited = root.auth.token.create(policies=[policy], ttl="10m")["auth"]["client_token"]
    platform.secrets.set_backend(OpenBaoSecretBackend(openbao.addr, limited, prefix=prefix))
    base = f"/v1/projects/{world.project_id}/secrets"
    assert (await client.post(base, json={"name": "s", "value": "v"}, headers=world.member)).status_code == 201
    r = await client.post(f"{base}/s:issue-token", headers=world.member)
    assert r.status_code == 501 and "cannot mint" in r.json()["error"]


def test_postgres_refuses_reserved_env_names(postgres_url):
    # The tables as the models declare them (tests/foundation/test_migrations keeps migrations in step),
    # in a database of this test's own.
    from caiplatform.db.base import Base
    from caiplatform.db.models import Org, Project

    with engines.fresh_postgres_database() as url:
        _check_reserved_on(url, Base, Org, Project)


def _check_reserved_on(url, Base, Org, Project):
    db = Database(url)
    try:
        Base.metadata.create_all(db.engine, tables=[Org.__table__, Project.__table__, SecretBinding.__table__])
        with pytest.raises(sa.exc.IntegrityError) as refused:
            db.run_sync(lambda s: s.execute(sa.text(
                "INSERT INTO secret_bindings (id, project_id, agent_id, agent_slug, env_name, secret_name, "
                "created_at, updated_at) VALUES ('x', 'p', 'a', 'a', 'LD_PRELOAD', 's', now(), now())"
            )))
        assert "ck_secret_bindings_env_not_reserved" in str(refused.value)
        # the same row with an allowed name fails only on the project foreign key, not on the check
        with pytest.raises(sa.exc.IntegrityError) as info:
            db.run_sync(lambda s: s.execute(sa.text(
                "INSERT INTO secret_bindings (id, project_id, agent_id, agent_slug, env_name, secret_name, "
                "created_at, updated_at) VALUES ('x', 'p', 'a', 'a', 'MY_KEY', 's', now(), now())"
            )))
        assert "fk_secret_bindings_project_id_projects" in str(info.value)
        assert SecretBinding.__tablename__ == "secret_bindings"
    finally:
        db.dispose()
