"""Env, secrets, config, revisions, traffic, files, logs, spec, metrics and embed over HTTP (document 1)."""

from __future__ import annotations

import asyncio

import pytest
import yaml
from sqlalchemy import select

from caiplatform.db.models import AuditEntry

from .agents_support import deploy, wait_settled


@pytest.fixture
async def bot(client, world):
    assert (await deploy(client, world.member, "bot")).status_code == 202
    view = await wait_settled(client, world.member, "bot")
    assert view["ready"], view
    return world.member


async def _revisions(client, headers, name="bot"):
    return (await client.get(f"/v1/agents/{name}/revisions", headers=headers)).json()["revisions"]


async def test_env_is_readable_and_every_change_rolls_a_revision(platform, client, bot):
    assert (await client.get("/v1/agents/bot/env", headers=bot)).json() == {"agent": "bot", "env": {}}
    response = await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"GREETING": "hi", "MODE": "x"}})
    assert response.status_code == 200
    assert response.json() == {"agent": "bot", "env_updated": True, "env": {"GREETING": "hi", "MODE": "x"}}
    view = await wait_settled(client, bot, "bot")
    assert view["ready"] and view["latest_revision"] == "bot-00002"
    response = await client.patch("/v1/agents/bot/env", headers=bot, json={"remove": ["MODE"], "set": {"GREETING": ""}})
    assert response.json()["env"] == {}
    assert (await wait_settled(client, bot, "bot"))["latest_revision"] == "bot-00003"
    nothing = await client.patch("/v1/agents/bot/env", headers=bot, json={})
    assert nothing.status_code == 400 and nothing.json()["error"] == "nothing to do: provide 'set' and/or 'remove'"
    bad = await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"1BAD": "x"}})
    assert bad.status_code == 400
    assert bad.json()["error"] == "invalid secret key (must be a valid environment variable name): 1BAD"
    # The instance sees the env of its revision.
    await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"GREETING": "hello"}})
    await wait_settled(client, bot, "bot")
    endpoint = await platform.runtime.acquire((await platform.agents.manage_target(
        await platform.auth.authenticate(bot["Authorization"].split()[1]), "bot", None)).workload, timeout=5)
    async with endpoint.client() as http:
        assert (await http.get("/env/GREETING")).json()["value"] == "hello"
        assert (await http.get("/env/AGENT_NAME")).json()["value"] == "bot"
        assert (await http.get("/env/CAI_SESSION_STORE")).json()["value"] == "memory"
        assert (await http.get("/env/MODEL_BASE_URL")).json()["value"] == "http://127.0.0.1:9/v1"
        assert (await http.get("/env/CAI_PROJECT_KEY")).json()["value"].startswith("cai_wl_")
    await endpoint.release()


async def test_secrets_are_write_only(platform, client, bot):
    assert (await client.get("/v1/agents/bot/secrets", headers=bot)).json() == {"agent": "bot", "keys": []}
    put = await client.put("/v1/agents/bot/secrets", headers=bot, json={"API_TOKEN": "s3cret", "EMPTY": ""})
    assert put.status_code == 200 and put.json() == {"agent": "bot", "secrets_updated": True}
    assert (await client.get("/v1/agents/bot/secrets", headers=bot)).json()["keys"] == ["API_TOKEN"]
    patch = await client.patch("/v1/agents/bot/secrets", headers=bot, json={"set": {"B": "2", "API_TOKEN": ""}})
    assert patch.json() == {"agent": "bot", "secrets_updated": True, "keys": ["B"]}
    patch = await client.patch("/v1/agents/bot/secrets", headers=bot, json={"remove": ["B"], "set": {"MODEL_API_KEY": "mine"}})
    assert patch.json()["keys"] == ["MODEL_API_KEY"]
    assert (await client.patch("/v1/agents/bot/secrets", headers=bot, json={"set": {}})).json()["error"] == (
        "nothing to do: provide 'set' and/or 'remove'"
    )
    bad = await client.put("/v1/agents/bot/secrets", headers=bot, json={"bad-key": "v"})
    assert bad.json()["error"] == "invalid secret key (must be a valid environment variable name): bad-key"
    assert "s3cret" not in (await client.get("/v1/agents/bot/secrets", headers=bot)).text
    assert (await wait_settled(client, bot, "bot"))["latest_revision"] == "bot-00004"
    # The instance gets the secret names (never values), so /debug/config can leave them out.
    endpoint = await platform.runtime.acquire((await platform.agents.manage_target(
        await platform.auth.authenticate(bot["Authorization"].split()[1]), "bot", None)).workload, timeout=5)
    async with endpoint.client() as http:
        names = (await http.get("/env/CAI_SECRET_NAMES")).json()["value"].split(",")
    await endpoint.release()
    assert "MODEL_API_KEY" in names and "CAI_PROJECT_KEY" in names and "mine" not in names
    big = await client.put("/v1/agents/bot/secrets", headers=bot, json={"K": "x" * (1024 * 1024 + 10)})
    assert big.status_code == 413


