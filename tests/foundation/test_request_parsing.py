"""Hardened request parsing (issue 26): a JSON body nested deeper than the documented limit, or holding
numbers no encoder may write back, is the spec's 400 in the envelope on every route that reads JSON,
before any handler acts on it."""

from __future__ import annotations

import re

import pytest

from caiplatform.json_input import MAX_DEPTH, JSONInputError, decode, nesting_depth_exceeds

DEEP = b"[" * 3500 + b"]" * 3500
DEEP_OBJECT = b'{"":' * 1600 + b"1" + b"}" * 1600  # under the 8 KiB cap, deeper than the recursion limit
TOO_DEEP = f"invalid JSON body: nesting is deeper than {MAX_DEPTH} levels"
WRITES = ("post", "put", "patch")


def nested(depth: int) -> bytes:
    return b'{"k":' * (depth - 1) + b"[1]" + b"}" * (depth - 1)


def test_the_depth_limit_is_exact_and_ignores_brackets_in_strings():
    assert not nesting_depth_exceeds(nested(MAX_DEPTH)) and nesting_depth_exceeds(nested(MAX_DEPTH + 1))
    assert decode(nested(MAX_DEPTH))
    assert decode(b'["' + b"[" * 5000 + b'"]') == ["[" * 5000]
    assert decode(b'["\\"' + b"{" * 5000 + b'"]') == ['"' + "{" * 5000]
    for raw in (DEEP, DEEP_OBJECT, b"[" * 100_000, nested(MAX_DEPTH + 1)):
        with pytest.raises(JSONInputError, match="nesting is deeper than"):
            decode(raw)


@pytest.mark.parametrize("raw,reason", [
    (b"NaN", "NaN is not a JSON number"),
    (b'{"x": -Infinity}', "-Infinity is not a JSON number"),
    (b"[1e999]", "number 1e999 is out of range"),
    (b"1" * 1500, "integer of 1500 digits is too large"),
    (b'{"a": "\\ud800"}', "a string holds an unpaired UTF-16 surrogate escape"),
    (b'["x\\udc00y"]', "a string holds an unpaired UTF-16 surrogate escape"),
])
def test_numbers_that_cannot_be_written_back_are_refused(raw, reason):
    with pytest.raises(JSONInputError, match=re.escape(reason)):
        decode(raw)


async def test_a_deep_body_on_login_is_400_without_a_credential(client):
    for body in (DEEP, DEEP_OBJECT, nested(MAX_DEPTH + 1)):
        r = await client.post("/v1/auth/login", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json() == {"error": TOO_DEEP, "request_id": r.headers["x-request-id"]}
    r = await client.post("/v1/auth/login", content=b'{"email": NaN}')
    assert (r.status_code, r.json()["error"]) == (400, "invalid JSON body: NaN is not a JSON number")


def write_routes(client) -> list[tuple[str, str]]:
    """(method, path) of every route that takes a body, from the app's own route table."""
    app = client._transport.app.app  # ConventionsMiddleware → FastAPI
    paths = app.openapi()["paths"]
    return [(method, path) for path, ops in paths.items() for method in ops if method in WRITES]


def fill(path: str, project_id: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[0]
        return {"projectID": project_id, "project_id": project_id, "email": "nobody@example.com",
                "session_id": "s-1", "path": "main.py", "verb": "apply", "version_verb": "1:rollback",
                "env_name": "MY_VAR"}.get(name, "thing")

    return re.sub(r"\{([^}]+)\}", value, path)


async def test_no_route_answers_a_deep_body_with_a_5xx(client, admin_headers, platform):
    from caiplatform.testing.users import new_project

    project_id = (await new_project(platform, "deep")).id
    routes = write_routes(client)
    assert len(routes) > 50
    for method, path in routes:
        for body in (DEEP, DEEP_OBJECT):
            r = await client.request(method, fill(path, project_id), content=body, headers={
                **admin_headers, "content-type": "application/json"})
            assert r.status_code < 500, (method, path, r.status_code, r.text)
            if r.status_code >= 400:  # a route that reads no body may succeed
                assert set(r.json()) >= {"error", "request_id"}, (method, path, r.text)


def payload(depth: int) -> dict:
    """An object `depth` levels deep."""
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


async def test_values_at_the_limit_are_stored_and_come_back(client, admin_headers, platform):
    """A value as deep as allowed goes in, is stored, and is re-encoded on the way out without a 5xx."""
    from caiplatform.testing.users import new_project
    from tests.agents.agents_support import deploy, wait_settled

    project_id = (await new_project(platform, "deep-store")).id
    base = f"/v1/projects/{project_id}/indexes"
    assert (await client.post(base, headers=admin_headers, json={"name": "docs", "dimensions": 2})).status_code == 201
    deepest = payload(MAX_DEPTH - 3)  # inside {points: [{payload: ...}]}
    r = await client.post(f"{base}/docs:upsert", headers=admin_headers,
                          json={"points": [{"id": 1, "vector": [1, 0], "payload": deepest}]})
    assert r.status_code == 200, r.text
    r = await client.post(f"{base}/docs:scroll", headers=admin_headers, json={})
    assert r.status_code == 200 and r.json()["points"][0]["payload"] == deepest
    r = await client.post(f"{base}/docs:upsert", headers=admin_headers,
                          json={"points": [{"id": 2, "vector": [1, 0], "payload": payload(MAX_DEPTH - 2)}]})
    assert (r.status_code, r.json()["error"]) == (400, TOO_DEEP)

    echo = {"main.py": "def handle(event, context):\n    return event\n"}
    await deploy(client, admin_headers, "echo", echo, project="deep-store", framework="function")
    assert (await wait_settled(client, admin_headers, "echo", project="deep-store"))["ready"]
    url = "/v1/agents/echo/invoke?project=deep-store"
    r = await client.post(url, headers=admin_headers, json=payload(MAX_DEPTH))
    assert r.status_code == 200 and r.json() == payload(MAX_DEPTH)
    r = await client.post(url, headers=admin_headers, json=payload(MAX_DEPTH + 1))
    assert (r.status_code, r.json()["error"]) == (400, TOO_DEEP)


async def test_a_json_form_field_is_decoded_within_the_limits(client, admin_headers):
    """The deploy form's `config` field carries JSON: the same limits, its own message."""
    from tests.agents.agents_support import deploy

    echo = {"main.py": "def handle(event, context):\n    return event\n"}
    for config, reason in ((DEEP.decode(), TOO_DEEP.removeprefix("invalid JSON body: ")),
                           ('{"timeout_seconds": NaN}', "NaN is not a JSON number")):
        r = await deploy(client, admin_headers, "cfg", echo, framework="function", config=config)
        assert (r.status_code, r.json()["error"]) == (400, f"invalid 'config' field: {reason}")
