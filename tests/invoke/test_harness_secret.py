"""Issue 34: the harness answers only the platform (its per-instance secret), and no header's absence
grants the control plane's trust (the user and session it names, `memories`)."""

from __future__ import annotations

import textwrap

from caiplatform.harness.app import BAD_HARNESS_TOKEN
from caiplatform.ports.runtime import HARNESS_TOKEN_HEADER
from caiplatform.testing.example_agents import PYTHON_FUNCTION

SECRET = "per-instance-secret-0123456789abcdef"
FILES = {name: textwrap.dedent(text) for name, text in PYTHON_FUNCTION.items()}
AS_PLATFORM = {HARNESS_TOKEN_HEADER: SECRET}
CLAIMED = {"X-CAI-User-Id": "alice", "X-CAI-Session-Id": "s" * 24}


async def test_every_route_refuses_a_caller_without_the_secret(harness_env, harness_client):
    client = harness_client(harness_env("function", FILES, CAI_HARNESS_TOKEN=SECRET))
    for method, path in (("POST", "/invoke"), ("POST", "/invoke/stream"), ("GET", "/healthz"),
                         ("GET", "/debug/config"), ("GET", "/internal/users"), ("GET", "/nowhere")):
        for headers in ({}, {HARNESS_TOKEN_HEADER: "guessed"}, {HARNESS_TOKEN_HEADER: ""}):
            r = await client.request(method, path, json={"message": "hi"}, headers={**CLAIMED, **headers})
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.json()["error"] == BAD_HARNESS_TOKEN
    assert (await client.get("/healthz", headers=AS_PLATFORM)).status_code == 200


async def test_the_platform_names_the_user_and_the_published_address_does_not(harness_env, harness_client):
    client = harness_client(harness_env("function", FILES, CAI_HARNESS_TOKEN=SECRET))
    r = await client.post("/invoke", json={"message": "hi"}, headers={**AS_PLATFORM, **CLAIMED})
    assert r.status_code == 200, r.text
    assert r.headers["X-CAI-User-Id"] == "alice"
    # the platform's host proxy marks requests of the published address: anonymous outside callers
    r = await client.post("/invoke", json={"message": "hi"},
                          headers={**AS_PLATFORM, **CLAIMED, "X-Forwarded-Host": "fn-abc.apps.localhost"})
    assert r.status_code == 200, r.text
    assert r.headers["X-CAI-User-Id"] != "alice"


async def test_without_a_secret_no_missing_header_makes_a_caller_the_control_plane(harness_env, harness_client):
    client = harness_client(harness_env("function", FILES))
    r = await client.post("/invoke", json={"message": "hi"}, headers=CLAIMED)  # no X-Forwarded-Host
    assert r.status_code == 200, r.text
    assert r.headers["X-CAI-User-Id"] != "alice"
