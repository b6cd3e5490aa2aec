"""Memory store provisioner conformance: the in-memory double, the local Valkey processes (one replica, and
replicas sharing PostgreSQL) and Valkey StatefulSets on the Kubernetes API emulator."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.memorystore import *  # noqa: F403
from caiplatform.testing.conformance.memorystore import apply_notimpl
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "replicas", "kubernetes"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def provisioner(request, backend, tmp_path):
    apply_notimpl(request, kube_support.marked_as(backend))
    if backend == "kubernetes":
        from caiplatform.adapters.kubernetes.memorystore import ValkeyStatefulSetProvisioner

        async with kube_support.cluster() as cluster:
            adapter = ValkeyStatefulSetProvisioner(settings=cluster.settings)
            try:
                yield adapter
            finally:
                await adapter.close()
        return
    if backend == "replicas":
        async for adapter in _replicas(request, tmp_path):
            yield adapter
        return
    if backend == "memory":
        from caiplatform.adapters.memory.memorystore import InMemoryProvisioner

        adapter = InMemoryProvisioner()
    else:
        from caiplatform.adapters.local.memorystore import LocalValkeyProvisioner

        adapter = LocalValkeyProvisioner(tmp_path / "data")
    await adapter.start()
    try:
        yield adapter
    finally:
        await adapter.close()


async def _replicas(request, tmp_path):
    """The provisioner of replicas sharing PostgreSQL, one replica of it, on the session's database; the
    projects the suite names are created on first use (its records belong to projects)."""
    from datetime import UTC, datetime

    from caiplatform.adapters.local.memorystore_cluster import ClusterValkeyProvisioner
    from caiplatform.db import Database
    from caiplatform.db.models import Org, Project
    from caiplatform.supervisor import ProcessSupervisor
    from caiplatform.worklocks import PostgresWorkLocks

    url = request.getfixturevalue("postgres_url")
    db = Database(url)
    db.migrate()

    def project(session, project_id: str, short: str) -> None:
        if session.get(Project, project_id) is None:
            org = session.query(Org).filter(Org.slug == "conformance").first()
            if org is None:
                org = Org(slug="conformance", name="conformance", created_at=datetime.now(UTC))
                session.add(org)
                session.flush()
            session.add(Project(id=project_id, org_id=org.id, slug=project_id, name=project_id, short=short,
                                created_at=datetime.now(UTC)))

    class Seeding(ClusterValkeyProvisioner):
        async def create(self, spec, password):
            await self.db.run(lambda s: project(s, spec.project_id, spec.project_short))
            return await super().create(spec, password)

    locks = PostgresWorkLocks(url, "conformance")
    supervisor = ProcessSupervisor(tmp_path / "run")
    adapter = Seeding(db, locks, tmp_path / "data", supervisor=supervisor, replica_id="conformance")
    # Not started: no follower rounds in the background; one replica runs what it creates and does the rest
    # within the calls themselves.
    try:
        yield adapter
    finally:
        await adapter.close()
        await supervisor.stop_all()
        await locks.close()
        db.dispose()
