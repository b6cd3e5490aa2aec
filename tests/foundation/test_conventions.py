"""The conventions shared by every API: envelope, request ids, 404/405, rate limits, OpenAPI."""

from __future__ import annotations

import pytest

from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client


async def test_every_response_carries_a_request_id(client):
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["x-request-id"]


async def test_unrouted_path_is_404_in_the_envelope(client):
    response = await client.get("/v1/no-such-thing")
    assert response.status_code == 404
    body = response.json()
    assert body == {"error": "not found", "request_id": response.headers["x-request-id"]}


async def test_wrong_method_is_405_in_the_envelope(client):
    response = await client.delete("/v1/auth/login")
    assert response.status_code == 405
    assert response.json()["request_id"] == response.headers["x-request-id"]
    assert response.json()["error"] == "method not allowed"


async def test_errors_from_services_use_the_envelope(client):
    response = await client.get("/v1/auth/me")
    assert response.status_code == 401
    assert set(response.json()) == {"error", "request_id"}
    assert response.json()["request_id"] == response.headers["x-request-id"]


async def test_combined_healthz_lists_every_api(client):
    body = (await client.get("/healthz")).json()
    assert body["status"] == "ok"
    assert set(body["apis"]) == {"core", "serverless", "pubsub", "memorystore", "vectordb"}


async def test_single_api_healthz_is_that_apis_body(platform):
    async with asgi_client(platform, apis=["serverless"]) as c:
        body = (await c.get("/healthz")).json()
        assert body["service"] == "serverless"
        assert "apis" not in body
        # Routes of APIs that are not served are not there.
        assert (await c.post("/v1/auth/login", json={})).status_code == 404


async def test_openapi_document_is_3_1_and_covers_routes(client):
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/auth/login" in doc["paths"]


async def test_rate_limit_answers_429_per_principal(settings, clock):
    limited = settings.model_copy(update={"ratelimit_rps": 1.0, "ratelimit_burst": 3})
    platform = Platform.in_memory(limited, clock=clock)
    async with asgi_client(platform) as c:
        statuses = [(await c.get("/v1/auth/me")).status_code for _ in range(4)]
        assert statuses[:3] == [401, 401, 401]
        assert statuses[3] == 429
        last = await c.get("/v1/auth/me")
        assert last.status_code == 429 and last.json()["error"] and "retry-after" in last.headers
        # Health stays reachable while the caller is limited.
        assert (await c.get("/healthz")).status_code == 200
        clock.advance(2)
        assert (await c.get("/v1/auth/me")).status_code == 401


async def test_invalid_credential_is_treated_as_none(client):
    response = await client.get("/v1/auth/me", headers={"Authorization": "Bearer not-a-token"})
    assert response.status_code == 401


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b""])
async def test_malformed_json_is_400(client, body):
    response = await client.post("/v1/auth/login", content=body)
    assert response.status_code == 400
    assert response.json()["error"].startswith("invalid JSON body: ")


async def test_oversized_body_is_413(client):
    response = await client.post("/v1/auth/login", content=b"{" + b" " * (9 * 1024) + b"}")
    assert response.status_code == 413