async def test_config_sparse_patch_and_messages(client, bot):
    assert (await client.get("/v1/agents/bot/config", headers=bot)).json() == {"agent": "bot", "config": None}
    response = await client.patch("/v1/agents/bot/config", headers=bot, json={
        "scaling": {"min_scale": 1, "max_scale": 4},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "timeout_seconds": 120,
    })
    assert response.status_code == 200
    body = response.json()
    assert body["config_updated"] is True and body["config"]["scaling"] == {"min_scale": 1, "max_scale": 4}
    response = await client.patch("/v1/agents/bot/config", headers=bot, json={"scaling": {"min_scale": ""}, "resources": {"limits": None}})
    config = response.json()["config"]
    assert config == {"scaling": {"max_scale": 4}, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}, "timeout_seconds": 120}
    negative = await client.patch("/v1/agents/bot/config", headers=bot, json={"scaling": {"min_scale": -1}})
    assert negative.status_code == 400 and negative.json()["error"].startswith("min_scale -1 is negative; ")
    inverted = await client.patch("/v1/agents/bot/config", headers=bot, json={"scaling": {"min_scale": 5}})
    assert inverted.status_code == 400 and inverted.json()["error"].startswith("min_scale 5 is greater than max_scale 4; ")
    quantity = await client.patch("/v1/agents/bot/config", headers=bot, json={"resources": {"requests": {"cpu": "lots"}}})
    assert quantity.status_code == 400
    assert (await client.get("/v1/agents/bot/config", headers=bot)).json()["config"] == config
    assert (await wait_settled(client, bot, "bot"))["latest_revision"] == "bot-00003"


async def test_revisions_and_traffic(platform, client, bot):
    await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"GREETING": "two"}})
    await wait_settled(client, bot, "bot")
    revisions = await _revisions(client, bot)
    assert [r["name"] for r in revisions] == ["bot-00002", "bot-00001"]
    newest = revisions[0]
    assert newest["generation"] == 2 and newest["traffic_percent"] == 100 and newest["ready"] is True
    assert newest["state"] == "ready" and newest["image"] and "created_at" in newest
    split = {"traffic": [{"revision_name": "bot-00001", "percent": 30}, {"revision_name": "bot-00002", "percent": 70}]}
    response = await client.post("/v1/agents/bot/set-traffic", headers=bot, json=split)
    assert response.status_code == 202 and response.json() == {"agent": "bot", "traffic": split["traffic"]}
    by_name = {r["name"]: r["traffic_percent"] for r in await _revisions(client, bot)}
    assert by_name == {"bot-00001": 30, "bot-00002": 70}
    for body in ({}, {"traffic": []}, {"traffic": [{"revision_name": "bot-00001", "percent": 50}]}):
        bad = await client.post("/v1/agents/bot/set-traffic", headers=bot, json=body)
        assert bad.status_code == 400 and bad.json()["error"].startswith("traffic is required - send the complete split")
    unknown = await client.post("/v1/agents/bot/set-traffic", headers=bot, json={"traffic": [{"revision_name": "bot-00009", "percent": 100}]})
    assert unknown.json()["error"] == "revision bot-00009 does not exist for this agent"
    actions = await platform.db.run(lambda s: [a.action for a in s.scalars(select(AuditEntry).where(AuditEntry.target == "bot"))])
    assert "agent.set-traffic" in actions and "agent.config" in actions


