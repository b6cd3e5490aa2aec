"""The agents service's tables and rules on PostgreSQL (migrations, build claims, cascades), with the
in-memory builder and runtime."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from caiplatform.db import Database
from caiplatform.db.models.agents import Agent
from caiplatform.errors import Conflict
from caiplatform.models.agents import EmbedUpdate, SecretsPatch, SourceFileWrite
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload
from caiplatform.settings import Settings
from caiplatform.testing import engines, tiny_app

from .agents_support import FUNCTION, tarball


@pytest.fixture
def pg_url(postgres_url):
    """A database of this module's own (the session's may hold other tests' projects)."""
    with engines.fresh_postgres_database() as url:
        yield url


@pytest.fixture
async def pg_platform(pg_url):
    db = Database(pg_url)
    db.migrate()
    platform = Platform(Settings(CAI_AUTOMATION_TOKEN="t"), db=db, mode="memory")
    platform.auth.bootstrap("root@example.com", "correct horse battery staple")
    await platform.start()
    platform.runtime.app_factory = lambda image, env: tiny_app.create_app(env)
    try:
        yield platform
    finally:
        await platform.aclose()


async def test_deploy_manage_and_delete_on_postgres(pg_platform):
    agents, automation = pg_platform.agents, Principal.automation()
    upload = DeployUpload(fields={"name": "pg", "framework": "function"}, code=tarball(FUNCTION))
    await agents.deploy(automation, "default", upload)
    await agents.wait_idle()
    assert (await agents.get(automation, "pg", None)).ready
    await pg_platform.db.run(lambda s: s.execute(update(Agent).where(Agent.name == "pg").values(build_claimed_at=pg_platform.clock.now())))
    with pytest.raises(Conflict, match="a build is already in progress for agent pg"):
        await agents.redeploy(automation, "pg", None)
    await pg_platform.db.run(lambda s: s.execute(update(Agent).values(build_claimed_at=None)))
    await agents.patch_secrets(automation, "pg", None, SecretsPatch(set={"K": "v"}))
    await agents.write_file(automation, "pg", None, "extra.py", SourceFileWrite(content="X = 1\n"))
    await agents.put_embed(automation, "pg", None, EmbedUpdate(enabled=True))
    await agents.wait_idle()
    assert (await agents.get(automation, "pg", None)).latest_revision == "pg-00002"
    assert [f.path for f in (await agents.list_files(automation, "pg", None)).files] == ["extra.py", "main.py"]
    assert (await agents.delete(automation, "pg", None)).to_json() == {"agent": "pg", "deleted": True}
    assert (await agents.list(automation, None)).agents == []


async def test_the_lean_owner_gate_answers_as_the_orm_path_on_postgres(pg_platform):
    """The gate's one statement runs on the DB-API cursor (`PreparedRead`): psycopg's types (booleans,
    timestamps, JSON) come back as SQLAlchemy's own execution gives them, for every kind of caller."""
    from .test_agents_lookup import ORPHAN, SOLO, TWIN, _build, _compare, _principals

    ids = _build(pg_platform)
    for who, principal in _principals(ids).items():
        for name in (TWIN, SOLO, ORPHAN, "missing"):
            await _compare(pg_platform, who, principal, name)
