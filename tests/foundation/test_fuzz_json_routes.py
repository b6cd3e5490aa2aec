"""Fuzz (issue 26): arbitrary JSON values, as the platform admin with a project full of objects, to every
route of the app that takes a body. No answer may be a 5xx, and every refusal is the spec's envelope.

The values come from hypothesis: nested arrays and objects, huge integers, floats, unicode, and objects
whose keys are the field names the services read (so every field also gets every wrong type). The run
is derandomized so CI is stable; `CAI_FUZZ_EXAMPLES` raises the examples per route for a longer hunt.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import anyio.from_thread
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import caiplatform

EXAMPLES = int(os.environ.get("CAI_FUZZ_EXAMPLES", "10"))
WRITES = ("post", "put", "patch")
IMAGE = "registry.local/cai-test-fuzz@sha256:" + "c" * 64
FUZZ_USER = "fuzz.user@example.com"


def _routes() -> list[tuple[str, str]]:
    from caiplatform.platform import Platform
    from caiplatform_server.app import create_app

    app = create_app(Platform.in_memory(), manage_lifecycle=False).app  # type: ignore[attr-defined]
    return [(method, path) for path, ops in app.openapi()["paths"].items() for method in ops if method in WRITES]


def _field_names() -> list[str]:
    """Every key the library reads from a mapping: the fields of every body, and then some."""
    names: set[str] = set()
    for path in Path(caiplatform.__file__).parent.rglob("*.py"):
        names.update(re.findall(r"""(?:\.get\(|\[|pick\()["']([a-z][a-z0-9_]{1,40})["']""", path.read_text()))
    return sorted(names)


# Routes whose last segment carries a method (`name:verb`): one case per method.
VERBS = {
    "/v1/projects/{project_id}/secrets:{verb}": {"verb": ["issue-token"]},
    "/v1/projects/{project_id}/secrets/{segment}": {"segment": ["sec1:reveal", "sec1:issue-token"]},
    "/v1/projects/{project_id}/agents/{agent}/secret-maps:{verb}": {"verb": ["apply"]},
    "/v1/projects/{project_id}/topics/{topic}": {"topic": ["t1:publish"]},
    "/v1/projects/{project_id}/topics/{topic}/subscriptions/{subscription}": {"subscription": ["s1:pull", "s1:ack"]},
    "/v1/projects/{project_id}/services/{name}": {"name": ["svc1:set-traffic"]},
    "/v1/projects/{project_id}/indexes/{name}": {"name": ["i1:upsert", "i1:query", "i1:scroll", "i1:delete-points"]},
}


def _cases() -> list[tuple[str, str, dict[str, str]]]:
    cases = []
    for method, path in _routes():
        variants = VERBS.get(path, {}) if method == "post" else {}
        cases += [(method, path, {name: value}) for name, values in variants.items() for value in values] or [
            (method, path, {})]
    return cases


CASES = _cases()
FIELDS = _field_names()

leaves = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
          | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24)
          | st.sampled_from(["", " ", "a" * 300, "default", "fn1", "t1", "0 * * * *", "10Gi", "-1", "1.5"])
          | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2))  # lone surrogates
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
                      max_leaves=16)
bodies = (st.dictionaries(st.sampled_from(FIELDS), values, max_size=6) | values).map(
    lambda value: json.dumps(value).encode())
# What no encoder writes: nesting past any recursion limit, non-numbers, broken text.
raw_bodies = st.sampled_from([b"[" * 3000 + b"]" * 3000, b'{"a":' * 1500 + b"1" + b"}" * 1500, b'{"a": NaN}',
                              b"[1e999]", b'{"name": "\\ud800"}', b"", b"{", b"\xff\xfe{}", b"1" * 5000])


