"""The flat route table (`caiplatform_server.dispatch`): the routes it answers itself, and for every kind of
request the same answer as FastAPI gives with the table switched off."""

from __future__ import annotations

import pytest

from caiplatform.errors import Unavailable
from caiplatform.testing.http import asgi_client, login
from caiplatform_server.app import create_app
from caiplatform_server.dispatch import RouteTable, group_of
from tests.agents.agents_support import FUNCTION, deploy, wait_settled


def test_the_hot_reads_are_direct(platform):
    table = create_app(platform, manage_lifecycle=False).routes  # type: ignore[attr-defined]
    groups = table._build()
    direct = {entry.route.path_format for entries in groups.values() for entry in entries if entry.endpoint}
    # If FastAPI changes what a route's handler looks like, these silently go back to FastAPI's routing.
    assert {"/v1/auth/me", "/v1/agents/{name}"} <= direct
    # A route that needs FastAPI (dependencies, a body) is never called by the table.
    assert "/v1/agents/{name}/env" not in direct and "/v1/auth/login" not in direct
    assert group_of("/v1/agents/bot/logs") == "/v1/agents" and group_of("/healthz") == "/healthz"


def _requests(token: dict[str, str]) -> list[tuple[str, str, dict[str, str]]]:
    other = {"Authorization": "Bearer not-a-token"}
    return [
        ("GET", "/v1/auth/me", token), ("GET", "/v1/auth/me", {}), ("GET", "/v1/auth/me", other),
        ("HEAD", "/v1/auth/me", token), ("POST", "/v1/auth/me", token), ("GET", "/v1/auth/me/", token),
        ("GET", "/v1/agents/bot", token), ("GET", "/v1/agents/bot?project=default", token),
        ("GET", "/v1/agents/bot?project=nope", token), ("GET", "/v1/agents/nope", token),
        ("GET", "/v1/agents/Not_A_Name", token), ("GET", "/v1/agents/bot", {}), ("PATCH", "/v1/agents/bot", token),
        ("GET", "/v1/agents/bot/env", token), ("GET", "/v1/agents", token), ("GET", "/healthz", {}),
        ("GET", "/openapi.json", {}), ("GET", "/docs", {}), ("GET", "/v1/embed/widget-1.js", {}),
        ("GET", "/v1/no-such-thing", token), ("GET", "/", {}), ("DELETE", "/v1/auth/login", {}),
    ]


def _off(self, scope):
    return None  # every request to FastAPI


async def _answers(client, requests) -> list[tuple[int, dict[str, str], object]]:
    out = []
    for n, (method, path, headers) in enumerate(requests):
        response = await client.request(method, path, headers={**headers, "X-Request-Id": f"same-{n}"})
        # The health body counts things that change between two calls (its length with them).
        varies = path == "/healthz"
        kept = {k: v for k, v in response.headers.items() if k != "date" and not (varies and k == "content-length")}
        out.append((response.status_code, kept, sorted(response.json()) if varies else response.content))
    return out


async def test_every_answer_is_the_one_fastapi_gives(platform, monkeypatch):
    async with asgi_client(platform) as client:
        token = await login(client)
        assert (await deploy(client, token, "bot", FUNCTION, framework="function")).status_code == 202
        await wait_settled(client, token, "bot")  # the view no longer changes between the runs
        requests = _requests(token)
        with_table = await _answers(client, requests)
        calls = []
        real = RouteTable.find

        def counted(self, scope):
            found = real(self, scope)
            calls.append(found is not None)
            return found

        monkeypatch.setattr(RouteTable, "find", counted)
        await _answers(client, requests)
        assert sum(calls) >= 10, "the table answered none of the direct routes"
        monkeypatch.setattr(RouteTable, "find", _off)
        without = await _answers(client, requests)
    for request, got, expected in zip(requests, with_table, without, strict=True):
        assert got == expected, request


@pytest.mark.parametrize("error", [RuntimeError("boom"), Unavailable("the database is unavailable")])
async def test_errors_of_a_direct_route_are_answered_as_fastapi_would(platform, monkeypatch, error):
    async def failing(principal):
        raise error

    async with asgi_client(platform) as client:
        token = await login(client)
        monkeypatch.setattr(platform.auth, "me", failing)
        with_table = (await _answers(client, [("GET", "/v1/auth/me", token)]))[0]
        monkeypatch.setattr(RouteTable, "find", _off)
        without = (await _answers(client, [("GET", "/v1/auth/me", token)]))[0]
    assert with_table == without
    assert with_table[0] == (500 if isinstance(error, RuntimeError) else 503)


async def test_the_agent_read_rides_with_the_credential_and_still_counts_at_once(platform, monkeypatch):
    """GET /v1/agents/{name}: the owner gate's read is made in the credential's thread job, so one job per
    request; both are still made on every request (a revoked key is refused on the next one)."""
    async with asgi_client(platform) as client:
        token = await login(client)
        assert (await deploy(client, token, "bot", FUNCTION, framework="function")).status_code == 202
        await wait_settled(client, token, "bot")
        key = (await client.post("/v1/users/me/keys", headers=token, json={"display_name": "k"})).json()
        by_key = {"Authorization": f"Bearer {key['secret']}"}
        jobs: list[str] = []
        for kind in ("read", "run", "read_session"):
            real = getattr(platform.db, kind)

            def counted(fn, _kind=kind, _real=real):
                jobs.append(_kind)
                return _real(fn)

            monkeypatch.setattr(platform.db, kind, counted)
        for headers, job in ((token, "read"), (by_key, "run")):
            jobs.clear()
            for _ in range(2):
                assert (await client.get("/v1/agents/bot", headers=headers)).status_code == 200
            assert jobs == [job, job]
        jobs.clear()
        assert (await client.get("/v1/agents/nope", headers=token)).status_code == 404
        assert (await client.get("/v1/agents/bot?project=default", headers=token)).status_code == 200
        assert jobs == ["read", "read", "read_session"]  # `?project=`: the ORM gate, in a job of its own
        assert (await client.delete(f"/v1/users/me/keys/{key['key']['key_id']}", headers=token)).status_code == 200
        assert (await client.get("/v1/agents/bot", headers=by_key)).status_code == 401
