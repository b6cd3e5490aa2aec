"""`GET /metrics`: Prometheus' text format, route templates as labels, and who may read it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from caiplatform.db.models import User
from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client

pytestmark = pytest.mark.unit

AUTOMATION = {"Authorization": "Bearer automation-token-for-tests"}


async def plain_user(platform) -> dict[str, str]:
    """A signed-in user who is not a platform admin (a session token minted directly)."""
    def add(session):
        user = User(email="plain@example.com", password_hash="!unusable", role="user",
                    must_change_password=False, created_at=platform.clock.now())
        session.add(user)
        session.flush()
        return user.id

    token, _ = platform.auth.tokens.issue(await platform.db.run(add), platform.clock.time())
    return {"Authorization": f"Bearer {token}"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scrape: dict, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_http_requests_are_counted_by_route_template(client, admin_headers, platform):
    me = await client.get("/v1/auth/me", headers=admin_headers)  # a route of the flat table
    assert me.status_code == 200
    email = me.json()["email"]
    project = (await client.get("/v1/projects", headers=admin_headers)).json()["projects"][0]["id"]
    for _ in range(2):  # a route FastAPI answers, with a path parameter
        r = await client.get(f"/v1/projects/{project}/topics", headers=admin_headers)
        assert r.status_code == 200, r.text
    assert (await client.get("/v1/no-such-thing/abc123")).status_code == 404
    assert (await client.get("/v1/auth/me")).status_code == 401
    assert (await client.get("/docs/assets/swagger-ui.css")).status_code == 200  # a mounted directory

    r = await client.get("/metrics", headers=admin_headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    scrape = samples(r.text)
    assert value(scrape, "cai_http_requests_total", method="GET", route="/v1/auth/me", status_class="2xx") == 1
    assert value(scrape, "cai_http_requests_total", method="GET", route="/v1/auth/me", status_class="4xx") == 1
    assert value(scrape, "cai_http_requests_total", method="GET", route="/v1/projects/{project_id}/topics",
                 status_class="2xx") == 2
    assert value(scrape, "cai_http_requests_total", method="GET", route="<unmatched>", status_class="4xx") == 1
    assert value(scrape, "cai_http_requests_total", method="GET", route="/docs/assets/{path}", status_class="2xx") == 1
    assert value(scrape, "cai_http_request_duration_seconds_count", method="GET",
                 route="/v1/projects/{project_id}/topics") == 2
    # no raw path, no id of a user, project, session or request anywhere in the labels
    for token in (project, email, "abc123", me.headers["x-request-id"]):
        assert token not in r.text
    # the scrape itself is counted by the next one, under its own path
    again = samples((await client.get("/metrics", headers=admin_headers)).text)
    assert value(again, "cai_http_requests_total", method="GET", route="/metrics", status_class="2xx") == 1


async def test_each_platform_counts_only_its_own(settings):
    counts = []
    for _ in range(2):
        platform = Platform.in_memory(settings)
        platform.settings.metrics_public = True
        async with asgi_client(platform) as client:
            await client.get("/healthz")
            scrape = samples((await client.get("/metrics")).text)
            counts.append(value(scrape, "cai_http_requests_total", method="GET", route="/healthz", status_class="2xx"))
        await platform.aclose()
    assert counts == [1, 1]


async def test_anonymous_is_refused_unless_loopback_or_opted_in(client, admin_headers, platform):
    platform.settings.bind_host = "0.0.0.0"
    r = await client.get("/metrics")
    assert r.status_code == 401 and r.json()["request_id"] == r.headers["x-request-id"]
    assert "CAI_METRICS_PUBLIC" in r.json()["error"]
    assert (await client.get("/metrics", headers=admin_headers)).status_code == 200
    assert (await client.get("/metrics", headers=AUTOMATION)).status_code == 200
    # a signed-in caller who is not a platform admin: refused
    assert (await client.get("/metrics", headers=await plain_user(platform))).status_code == 403

    platform.settings.bind_host = "127.0.0.1"
    assert (await client.get("/metrics")).status_code == 200
    platform.settings.bind_host = "::1"
    assert (await client.get("/metrics")).status_code == 200
    platform.settings.bind_host = "0.0.0.0"
    platform.settings.metrics_public = True
    assert (await client.get("/metrics")).status_code == 200


async def test_metrics_is_get_only_and_not_in_the_api_document(client):
    r = await client.post("/metrics", headers=AUTOMATION)
    assert r.status_code == 405 and r.json()["error"] == "method not allowed"
    assert "/metrics" not in (await client.get("/openapi.json")).json()["paths"]
