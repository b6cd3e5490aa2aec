"""The same rules through the library: `platform.indexes` with a principal, typed errors, the bare port."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project
from caiplatform.errors import BadRequest, Conflict, NotFound
from caiplatform.models.vector import (
    IndexCreate,
    IndexDeletePoints,
    IndexQuery,
    IndexQueryResult,
    IndexScroll,
    IndexUpsert,
    data_request,
)
from caiplatform.ports.vector import CollectionConfig, Point


async def test_library_calls_enforce_the_api_rules(platform):
    admin = await platform.auth.authenticate(platform.settings.automation_token)
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    indexes = platform.indexes

    created = await indexes.create(admin, project_id, IndexCreate(name="notes", dimensions=2, distance="l2"))
    assert created.state == "pending" and created.distance == "euclid"
    with pytest.raises(Conflict, match="^an index with that name already exists$"):
        await indexes.create(admin, project_id, IndexCreate(name="notes"))
    upserted = await indexes.upsert(admin, project_id, "notes", IndexUpsert.parse(
        {"points": [{"id": 1, "vector": [0, 0]}, {"id": 2, "vector": [1, 1]}]}))
    assert (upserted.index, upserted.upserted_count) == ("notes", 2)
    found = await indexes.query(admin, project_id, "notes", IndexQuery(vector=[1, 1], top_k=1))
    assert isinstance(found, IndexQueryResult) and found.index == "notes"
    assert [(hit.id, hit.score, hit.payload) for hit in found.results] == [(2, 0.0, {})]
    assert found.to_json() == {"index": "notes", "results": [{"id": 2, "score": 0.0, "payload": {}}]}
    with pytest.raises(BadRequest, match=r'^point 0 has 3 dimensions; index "notes" expects 2$'):
        await indexes.upsert(admin, project_id, "notes", IndexUpsert.parse({"points": [{"vector": [1, 2, 3]}]}))
    page = await indexes.data(admin, project_id, "notes", data_request("scroll", {"limit": 1}))
    assert page.to_json() == {"index": "notes", "points": [{"id": 1, "payload": {}}], "next_offset": 2}
    assert isinstance(data_request("scroll", {}), IndexScroll)
    deleted = await indexes.delete_points(admin, project_id, "notes", IndexDeletePoints(ids=[1]))
    assert deleted.ids_requested == 1 and deleted.status == "ok"
    with pytest.raises(BadRequest, match="^provide exactly one of ids or filter$"):
        IndexDeletePoints.parse({})
    with pytest.raises(BadRequest, match='^unknown field "top_kk"$'):
        IndexQuery.parse({"vector": [1, 1], "top_kk": 1})
    with pytest.raises(NotFound):
        await indexes.get(admin, project_id, "absent")
    await indexes.delete(admin, project_id, "notes")
    with pytest.raises(NotFound):
        await indexes.get(admin, project_id, "notes")


async def test_the_bare_port_without_index_records(platform):
    """How another area (agents' long-term memory) uses the engine: its own collection, no record."""
    engine = platform.vector_engine
    await engine.create_collection("mem_agent_1", CollectionConfig(dimensions=3))
    await engine.upsert("mem_agent_1", [Point(1, [1, 0, 0], {"user": "u1"}), Point(2, [0, 1, 0], {"user": "u2"})])
    only_u1 = {"must": [{"key": "user", "match": {"value": "u1"}}]}
    assert [h.id for h in await engine.query("mem_agent_1", [1, 1, 0], filter=only_u1)] == [1]
    await engine.delete_points("mem_agent_1", filter=only_u1)
    assert [r.id for r in (await engine.scroll("mem_agent_1"))[0]] == [2]
    assert await engine.drop_collection("mem_agent_1")
