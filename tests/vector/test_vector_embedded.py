"""The embedded default (Qdrant Edge in the data dir): index records and points survive a restart."""

from __future__ import annotations

import pytest

from caiplatform.models.vector import IndexCreate, IndexUpsert
from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client


async def test_restart_keeps_indexes_and_points(tmp_path, settings, project_of):
    first = Platform.embedded(tmp_path, settings)
    await first.start()
    try:
        project = await project_of(first)
        base = f"/v1/projects/{project.id}/indexes"
        async with asgi_client(first, ["vectordb"]) as c:
            assert (await c.post(base, headers=project.member, json={"name": "kept", "dimensions": 3,
                                                                     "distance": "euclid"})).status_code == 201
            got = (await c.get(f"{base}/kept", headers=project.member)).json()
            assert got["ready"] is True and got["collection_status"] == "green"
            r = await c.post(f"{base}/kept:upsert", headers=project.member, json={"points": [
                {"id": 1, "vector": [0, 0, 0], "payload": {"k": "origin"}},
                {"id": 2, "vector": [3, 4, 0], "payload": {"k": "far"}}]})
            assert r.status_code == 200
            # An index whose collection could not be created stays pending, to be finished by the next start.
            engine = first.vector_engine
            original = engine.create_collection

            async def refuse(*args, **kwargs):
                raise ConnectionError("engine down")

            engine.create_collection = refuse
            assert (await c.post(base, headers=project.member, json={"name": "late", "dimensions": 2})).status_code == 201
            await first.indexes.wait_reconciled()
            assert (await c.get(f"{base}/late", headers=project.member)).json()["state"] == "pending"
            engine.create_collection = original
    finally:
        await first.aclose()
    assert (tmp_path / "vectors" / "collections").is_dir()

    second = Platform.embedded(tmp_path, settings)
    await second.start()
    try:
        await second.indexes.wait_reconciled()
        async with asgi_client(second, ["vectordb"]) as c:
            listed = (await c.get(base, headers=project.member)).json()
            assert [(i["name"], i["state"]) for i in listed["indexes"]] == [("kept", "ready"), ("late", "ready")]
            kept = listed["indexes"][0]
            assert kept["points_count"] == 2 and kept["distance"] == "euclid" and kept["dimensions"] == 3
            hits = (await c.post(f"{base}/kept:query", headers=project.member, json={"vector": [3, 4, 0]})).json()
            assert [(h["id"], h["score"], h["payload"]) for h in hits["results"]] == [
                (2, 0.0, {"k": "far"}), (1, 5.0, {"k": "origin"})]
            assert (await c.delete(f"{base}/kept", headers=project.admin)).status_code == 204
    finally:
        await second.aclose()


@pytest.mark.parametrize(
    ("env", "engine", "where"),
    [
        ({}, "EdgeVectorEngine", "vectors"),
        ({"CAI_VECTOR_ENGINE": "local"}, "EdgeVectorEngine", "vectors"),  # the former engine's name
        ({"CAI_VECTOR_ENGINE": "qdrant-local"}, "QdrantVectorEngine", "qdrant"),
        ({"CAI_QDRANT_URL": "http://127.0.0.1:1"}, "QdrantVectorEngine", None),
    ],
)
async def test_engine_choice(tmp_path, settings, env, engine, where):
    chosen = settings.model_copy(update={
        "vector_engine": env.get("CAI_VECTOR_ENGINE", "edge"), "qdrant_url": env.get("CAI_QDRANT_URL")})
    platform = Platform.embedded(tmp_path, chosen)
    try:
        assert type(platform.vector_engine).__name__ == engine
        if where == "vectors":
            assert platform.vector_engine.directory == tmp_path / "vectors"
        elif where == "qdrant":
            assert platform.vector_engine.path == tmp_path / "qdrant"
        else:
            assert platform.vector_engine.url == "http://127.0.0.1:1"
            status, body = await platform.indexes.health()  # nothing listens there
            assert status == 503 and body.dependencies.vector_store.ok is False
    finally:
        await platform.aclose()


async def test_deleting_a_project_drops_its_collections_even_before_start(tmp_path, settings):
    """The embedded engine: a deleted project's collections leave the data dir, on a running platform and
    on one that was never started (deleting a project opens the engine for it); others stay."""
    from caiplatform.adapters.edge.vector import EdgeVectorEngine
    from caiplatform.domain.vector import collection_name
    from caiplatform.testing.users import bootstrap_admin, delete_project, new_project

    first = Platform.embedded(tmp_path, settings)
    await first.start()
    try:
        admin = await bootstrap_admin(first)
        projects = [await new_project(first, slug) for slug in ("gone-now", "gone-later", "kept")]
        for project in projects:
            await first.indexes.create(admin, project.id, IndexCreate(name="docs", dimensions=2))
            await first.indexes.upsert(admin, project.id, "docs", IndexUpsert.parse({"points": [{"id": 1, "vector": [1, 0]}]}))
        collections = [collection_name(p.short, "docs") for p in projects]
        assert all([await first.vector_engine.collection_info(c) for c in collections])

        await delete_project(first, projects[0].id)
        assert await first.vector_engine.collection_info(collections[0]) is None
        assert await first.indexes.purge_project(projects[0].id) == 0
    finally:
        await first.aclose()

    second = Platform.embedded(tmp_path, settings)  # not started: its vector area is not even built
    try:
        assert "indexes" not in vars(second)
        await delete_project(second, projects[1].id)
    finally:
        await second.aclose()

    engine = EdgeVectorEngine(tmp_path / "vectors")
    await engine.start()
    try:
        assert await engine.list_collections() == [collections[2]]
    finally:
        await engine.close()


async def test_edge_answers_bounded_queries_on_the_loop_and_the_rest_in_a_thread(tmp_path, monkeypatch):
    """A graph walk plus a small scan is answered without a worker thread; a filtered or exact search,
    or a collection whose unindexed part is larger than the bound, still runs in one (issue 35)."""
    from caiplatform.adapters.edge import vector as edge_vector
    from caiplatform.ports.vector import CollectionConfig, Point, SearchParams

    engine = edge_vector.EdgeVectorEngine(tmp_path)
    await engine.start()
    try:
        await engine.create_collection("c", CollectionConfig(dimensions=2))
        await engine.upsert("c", [Point(1, [1.0, 0.0], {"k": "a"}), Point(2, [0.0, 1.0], {"k": "b"})])
        threaded: list[str] = []
        original = engine._read

        async def read(collection, fn):
            threaded.append(collection.name)
            return await original(collection, fn)

        monkeypatch.setattr(engine, "_read", read)
        assert [h.id for h in await engine.query("c", [1.0, 0.1], top_k=1)] == [1]
        assert threaded == []
        assert [h.id for h in await engine.query("c", [1.0, 0.1], top_k=1, filter={"must": [
            {"key": "k", "match": {"value": "b"}}]})] == [2]
        assert [h.id for h in await engine.query("c", [1.0, 0.1], top_k=1, params=SearchParams(exact=True))] == [1]
        assert threaded == ["c", "c"]
        monkeypatch.setattr(edge_vector, "INLINE_SCAN_BYTES", 8)
        assert [h.id for h in await engine.query("c", [1.0, 0.1], top_k=1)] == [1]
        assert threaded == ["c", "c", "c"]
    finally:
        await engine.close()