async def test_stored_source_files(platform, client, bot):
    listing = (await client.get("/v1/agents/bot/files", headers=bot)).json()
    assert listing["agent"] == "bot" and listing["agent_id"] and listing["editable"] is True and listing["note"]
    assert [f["path"] for f in listing["files"]] == ["graph.py"] and listing["files"][0]["size"] > 0
    one = (await client.get("/v1/agents/bot/files/graph.py", headers=bot)).json()
    assert "StateGraph" in one["content"] and one["path"] == "graph.py" and one["updated_at"]
    put = await client.put("/v1/agents/bot/files/pkg/tools.py", headers=bot, json={"content": "X = 1\n"})
    assert put.status_code == 200 and put.json()["bytes"] == 6 and "redeploy" in put.json()["note"]
    assert (await client.get("/v1/agents/bot", headers=bot)).json()["latest_revision"] == "bot-00001"  # unchanged
    assert (await client.get("/v1/agents/bot/files/pkg/tools.py", headers=bot)).json()["content"] == "X = 1\n"
    assert (await client.delete("/v1/agents/bot/files/pkg/tools.py", headers=bot)).json() == {"deleted": "pkg/tools.py"}
    assert (await client.get("/v1/agents/bot/files/pkg/tools.py", headers=bot)).status_code == 404
    assert (await client.delete("/v1/agents/bot/files/pkg/tools.py", headers=bot)).status_code == 404
    assert (await client.put("/v1/agents/bot/files/..%2Fx.py", headers=bot, json={"content": ""})).status_code in (400, 404)
    assert (await client.put("/v1/agents/bot/files/a/../../x.py", headers=bot, json={"content": ""})).status_code in (400, 404)
    big = await client.put("/v1/agents/bot/files/big.txt", headers=bot, json={"content": "x" * (1024 * 1024 + 1)})
    assert big.status_code == 400 and "1 MiB" in big.json()["error"]
    assert (await client.put("/v1/agents/bot/files/x.py", headers=bot, json={"nope": 1})).status_code == 400
    # An edit takes effect on redeploy.
    await client.put("/v1/agents/bot/files/extra.py", headers=bot, json={"content": "Y = 2\n"})
    assert (await client.post("/v1/agents/bot/redeploy", headers=bot)).json()["files"] == 2
    assert (await wait_settled(client, bot, "bot"))["latest_revision"] == "bot-00002"
    actions = await platform.db.run(lambda s: [a.action for a in s.scalars(select(AuditEntry))])
    assert {"agent.file.write", "agent.file.delete", "agent.redeploy"} <= set(actions)


async def test_logs_live_and_history(platform, client, bot, clock):
    endpoint = await platform.runtime.acquire((await platform.agents.invoke_target(
        await platform.auth.authenticate(None), "bot", None)).workload, timeout=5)
    async with endpoint.client() as http:
        await http.get("/say", params={"text": "hello from the bot"})
    await endpoint.release()
    live = await client.get("/v1/agents/bot/logs", headers=bot)
    assert live.status_code == 200 and live.headers["content-type"].startswith("text/plain")
    assert "hello from the bot" in live.text
    history = (await client.get("/v1/agents/bot/logs/history", headers=bot)).json()
    assert history["agent"] == "bot" and history["note"] and history["count"] == len(history["lines"])
    line = next(entry for entry in history["lines"] if "hello from the bot" in entry["message"])
    assert set(line) == {"ts", "revision", "pod", "stream", "message"} and line["revision"] == "bot-00001"
    limited = (await client.get("/v1/agents/bot/logs/history", headers=bot, params={"limit": 1})).json()
    assert limited["count"] == 1
    later = (await client.get("/v1/agents/bot/logs/history", headers=bot, params={"since": "2999-01-01T00:00:00Z"})).json()
    assert later["lines"] == [] and later["count"] == 0
    assert (await client.get("/v1/agents/bot/logs/history", headers=bot, params={"limit": "x"})).status_code == 400
    assert (await client.get("/v1/agents/bot/logs/history", headers=bot, params={"since": "yesterday"})).status_code == 400
    assert (await client.get("/v1/agents/nobody/logs", headers=bot)).status_code == 404