@dataclass
class World:
    """An in-memory platform, its app and the objects whose names fill the routes' paths."""

    client: httpx.AsyncClient
    platform: object
    headers: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    async def create(cls) -> World:
        from caiplatform.platform import Platform
        from caiplatform.settings import Settings
        from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD, login
        from caiplatform_server.app import create_app
        from tests.agents.agents_support import deploy, wait_settled

        platform = Platform.in_memory(Settings(
            CAI_ADMIN_EMAIL=ADMIN_EMAIL, CAI_ADMIN_PASSWORD=ADMIN_PASSWORD, CAI_INTERNAL_TOKEN="internal-for-fuzz",
            RATELIMIT_RPS=1_000_000, RATELIMIT_BURST=1_000_000))
        await platform.start()
        transport = httpx.ASGITransport(app=create_app(platform, manage_lifecycle=False), raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30)
        world = cls(client, platform, await login(client))
        await world.populate(deploy, wait_settled)
        return world

    async def make(self, path: str, body: dict, key: str | None = None) -> dict:
        r = await self.client.post(path, json=body, headers=self.headers)
        assert r.status_code < 300, (path, r.status_code, r.text)
        return r.json()

    async def populate(self, deploy, wait_settled) -> None:  # type: ignore[no-untyped-def]
        project = await self.make("/v1/projects", {"slug": "fuzz"})
        pid = project["project"]["id"] if "project" in project else project["id"]
        base = f"/v1/projects/{pid}"
        user = await self.make("/v1/users", {"email": FUZZ_USER})
        org = await self.make("/v1/orgs", {"slug": "fuzz-org", "name": "Fuzz"})
        sa = await self.make(f"{base}/service-accounts", {"name": "sa1"})
        await self.make(f"{base}/topics", {"name": "t1"})
        await self.make(f"{base}/topics/t1/subscriptions", {"name": "s1"})
        await self.make(f"{base}/indexes", {"name": "i1", "dimensions": 3})
        await self.make(f"{base}/memorystores", {"name": "m1"})
        await self.make(f"{base}/services", {"name": "svc1", "image": IMAGE})
        await self.make(f"{base}/triggers", {"name": "tr1", "target": {"service": "svc1", "path": "/tick"},
                                             "source": {"type": "schedule", "schedule": {"cron": "0 * * * *"}}})
        await self.make(f"{base}/secrets", {"name": "sec1", "value": "v"})
        r = await deploy(self.client, self.headers, "fn1", {"main.py": "def handle(event, context):\n    return event\n"},
                         project="fuzz", framework="function")
        assert r.status_code == 202, r.text
        assert (await wait_settled(self.client, self.headers, "fn1", project="fuzz"))["ready"], "fn1 not ready"
        self.params = {
            "projectID": pid, "project_id": pid, "email": FUZZ_USER, "userID": _id(user), "orgID": _id(org),
            "saID": _id(sa), "sa": _id(sa), "topic": "t1", "subscription": "s1", "agent": "fn1", "segment": "sec1",
            "session_id": "s-1", "key": "nokey", "tool": "tool", "version_verb": "1:rollback", "verb": "apply",
            "env_name": "MY_VAR", "path": "main.py",
        }

    def fill(self, path: str, overrides: dict[str, str]) -> str:
        names = {"agents": "fn1", "services": "svc1", "indexes": "i1", "memorystores": "m1", "mcpservers": "mcp1",
                 "triggers": "tr1"}

        def value(match: re.Match[str]) -> str:
            name = match.group(2).split(":")[0]
            if name in overrides:
                return overrides[name]
            if name == "name":
                return names.get(match.group(1), "thing")
            return self.params.get(name, "thing")

        return re.sub(r"([a-z-]+)[/:]\{([^}]+)\}", lambda m: m.group(0).split("{")[0] + value(m), path)

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing case
        return "World(fuzz)"

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.platform.aclose()  # type: ignore[attr-defined]


def _id(view: dict) -> str:
    for key in ("id", "user_id", "org_id", "service_account_id"):
        if isinstance(view.get(key), str):
            return view[key]
    nested = next((v for v in view.values() if isinstance(v, dict) and isinstance(v.get("id"), str)), None)
    assert nested is not None, view
    return nested["id"]


@pytest.fixture(scope="module")
def world():
    with anyio.from_thread.start_blocking_portal() as portal:
        created = portal.call(World.create)
        yield portal, created
        portal.call(created.aclose)


@pytest.mark.parametrize("method,path,overrides", CASES,
                         ids=[f"{m.upper()} {p} {' '.join(o.values())}".strip() for m, p, o in CASES])
@settings(max_examples=EXAMPLES, deadline=None, derandomize="CAI_FUZZ_EXAMPLES" not in os.environ, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies | raw_bodies)
def test_no_json_body_gets_a_5xx(world, method, path, overrides, body):
    portal, w = world
    url = w.fill(path, overrides)
    r = portal.call(lambda: w.client.request(method, url, content=body, headers={
        **w.headers, "content-type": "application/json"}))
    assert r.status_code < 500, (method, url, body[:300], r.status_code, r.text[:300])
    if r.status_code >= 400:
        answer = r.json()
        assert isinstance(answer.get("error"), str) and answer["error"], answer
        assert answer.get("request_id") == r.headers["x-request-id"], answer
