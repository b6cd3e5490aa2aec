"""The durable engines (the embedded default and Qdrant's local mode) keep every accepted change across a
reopen of the same directory, and nothing of a refused one."""

from __future__ import annotations

import pytest

from caiplatform.adapters.edge.vector import EdgeVectorEngine
from caiplatform.adapters.qdrant.vector import QdrantVectorEngine
from caiplatform.ports.vector import CollectionConfig, Point, Quantization, VectorEngineRejected

U1 = "00000000-0000-4000-8000-000000000001"


def rounded(hits):
    """Qdrant's local mode keeps float64 until it reloads its float32 copy: compare to float32 precision."""
    return [(h.id, round(h.score, 5), h.payload, [round(x, 5) for x in h.vector or []]) for h in hits]


def opener(kind: str, path):
    return (lambda: EdgeVectorEngine(path)) if kind == "edge" else (lambda: QdrantVectorEngine(path=path))


@pytest.mark.parametrize("kind", ["edge", "qdrant"])
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
        if kind == "edge":
            config = await again.collection_config("a")
            assert (config.replicas, config.quantization) == (4, Quantization("scalar", 0.95, True))
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


FORMER_SCHEMA = """
CREATE TABLE collections (name TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE points (collection TEXT NOT NULL, id TEXT NOT NULL, is_int INTEGER NOT NULL, vector BLOB NOT NULL,
                     payload TEXT NOT NULL, PRIMARY KEY (collection, id, is_int));
"""


async def test_the_former_embedded_engines_data_is_imported_once(tmp_path):
    """A data dir of an earlier version (numpy written ahead to `vectors.db`) opens with everything in it."""
    import json
    import sqlite3

    import numpy as np

    db = sqlite3.connect(tmp_path / "vectors.db")
    db.executescript(FORMER_SCHEMA)
    config = {"dimensions": 2, "distance": "euclid", "on_disk": False, "payload_on_disk": False,
              "quantization": {"kind": "none", "quantile": None, "always_ram": False}, "shards": 1, "replicas": 2}
    db.execute("INSERT INTO collections VALUES ('p_abc_docs', ?)", (json.dumps(config),))
    rows = [("7", 1, [3.0, 4.0], {"k": "far"}), (U1, 0, [0.0, 0.0], {"k": "origin"})]
    db.executemany("INSERT INTO points VALUES ('p_abc_docs', ?, ?, ?, ?)",
                   [(i, is_int, np.asarray(v, dtype=np.float32).tobytes(), json.dumps(p)) for i, is_int, v, p in rows])
    db.commit()
    db.close()

    engine = EdgeVectorEngine(tmp_path)
    await engine.start()
    try:
        assert await engine.list_collections() == ["p_abc_docs"]
        assert (await engine.collection_config("p_abc_docs")).replicas == 2
        hits = await engine.query("p_abc_docs", [3.0, 4.0])
        assert [(h.id, h.score, h.payload) for h in hits] == [(7, 0.0, {"k": "far"}), (U1, 5.0, {"k": "origin"})]
        await engine.delete_points("p_abc_docs", ids=[7])
    finally:
        await engine.close()
    assert not (tmp_path / "vectors.db").exists() and (tmp_path / "vectors.db.imported").is_file()
    again = EdgeVectorEngine(tmp_path)
    await again.start()
    try:
        assert [r.id for r in (await again.scroll("p_abc_docs"))[0]] == [U1]  # not imported twice
    finally:
        await again.close()


@pytest.mark.process  # the engine copies a shard with `cp --sparse` to build its index aside
async def test_hnsw_is_built_in_the_background_and_keeps_the_writes_made_meanwhile(tmp_path):
    """A build (forced here at 1 KB of unindexed vectors) runs on a copy in a child process; writes and
    deletes made during it are on the live shard and replayed on the copy; the index survives a reopen."""
    import asyncio

    import numpy as np

    from caiplatform.adapters.edge.indexing import IndexSettings

    rng = np.random.default_rng(1)
    rows = rng.normal(size=(3000, 8)).astype(np.float32)
    settings = IndexSettings(threshold_kb=1, full_scan_threshold_kb=1)
    engine = EdgeVectorEngine(tmp_path, index=settings)
    await engine.start()
    try:
        await engine.create_collection("c", CollectionConfig(dimensions=8, distance="dot"))
        await engine.upsert("c", [Point(i, rows[i].tolist(), {"i": i}) for i in range(2000)])
        assert (await engine.collection_info("c")).status == "yellow"  # building
        written = 0
        while engine._builder._tasks:
            await engine.upsert("c", [Point(2000 + written, rows[2000 + written].tolist(), {"i": "late"})])
            await engine.delete_points("c", ids=[written])
            written += 1
            await asyncio.sleep(0.01)
        await engine.wait_indexed()
        assert written > 0
        info = await engine.collection_info("c")
        assert info.status == "green" and info.points_count == 2000
        shard = engine._collections["c"].shard
        assert shard.info().indexed_vectors_count > 0
        records, _ = await engine.scroll("c", limit=3)
        assert [r.id for r in records] == [written, written + 1, written + 2]
        late = await engine.scroll("c", limit=1000, filter={"must": [{"key": "i", "match": {"value": "late"}}]})
        assert len(late[0]) == written
        q = rows[2500]
        exact = sorted(range(written, 2000 + written), key=lambda i: -float(rows[i] @ q))[:10]
        found = [h.id for h in await engine.query("c", q.tolist())]
        assert len(set(found) & set(exact)) >= 9  # approximate, but close
        # a filter searches exactly: every match, in the exact order
        late_only = {"must": [{"key": "i", "match": {"value": "late"}}]}
        hits = await engine.query("c", q.tolist(), top_k=1000, filter=late_only)
        assert [h.id for h in hits] == sorted(range(2000, 2000 + written), key=lambda i: -float(rows[i] @ q))
    finally:
        await engine.close()
    assert sorted(p.name for p in (tmp_path / "collections" / "c").iterdir()) == ["collection.json", "shard-1"]
    again = EdgeVectorEngine(tmp_path, index=settings)
    await again.start()
    try:
        assert (await again.collection_info("c")).points_count == 2000
        assert again._collections["c"].shard.info().indexed_vectors_count > 0
    finally:
        await again.close()


async def test_dropping_a_collection_while_its_index_builds(tmp_path):
    from caiplatform.adapters.edge.indexing import IndexSettings

    engine = EdgeVectorEngine(tmp_path, index=IndexSettings(threshold_kb=1))
    await engine.start()
    try:
        await engine.create_collection("c", CollectionConfig(dimensions=4))
        await engine.create_collection("kept", CollectionConfig(dimensions=4))
        await engine.upsert("c", [Point(i, [1.0, float(i), 0.0, 1.0]) for i in range(500)])
        assert engine._builder._tasks
        assert await engine.drop_collection("c") is True
        await engine.wait_indexed()
        assert await engine.list_collections() == ["kept"]
        assert [p.name for p in (tmp_path / "collections").iterdir()] == ["kept"]
        await engine.create_collection("c", CollectionConfig(dimensions=4))  # the name is free again
        assert (await engine.collection_info("c")).points_count == 0
    finally:
        await engine.close()