async def test_logs_of_a_scaled_to_zero_agent_point_at_history(platform, client, bot):
    target = await platform.agents.manage_target(await platform.auth.authenticate(bot["Authorization"].split()[1]), "bot", None)
    await platform.runtime.delete(target.workload)  # nothing runs
    response = await client.get("/v1/agents/bot/logs", headers=bot)
    assert response.status_code == 200 and "no live pods" in response.text and "/logs/history" in response.text


async def test_spec_redacts_and_metrics_count(client, bot):
    await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"SERVICE_API_KEY": "leak", "PLAIN": "visible"}})
    await wait_settled(client, bot, "bot")
    body = (await client.get("/v1/agents/bot/spec", headers=bot)).json()
    assert body["agent"] == "bot" and body["note"]
    assert "leak" not in body["yaml"] and "***REDACTED***" in body["yaml"] and "visible" in body["yaml"]
    assert "managedFields" not in body["yaml"]
    assert isinstance(yaml.safe_load(body["yaml"]), dict)
    metrics = (await client.get("/v1/agents/bot/metrics", headers=bot)).json()
    assert set(metrics) == {"agent", "instances", "revisions", "readiness", "latest_ready_revision", "target_concurrency", "note"}
    assert metrics["latest_ready_revision"] == "bot-00002"


async def test_embed_config(platform, client, bot):
    default = (await client.get("/v1/agents/bot/embed", headers=bot)).json()
    assert default["enabled"] is False and default["allowed_origins"] == [] and default["position"] == "right"
    assert set(default) == {"agent", "enabled", "embed_key", "allowed_origins", "title", "subtitle", "greeting",
                            "accent_color", "launcher_text", "position", "updated_at"}
    put = (await client.put("/v1/agents/bot/embed", headers=bot, json={
        "enabled": True, "allowed_origins": ["https://example.com"], "title": "Bot"})).json()
    key = put["embed_key"]
    assert key and put["enabled"] and put["title"] == "Bot" and put["updated_at"]
    again = (await client.put("/v1/agents/bot/embed", headers=bot, json={"greeting": "Hi"})).json()
    assert again["embed_key"] == key and again["title"] == "Bot" and again["greeting"] == "Hi"
    target = await platform.agents.embed_target(key)
    assert target is not None and target.target.agent == "bot" and target.allowed_origins == ["https://example.com"]
    rotated = (await client.post("/v1/agents/bot/embed/rotate-key", headers=bot)).json()
    assert rotated["embed_key"] != key and await platform.agents.embed_target(key) is None
    assert await platform.agents.embed_target(rotated["embed_key"]) is not None
    assert (await client.put("/v1/agents/bot/embed", headers=bot, json={"position": "middle"})).status_code == 400
    assert (await client.put("/v1/agents/bot/embed", headers=bot, json={"enabled": "yes"})).status_code == 400
    assert (await client.delete("/v1/agents/bot/embed", headers=bot)).status_code == 200
    assert (await client.get("/v1/agents/bot/embed", headers=bot)).json()["enabled"] is False
    assert await platform.agents.embed_target(rotated["embed_key"]) is None
    actions = await platform.db.run(lambda s: [a.action for a in s.scalars(select(AuditEntry))])
    assert {"agent.embed.update", "agent.embed.rotate-key", "agent.embed.delete"} <= set(actions)


