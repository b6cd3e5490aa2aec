"""The memory store provisioner of replicas sharing PostgreSQL, two of them in one process: each with its
own work-lock connection, supervisor and data dir, real Valkey processes.

A replica whose database session ends without stopping its processes (a kill -9 of the platform alone)
leaves its Valkey running: the one taking over stops it through the folder's pid file and serves the
same data on the same address. Restart (a rotation) and delete through the replica that does not run
the instance are done by the one that does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from caiplatform.adapters.local.memorystore_cluster import ClusterValkeyProvisioner
from caiplatform.db import Database
from caiplatform.db.models import Org, Project
from caiplatform.domain.memorystore import InstanceSpec, State
from caiplatform.errors import Conflict
from caiplatform.supervisor import ProcessSupervisor
from caiplatform.testing import engines
from caiplatform.worklocks import PostgresWorkLocks


@pytest.fixture
def pg_url(postgres_url):
    with engines.fresh_postgres_database() as url:
        yield url


@pytest.fixture
def project_id(pg_url) -> str:
    db = Database(pg_url)
    db.migrate()

    def seed(session) -> str:
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        org = Org(slug="o", name="o", created_at=now)
        session.add(org)
        session.flush()
        project = Project(org_id=org.id, slug="p", name="p", short="p1234567", created_at=now)
        session.add(project)
        session.flush()
        return project.id

    try:
        return db.run_sync(seed)
    finally:
        db.dispose()


class Replica:
    def __init__(self, url: str, root: Path, name: str):
        self.db = Database(url)
        self.locks = PostgresWorkLocks(url, name)
        self.supervisor = ProcessSupervisor(root / name / "run")
        self.provisioner = ClusterValkeyProvisioner(self.db, self.locks, root / name, supervisor=self.supervisor,
                                                    replica_id=name, interval=0.2)

    async def close(self) -> None:
        await self.provisioner.close()
        await self.supervisor.stop_all()
        await self.locks.close()
        self.db.dispose()

    async def die(self) -> None:
        """The database session ends, the processes stay (as after a kill -9 of the platform alone)."""
        await self.provisioner._follower.close()
        for process in self.supervisor.processes:
            process._stopping = True  # a dead supervisor restarts nothing
        self.supervisor._procs.clear()
        await self.locks.close()
        self.db.dispose()


async def _until(check, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)
    return value


async def test_a_dead_replica_s_instance_is_taken_over_with_its_data_and_address(pg_url, project_id, tmp_path):
    a, b = Replica(pg_url, tmp_path, "ra"), Replica(pg_url, tmp_path, "rb")
    try:
        await a.provisioner.start()
        await b.provisioner.start()
        spec = InstanceSpec(project_id=project_id, project_short="p1234567", name="cache")
        created = await a.provisioner.create(spec, "first-password")
        assert created.state is State.PROVISIONING
        with pytest.raises(Conflict):
            await b.provisioner.create(spec, "other")
        ready = await _until(lambda: _ready(b, project_id), "not ready as read through b")
        client = aioredis.Redis(host=ready.host, port=ready.port, password="first-password")
        await client.set("kept", "yes")
        assert "redis_version" in await b.provisioner.info(project_id, "cache")  # b reads a's instance

        # A rotation through b: a restarts the instance with the new password.
        await b.provisioner.rotate_password(project_id, "cache", "second-password")
        await b.provisioner.restart(project_id, "cache")
        await _until(lambda: _ready(b, project_id), "not ready after the restart")
        client = aioredis.Redis(host=ready.host, port=ready.port, password="second-password")
        assert await client.get("kept") == b"yes"
        await client.save()

        pid = int((Path(a.provisioner._running[created_row(a)].folder) / "valkey.pid").read_text())
        await b.provisioner._follower.close()  # b does not take it over until it read it gone
        await a.die()
        gone = await _until(lambda: _degraded(b, project_id), "read ready with its replica gone", timeout=5)
        assert "ra" in gone.message and "takes it over" in gone.message
        b.provisioner._follower.start()
        taken = await _until(lambda: _ready(b, project_id), "b did not take it over", timeout=10)
        assert (taken.host, taken.port) == (ready.host, ready.port)  # clients keep their address
        assert not Path(f"/proc/{pid}").exists()  # the server a left behind was stopped first
        assert await aioredis.Redis(host=taken.host, port=taken.port, password="second-password").get("kept") == b"yes"

        # a comes back: b runs the instance, a deletes it, b destroys it.
        a = Replica(pg_url, tmp_path, "ra")
        await a.provisioner.start()
        assert not a.provisioner._running
        deleted = await a.provisioner.delete(project_id, "cache")
        assert deleted is not None and deleted.state is State.DELETING
        assert await b.provisioner.get(project_id, "cache") is None
        await _until(lambda: _no_folders(tmp_path), "the folder was not destroyed", timeout=10)
    finally:
        await a.close()
        await b.close()


def created_row(replica: Replica) -> str:
    return next(iter(replica.provisioner._running))


async def _ready(replica: Replica, project_id: str):
    found = await replica.provisioner.get(project_id, "cache")
    return found if found is not None and found.ready else None


async def _degraded(replica: Replica, project_id: str):
    found = await replica.provisioner.get(project_id, "cache")
    return found if found is not None and found.state is State.DEGRADED else None


async def _no_folders(root: Path) -> bool:
    return not any(root.glob("*/memorystores/*/cache.*"))


async def test_instances_a_single_replica_recorded_in_its_data_dir_are_adopted_with_their_data(pg_url, project_id,
                                                                                              tmp_path):
    from caiplatform.adapters.local.memorystore import LocalValkeyProvisioner

    supervisor = ProcessSupervisor(tmp_path / "ra" / "run")
    single = LocalValkeyProvisioner(tmp_path / "ra", supervisor=supervisor)
    await single.start()
    spec = InstanceSpec(project_id=project_id, project_short="p1234567", name="cache")
    await single.create(spec, "old-password")
    ready = await _until(lambda: _single_ready(single, project_id), "the single replica's instance is not ready")
    await aioredis.Redis(host=ready.host, port=ready.port, password="old-password").set("kept", "yes")
    await single.rotate_password(project_id, "cache", "new-password")  # pending: applied at the next start
    await single.close()  # Valkey writes its data on the way out
    await supervisor.stop_all()

    a = Replica(pg_url, tmp_path, "ra")
    try:
        await a.provisioner.start()
        adopted = await _until(lambda: _ready(a, project_id), "the adopted instance is not ready")
        assert (adopted.host, adopted.port) == (ready.host, ready.port)
        client = aioredis.Redis(host=adopted.host, port=adopted.port, password="new-password")
        assert await client.get("kept") == b"yes"
        assert not list((tmp_path / "ra" / "memorystores").glob("*/*/instance.json"))  # the database has it now
    finally:
        await a.close()


async def _single_ready(provisioner, project_id: str):
    found = await provisioner.get(project_id, "cache")
    return found if found is not None and found.ready else None
