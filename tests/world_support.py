"""A platform full of objects for the tests that walk every route: the fuzz test and the contract test.

An in-memory platform served in process, the admin signed in, and one of each object (project, user,
org, service account, topic and subscription, index, memory store, service, trigger, secret, a deployed
function) whose names fill the routes' path parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

IMAGE = "registry.local/cai-test-fuzz@sha256:" + "c" * 64
FUZZ_USER = "fuzz.user@example.com"

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

    @classmethod
    async def served(cls, base_url: str) -> World:
        """The same objects on a live `caiplatform serve` (its admin from `caiplatform.testing.http`)."""
        from caiplatform.testing.http import login
        from tests.agents.agents_support import deploy, wait_settled

        client = httpx.AsyncClient(base_url=base_url, timeout=60)
        world = cls(client, None, await login(client))
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
                 "secrets": "sec1",
                 "triggers": "tr1"}

        def value(match: re.Match[str]) -> str:
            name = match.group(2).split(":")[0]
            if name in overrides:
                return overrides[name]
            if name == "name":
                return names.get(match.group(1), "thing")
            return self.params.get(name, "thing")

        return re.sub(r"([a-z-]+)[/:]\{([^}]+)\}", lambda m: m.group(0).split("{")[0] + value(m), path)

    def path_value(self, path: str, name: str, pick: int = 0) -> str | None:
        """A value of the world for the path parameter `name` of `path` (None: none fits). For a route whose
        last segment carries a method (`name:verb`), `pick` chooses among its methods."""
        variants = VERBS.get(path, {}).get(name)
        if variants:
            return variants[pick % len(variants)]
        match = re.search(r"([a-z-]+)[/:]\{" + re.escape(name) + r"\}", path)
        if match is None:
            return self.params.get(name)
        filled = self.fill(match.group(0), {})
        return filled[len(match.group(1)) + 1:]

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing case
        return "World(fuzz)"

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.platform is not None:
            await self.platform.aclose()  # type: ignore[attr-defined]


def _id(view: dict) -> str:
    for key in ("id", "user_id", "org_id", "service_account_id"):
        if isinstance(view.get(key), str):
            return view[key]
    nested = next((v for v in view.values() if isinstance(v, dict) and isinstance(v.get("id"), str)), None)
    assert nested is not None, view
    return nested["id"]