async def test_publishing_variables(platform, client, bot, world):
    refused = await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"CAI_EXPOSE_EXTERNAL": "true"}})
    assert refused.status_code == 200  # the env route accepts it; the deploy path refuses it
    view = await wait_settled(client, bot, "bot")
    assert view["ready"] is False and "CAI_EXPOSE_EXTERNAL" in view["message"] and "external_url" not in view
    newest = (await _revisions(client, bot))[0]
    assert newest["reason"] == "ExposureRefused" and newest["ready"] is False and newest["message"]
    host = f"bot-{world.project_short}.apps.localhost"
    assert platform.hosts.lookup(host) is None
    await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"CAI_EXPOSE_EXTERNAL": "none", "CAI_EXPOSE_RATE_LIMIT": "10/minute"}})
    view = await wait_settled(client, bot, "bot")
    assert view["ready"] and platform.hosts.lookup(host) is not None
    await platform.agents.wait_idle()
    assert (await client.get("/v1/agents/bot", headers=bot)).json()["external_url"].startswith(f"http://{host}")
    await client.patch("/v1/agents/bot/env", headers=bot, json={"set": {"CAI_EXPOSE_EXTERNAL": "jwt"}})
    view = await wait_settled(client, bot, "bot")
    assert not view["ready"] and "jwt" in view["message"] and platform.hosts.lookup(host) is None


async def test_service_quota_keeps_a_new_agent_deploying(platform, client, world):
    from caiplatform.db.models import Project

    platform.service_quota.enforced = True  # CAI_ENFORCE_SERVICE_QUOTA

    def quota(session):
        project = session.get(Project, world.project_id)
        project.settings = {**(project.settings or {}), "quota": {"services": 2}}

    await platform.db.run(quota)
    await deploy(client, world.member, "first")
    assert (await wait_settled(client, world.member, "first"))["ready"]
    # Full before the build: refused at once.
    refused = await deploy(client, world.member, "second")
    assert refused.status_code == 409 and refused.json()["error"].startswith("this project is at its service limit (2 / 2): ")
    # Filled while the build ran: the new agent stays deploying with the same explanation.
    await platform.db.run(lambda s: setattr(s.get(Project, world.project_id), "settings", {"quota": {"services": "4"}}))
    assert (await deploy(client, world.member, "second")).status_code == 202
    assert (await deploy(client, world.member, "third")).status_code == 202
    await platform.agents.wait_idle()
    views = [(await client.get(f"/v1/agents/{n}", headers=world.member)).json() for n in ("second", "third")]
    stuck = [v for v in views if v["state"] == "deploying"]
    assert len(stuck) == 1 and stuck[0]["message"].startswith("this project is at its service limit (4 / 4): ")
    revision = (await client.get(f"/v1/agents/{stuck[0]['name']}/revisions", headers=world.member)).json()["revisions"][0]
    assert revision["ready"] is False and revision["reason"] == "QuotaExceeded"


async def _publish(client, headers, mode: str, rate: str, **extra: str) -> dict:
    env = {"CAI_EXPOSE_EXTERNAL": mode, "CAI_EXPOSE_RATE_LIMIT": rate, **extra}
    assert (await client.patch("/v1/agents/bot/env", headers=headers, json={"set": env})).status_code == 200
    view = await wait_settled(client, headers, "bot")
    assert view["ready"], view
    return view


