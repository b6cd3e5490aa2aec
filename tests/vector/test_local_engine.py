"""The durable engines (the embedded default and Qdrant's local mode) keep every accepted change across a
reopen of the same directory, and nothing of a refused one."""

from __future__ import annotations

import pytest

from caiplatform.adapters.edge.vector import EdgeVectorEngine
from caiplatform.adapters.local.vector import LocalVectorEngine
from caiplatform.adapters.qdrant.vector import QdrantVectorEngine
from caiplatform.ports.vector import CollectionConfig, Point, Quantization, VectorEngineRejected

U1 = "00000000-0000-4000-8000-000000000001"


def rounded(hits):
    """Qdrant's local mode keeps float64 until it reloads its float32 copy: compare to float32 precision."""
    return [(h.id, round(h.score, 5), h.payload, [round(x, 5) for x in h.vector or []]) for h in hits]


def opener(kind: str, path):
    if kind == "edge":
        return lambda: EdgeVectorEngine(path)
    return (lambda: LocalVectorEngine(path)) if kind == "local" else (lambda: QdrantVectorEngine(path=path))


@pytest.mark.parametrize("kind", ["local", "edge", "qdrant"])
async def test_reopen_keeps_collections_points_and_settings(tmp_path, kind):
    open_engine = opener(kind, tmp_path)
    engine = open_engine()
    await engine.start()
    config = CollectionConfig(dimensions=3, distance="cosine", quantization=Quantization("scalar", 0.95, True))
    await engine.create_collection("a", config)
    await engine.create_collection("gone", CollectionConfig(dimensions=2))
    await engine.upsert("a", [Point(i, [1.0, float(i), 0.5], {"i": i, "t": ("x", i)}) for i in range(1, 8)])
    await engine.upsert("a", [Point(U1, [0.0, 0.0, 2.0], {"u": True}), Point(3, [3.0, 0.0, 0.0], {"i": 33})])
    await engine.delete_points("a", ids=[2])
    await engine.delete_points("a", filter={"must": [{"key": "i", "range": {"gte": 6}}]})
    await engine.update_collection("a", replicas=4)
    await engine.drop_collection("gone")
    with pytest.raises(VectorEngineRejected):  # refused as a whole: nothing of it is kept
        await engine.upsert("a", [Point(9, [1.0, 1.0, 1.0]), Point(10, [1.0])])
    before_scroll = await engine.scroll("a", limit=100)
    before_query = await engine.query("a", [1.0, 2.0, 3.0], top_k=10, with_vector=True)
    await engine.close()

    again = open_engine()
    await again.start()
    try:
        assert await again.list_collections() == ["a"]
        assert await again.scroll("a", limit=100) == before_scroll
        assert [p.id for p in before_scroll[0]] == [1, 4, 5, U1]  # 3 became i=33
        assert before_scroll[0][0].payload == {"i": 1, "t": ["x", 1]}
        after_query = await again.query("a", [1.0, 2.0, 3.0], top_k=10, with_vector=True)
        assert rounded(after_query) == rounded(before_query)
        if kind == "local":
            assert again._collections["a"].config.replicas == 4
            assert again._collections["a"].config.quantization == Quantization("scalar", 0.95, True)
        # it keeps working after the reload: grows, replaces, deletes
        await again.upsert("a", [Point(i, [0.0, 1.0, 0.0]) for i in range(100, 140)])
        await again.upsert("a", [Point(1, [0.0, 0.0, 1.0], {"i": "new"})])
        info = await again.collection_info("a")
        assert info is not None and info.points_count == 44
    finally:
        await again.close()
    third = open_engine()
    await third.start()
    try:
        records, _ = await third.scroll("a", limit=1)
        assert records[0].payload == {"i": "new"}
        assert (await third.collection_info("a")).points_count == 44
    finally:
        await third.close()