async def test_published_address_auth_modes_and_rate_budget(platform, client, bot, world):
    host = {"Host": f"bot-{world.project_short}.apps.localhost"}
    await _publish(client, bot, "none", "3/minute")
    answers = [(await client.get("/whoami", headers=host)).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    limited = await client.get("/whoami", headers=host)
    assert limited.json()["error"].startswith("this agent's public rate budget (3/minute)") and limited.headers["retry-after"]

    await _publish(client, bot, "apikey", "100/second")
    anonymous = await client.get("/whoami", headers=host)
    assert anonymous.status_code == 401 and anonymous.json()["request_id"]
    assert (await client.get("/healthz", headers=host)).status_code == 200  # liveness needs no key
    assert (await client.get("/whoami", headers={**host, "Authorization": "Bearer cai_nope_nope"})).status_code == 401
    assert (await client.get("/whoami", headers={**host, **world.outsider})).status_code == 403
    assert (await client.get("/whoami", headers={**host, **world.member})).status_code == 200

    await _publish(client, bot, "jwt", "100/second", CAI_EXPOSE_JWT_ISSUER="https://issuer.example",
                   CAI_EXPOSE_JWT_JWKS_URI="http://127.0.0.1:9/jwks.json")
    assert (await client.get("/whoami", headers=host)).status_code == 401
    assert (await client.get("/whoami", headers={**host, "Authorization": "Bearer not.a.jwt"})).status_code == 401


@pytest.fixture
def jwks_server():
    """A JWKS document on a loopback port and a function that signs tokens with its key."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def sign(claims: dict) -> str:
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})

    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", sign
    server.shutdown()


async def test_published_address_verifies_jwts_against_the_jwks(client, bot, world, jwks_server):
    uri, sign = jwks_server
    host = {"Host": f"bot-{world.project_short}.apps.localhost"}
    await _publish(client, bot, "jwt", "100/second", CAI_EXPOSE_JWT_ISSUER="https://issuer.example",
                   CAI_EXPOSE_JWT_JWKS_URI=uri, CAI_EXPOSE_JWT_AUDIENCES="bot-api,other")
    good = sign({"iss": "https://issuer.example", "aud": "bot-api", "sub": "u1"})
    assert (await client.get("/whoami", headers={**host, "Authorization": f"Bearer {good}"})).status_code == 200
    wrong_issuer = sign({"iss": "https://elsewhere.example", "aud": "bot-api"})
    assert (await client.get("/whoami", headers={**host, "Authorization": f"Bearer {wrong_issuer}"})).status_code == 401
    wrong_audience = sign({"iss": "https://issuer.example", "aud": "someone-else"})
    assert (await client.get("/whoami", headers={**host, "Authorization": f"Bearer {wrong_audience}"})).status_code == 401


async def test_the_build_log_is_read_back_and_followed_until_the_build_ends(platform, client, world):
    """The latest build's lines are stored as the builder writes them; `follow=true` streams them and ends
    with the build. A path of the server in a line is cut; nobody without a grant reads it."""
    import httpx

    from caiplatform.adapters.memory.asgi_transport import StreamingASGITransport
    from caiplatform.services.agents import builds
    from caiplatform_server.app import create_app

    assert (await client.get("/v1/agents/nobuild/logs/build", headers=world.member)).status_code == 404
    real = platform.agents.builder.build
    gate = asyncio.Event()

    async def slow_build(request, log=None):  # a build that writes, then waits, then writes again
        log("step 1: resolving in /srv/cai/data/builds/x/requirements.txt")
        await gate.wait()
        log("step 2: done")
        return await real(request, log)

    platform.agents.builder.build = slow_build
    try:
        assert (await deploy(client, world.member, "bot")).status_code == 202
        streaming = StreamingASGITransport(create_app(platform, manage_lifecycle=False))  # chunks as sent
        async with httpx.AsyncClient(transport=streaming, base_url="http://testserver") as live, asyncio.timeout(60):
            async with live.stream("GET", "/v1/agents/bot/logs/build?follow=true", headers=world.member) as streamed:
                assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/plain")
                chunks = streamed.aiter_text()
                first = ""
                while "step 1" not in first:  # the first line arrives while the build still runs
                    first += await chunks.__anext__()
                assert "/srv/cai" not in first and ".../requirements.txt" in first
                gate.set()
                rest = "".join([part async for part in chunks])  # ends when the build does
        assert "step 2: done" in rest and "copying it into image" in rest
    finally:
        platform.agents.builder.build = real
    assert (await wait_settled(client, world.member, "bot"))["ready"]
    whole = await client.get("/v1/agents/bot/logs/build", headers=world.member)
    assert whole.text.startswith("step 1") and "step 2: done" in whole.text
    assert (await client.get("/v1/agents/bot/logs/build", headers=world.outsider)).status_code == 404
    assert builds.BUILD_LOG_LIMIT >= 64 * 1024
