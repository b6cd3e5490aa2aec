"""Conformance suite for `VectorEngine` adapters.

Use it from a test module that defines an `engine` fixture (a started adapter) and a `backend` fixture
(its registry name), then imports the tests:

    from caiplatform.testing.conformance.vector import *  # noqa: F403

Every test uses its own randomly named collection, so suites may run in parallel against one engine,
and one engine may serve every test of the module; the filter cases share one collection per engine
(`filter_collection`), which `release_filter_collection(engine)` drops before the engine closes.
`FILTER_CASES` is the filter-grammar table: each filter with the ids it must select from `FILTER_POINTS`;
every adapter must give exactly these answers.
"""

from __future__ import annotations

import math
import secrets
import time
import weakref
from typing import Any

import anyio
import numpy as np
import pytest

from caiplatform.ports.vector import (
    CollectionConfig,
    HnswConfig,
    Point,
    Quantization,
    SearchParams,
    VectorEngine,
    VectorEngineRejected,
)

__all__ = [
    "test_create_list_info_drop",
    "test_create_twice_is_rejected",
    "test_settings_and_update",
    "test_upsert_replaces_by_id",
    "test_scroll_in_id_order_with_next_offset",
    "test_scroll_with_filter",
    "test_query_cosine_dot_euclid",
    "test_query_top_k_offset_threshold_payload_vector",
    "test_filter_grammar",
    "test_malformed_filters_are_rejected",
    "test_has_id_must_be_point_ids",
    "test_delete_by_ids_and_by_filter",
    "test_missing_collection_and_wrong_width_are_rejected",
    "test_health",
    "test_search_params_exact_and_beam",
]

notimpl = pytest.mark.notimpl

U1 = "00000000-0000-4000-8000-000000000001"
U2 = "ffffffff-0000-4000-8000-000000000002"


def apply_notimpl(request: pytest.FixtureRequest, backend: str) -> None:
    """Turn `notimpl([backends], reason=...)` into a strict xfail for the named backends."""
    for mark in request.node.iter_markers("notimpl"):
        backends = mark.args[0] if mark.args else mark.kwargs.get("backends", [])
        if backend in backends:
            reason = mark.kwargs.get("reason", "not implemented")
            request.applymarker(pytest.mark.xfail(strict=True, reason=f"notimpl[{backend}]: {reason}"))


def fresh_name() -> str:
    return "conf_" + secrets.token_hex(5)


# One point per interesting payload shape; the vector does not matter for filters.
FILTER_POINTS: list[tuple[int | str, dict[str, Any]]] = [
    (1, {"city": "Paris", "n": 1, "tags": ["a", "b"], "ok": True}),
    (2, {"city": "Berlin", "n": 2, "tags": ["b"], "ok": False}),
    (3, {"city": "paris", "n": 3.5, "tags": [], "ok": True, "geo": {"country": "fr", "zip": 75}}),
    (4, {"city": None, "n": -1, "tags": None}),
    (5, {"n": "5", "tags": ["c", None]}),
    (6, {"city": ["Paris", "Lyon"], "n": [1, 10], "ok": 1}),
    (7, {"geo": {"country": "de", "zip": 10115}, "items": [{"sku": "x", "qty": 2}, {"sku": "y", "qty": 0}]}),
    (8, {"items": [{"sku": "x", "qty": 0}], "geo": {"country": "fr"}}),
    (9, {"text": "The quick brown fox", "n": 0, "flag": False}),
    (U1, {"city": "Berlin", "n": 7, "nested": {"deep": {"v": 1}}}),
    (U2, {}),
]

ALL_IDS = [pid for pid, _ in FILTER_POINTS]


def _ids(*ids: int | str) -> list[int | str]:
    return sorted(ids, key=lambda i: (i, 0) if isinstance(i, str) else ("", i))


FILTER_CASES: list[tuple[str, dict[str, Any], list[int | str]]] = [
    ("match value string", {"must": [{"key": "city", "match": {"value": "Paris"}}]}, _ids(1, 6)),
    ("match is case sensitive", {"must": [{"key": "city", "match": {"value": "paris"}}]}, _ids(3)),
    ("match int does not match float or string", {"must": [{"key": "n", "match": {"value": 1}}]}, _ids(1, 6)),
    ("match bool is not int", {"must": [{"key": "ok", "match": {"value": True}}]}, _ids(1, 3)),
    ("match false", {"must": [{"key": "flag", "match": {"value": False}}]}, _ids(9)),
    ("match any", {"must": [{"key": "city", "match": {"any": ["Berlin", "Lyon"]}}]}, _ids(2, 6, U1)),
    ("match any in array", {"must": [{"key": "tags", "match": {"any": ["a", "c"]}}]}, _ids(1, 5)),
    ("match except", {"must": [{"key": "city", "match": {"except": ["Paris", "Berlin"]}}]}, _ids(3, 6)),
    ("match except ints", {"must": [{"key": "n", "match": {"except": [1, 2]}}]}, _ids(3, 4, 5, 6, 9, U1)),
    ("range gte lt", {"must": [{"key": "n", "range": {"gte": 1, "lt": 3.5}}]}, _ids(1, 2, 6)),
    ("range gt", {"must": [{"key": "n", "range": {"gt": 3}}]}, _ids(3, 6, U1)),
    ("range lte", {"must": [{"key": "n", "range": {"lte": 0}}]}, _ids(4, 9)),
    ("nested key", {"must": [{"key": "geo.country", "match": {"value": "fr"}}]}, _ids(3, 8)),
    ("deep nested key", {"must": [{"key": "nested.deep.v", "match": {"value": 1}}]}, _ids(U1)),
    ("array of objects key", {"must": [{"key": "items[].sku", "match": {"value": "y"}}]}, _ids(7)),
    ("indexed array key", {"must": [{"key": "tags[0]", "match": {"value": "b"}}]}, _ids(2)),
    ("should", {"should": [{"key": "city", "match": {"value": "Berlin"}},
                           {"key": "n", "range": {"gt": 3}}]}, _ids(2, 3, 6, U1)),
    ("must_not", {"must_not": [{"key": "city", "match": {"value": "Paris"}}]}, _ids(2, 3, 4, 5, 7, 8, 9, U1, U2)),
    ("must and must_not", {"must": [{"key": "n", "range": {"gte": 1}}],
                           "must_not": [{"key": "city", "match": {"value": "Berlin"}}]}, _ids(1, 3, 6)),
    ("is_empty", {"must": [{"is_empty": {"key": "tags"}}]}, _ids(3, 4, 6, 7, 8, 9, U1, U2)),
    ("is_null", {"must": [{"is_null": {"key": "city"}}]}, _ids(4)),
    ("is_null in array", {"must": [{"is_null": {"key": "tags"}}]}, _ids(4, 5)),
    ("not is_empty", {"must_not": [{"is_empty": {"key": "city"}}]}, _ids(1, 2, 3, 6, U1)),
    ("has_id", {"must": [{"has_id": [2, 9, U1, 404]}]}, _ids(2, 9, U1)),
    ("has_id upper-case uuid", {"must": [{"has_id": [U2.upper()]}]}, _ids(U2)),
    ("nested condition", {"must": [{"nested": {"key": "items", "filter": {"must": [
        {"key": "sku", "match": {"value": "x"}}, {"key": "qty", "range": {"gt": 0}}]}}}]}, _ids(7)),
    ("nested key without nested condition", {"must": [{"key": "items[].sku", "match": {"value": "x"}},
                                                      {"key": "items[].qty", "range": {"gt": 0}}]}, _ids(7)),
    ("filter as condition", {"should": [{"must": [{"key": "ok", "match": {"value": True}},
                                                  {"key": "n", "range": {"gt": 2}}]},
                                        {"has_id": [U2]}]}, _ids(3, U2)),
    ("single condition, not a list", {"must": {"key": "city", "match": {"value": "Berlin"}}}, _ids(2, U1)),
    ("empty should is no constraint", {"should": [], "must": [{"key": "n", "match": {"value": 2}}]}, _ids(2)),
    ("min_should", {"min_should": {"min_count": 2, "conditions": [
        {"key": "city", "match": {"value": "Paris"}}, {"key": "ok", "match": {"value": True}},
        {"key": "tags", "match": {"value": "a"}}]}}, _ids(1)),
    ("match text", {"must": [{"key": "text", "match": {"text": "brown QUICK"}}]}, _ids(9)),
    ("values_count", {"must": [{"key": "tags", "values_count": {"gte": 2}}]}, _ids(1, 5)),
    ("field is_empty false", {"must": [{"key": "tags", "is_empty": False}]}, _ids(1, 2, 5)),
    ("nothing matches", {"must": [{"key": "missing", "match": {"value": "x"}}]}, []),
]


def _filter_points() -> list[Point]:
    return [Point(pid, [1.0, float(i)], payload) for i, (pid, payload) in enumerate(FILTER_POINTS)]


async def _with_filter_points(engine: VectorEngine) -> str:
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=2))
    await engine.upsert(name, _filter_points())
    return name


async def _scroll_all(engine: VectorEngine, name: str, filter: dict[str, Any] | None = None) -> list[int | str]:
    records, next_offset = await engine.scroll(name, limit=1000, filter=filter)
    assert next_offset is None
    return [r.id for r in records]


_filter_collections: weakref.WeakKeyDictionary[VectorEngine, str] = weakref.WeakKeyDictionary()


async def filter_collection(engine: VectorEngine) -> str:
    """The engine's collection of exactly `FILTER_POINTS` for the filter cases: made by the first case,
    and given back by each later one the points an earlier case deleted (an upsert replaces by id, and
    the cases only delete). One collection for the 36 cases rather than one each: a Qdrant Edge shard
    costs some 30 ms of CPU and 32 MB of files to make and remove."""
    name = _filter_collections.get(engine)
    if name is None:
        name = _filter_collections[engine] = await _with_filter_points(engine)
    else:
        await engine.upsert(name, _filter_points())
    assert await _scroll_all(engine, name) == _ids(*ALL_IDS)
    return name


async def release_filter_collection(engine: VectorEngine) -> None:
    """Drop the engine's `filter_collection`, if a case made one."""
    name = _filter_collections.pop(engine, None)
    if name is not None:
        await engine.drop_collection(name)


async def test_create_list_info_drop(engine: VectorEngine) -> None:
    name = fresh_name()
    assert await engine.collection_info(name) is None
    await engine.create_collection(name, CollectionConfig(dimensions=4))
    assert name in await engine.list_collections()
    info = await engine.collection_info(name)
    assert info is not None and info.status == "green" and info.points_count == 0
    await engine.upsert(name, [Point(1, [1, 2, 3, 4]), Point(2, [0, 0, 1, 0])])
    info = await engine.collection_info(name)
    assert info is not None and (info.points_count, info.vectors_count) == (2, 2) and info.segments_count >= 1
    assert await engine.drop_collection(name) is True
    assert await engine.drop_collection(name) is False
    assert name not in await engine.list_collections()


async def test_create_twice_is_rejected(engine: VectorEngine) -> None:
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=2))
    with pytest.raises(VectorEngineRejected):
        await engine.create_collection(name, CollectionConfig(dimensions=2))
    await engine.drop_collection(name)


async def test_settings_and_update(engine: VectorEngine) -> None:
    name = fresh_name()
    config = CollectionConfig(dimensions=8, distance="dot", on_disk=True, payload_on_disk=True,
                              quantization=Quantization("scalar", 0.99, True), shards=2, replicas=2)
    await engine.create_collection(name, config)
    await engine.update_collection(name, replicas=3, payload_on_disk=False)
    with pytest.raises(VectorEngineRejected):
        await engine.update_collection(fresh_name(), replicas=2)
    binary = fresh_name()
    await engine.create_collection(binary, CollectionConfig(dimensions=8, quantization=Quantization("binary")))
    for n in (name, binary):
        await engine.upsert(n, [Point(1, [1.0] * 8)])
        assert [h.id for h in await engine.query(n, [1.0] * 8)] == [1]
        await engine.drop_collection(n)


async def test_upsert_replaces_by_id(engine: VectorEngine) -> None:
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=2, distance="dot"))
    await engine.upsert(name, [Point(1, [1, 0], {"v": 1}), Point(U1, [0, 1], {"v": 2})])
    await engine.upsert(name, [Point(1, [2, 0], {"v": 3}), Point(U1.upper(), [0, 2], {"v": 4})])
    records, _ = await engine.scroll(name)
    assert [(r.id, r.payload) for r in records] == [(1, {"v": 3}), (U1, {"v": 4})]
    hits = await engine.query(name, [1, 0], with_vector=True)
    assert hits[0].id == 1 and hits[0].vector == [2.0, 0.0] and math.isclose(hits[0].score, 2.0)
    await engine.drop_collection(name)


async def test_scroll_in_id_order_with_next_offset(engine: VectorEngine) -> None:
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=2))
    ids: list[int | str] = [U2, 10, 2, U1, 7]
    await engine.upsert(name, [Point(i, [1, 1], {"i": str(i)}) for i in ids])
    page, next_offset = await engine.scroll(name, limit=2)
    assert [r.id for r in page] == [2, 7] and next_offset == 10
    page, next_offset = await engine.scroll(name, limit=2, offset=next_offset)
    assert [r.id for r in page] == [10, U1] and next_offset == U2
    page, next_offset = await engine.scroll(name, limit=2, offset=next_offset)
    assert [r.id for r in page] == [U2] and next_offset is None
    page, next_offset = await engine.scroll(name, limit=5)
    assert len(page) == 5 and next_offset is None
    assert page[0].payload == {"i": "2"}
    page, _ = await engine.scroll(name, limit=10, offset=8)  # an offset between ids starts at the next one
    assert [r.id for r in page] == [10, U1, U2]
    await engine.drop_collection(name)


async def test_scroll_with_filter(engine: VectorEngine) -> None:
    name = await _with_filter_points(engine)
    ids = await _scroll_all(engine, name, {"must": [{"key": "city", "match": {"value": "Berlin"}}]})
    assert ids == [2, U1]
    await engine.drop_collection(name)


async def test_query_cosine_dot_euclid(engine: VectorEngine) -> None:
    vectors = {1: [1.0, 0.0], 2: [3.0, 4.0], 3: [-1.0, 0.5]}
    expected = {
        # distance: (query, ordered ids, score of the best)
        "cosine": ([2.0, 0.0], [1, 2, 3], 1.0),
        "dot": ([1.0, 1.0], [2, 1, 3], 7.0),
        "euclid": ([1.0, 0.0], [1, 3, 2], 0.0),
    }
    for distance, (query, order, best) in expected.items():
        name = fresh_name()
        await engine.create_collection(name, CollectionConfig(dimensions=2, distance=distance))
        await engine.upsert(name, [Point(i, v) for i, v in vectors.items()])
        hits = await engine.query(name, query)
        assert [h.id for h in hits] == order, distance
        assert math.isclose(hits[0].score, best, abs_tol=1e-5), (distance, hits[0].score)
        if distance == "cosine":
            assert math.isclose(hits[1].score, 0.6, abs_tol=1e-5)
            stored = (await engine.query(name, [3.0, 4.0], top_k=1, with_vector=True))[0].vector
            assert stored is not None and math.isclose(stored[0], 0.6, abs_tol=1e-6)
        if distance == "euclid":
            assert math.isclose(hits[1].score, math.dist([1, 0], [-1, 0.5]), abs_tol=1e-5)
        await engine.drop_collection(name)


async def test_query_top_k_offset_threshold_payload_vector(engine: VectorEngine) -> None:
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=2, distance="dot"))
    await engine.upsert(name, [Point(i, [float(i), 0.0], {"i": i}) for i in range(1, 21)])
    hits = await engine.query(name, [1.0, 0.0])
    assert [h.id for h in hits] == list(range(20, 10, -1))
    assert hits[0].payload == {"i": 20} and hits[0].vector is None
    hits = await engine.query(name, [1.0, 0.0], top_k=3, offset=2, with_payload=False, with_vector=True)
    assert [h.id for h in hits] == [18, 17, 16]
    assert hits[0].payload is None and hits[0].vector == [18.0, 0.0]
    hits = await engine.query(name, [1.0, 0.0], top_k=100, score_threshold=15.5)
    assert [h.id for h in hits] == [20, 19, 18, 17, 16]
    hits = await engine.query(name, [1.0, 0.0], top_k=100, offset=50)
    assert hits == []
    hits = await engine.query(name, [1.0, 0.0], top_k=5, filter={"must": [{"key": "i", "range": {"lt": 4}}]})
    assert [h.id for h in hits] == [3, 2, 1]
    euclid = fresh_name()
    await engine.create_collection(euclid, CollectionConfig(dimensions=2, distance="euclid"))
    await engine.upsert(euclid, [Point(i, [float(i), 0.0]) for i in range(1, 6)])
    hits = await engine.query(euclid, [0.0, 0.0], score_threshold=3.5)
    assert [h.id for h in hits] == [1, 2, 3]  # for distances the threshold is an upper bound
    await engine.drop_collection(name)
    await engine.drop_collection(euclid)


@pytest.mark.parametrize(("label", "spec", "expected"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
async def test_filter_grammar(engine: VectorEngine, label: str, spec: dict[str, Any], expected: list[int | str]) -> None:
    name = await filter_collection(engine)
    assert await _scroll_all(engine, name, spec) == expected, label
    hits = await engine.query(name, [1.0, 0.0], top_k=100, filter=spec)
    assert sorted((h.id for h in hits), key=lambda i: (i, 0) if isinstance(i, str) else ("", i)) == expected
    await engine.delete_points(name, filter=spec)
    assert await _scroll_all(engine, name) == [i for i in _ids(*ALL_IDS) if i not in expected]


MALFORMED_FILTERS: list[dict[str, Any]] = [
    {"must": [{"key": "a", "unknown": 1}]},
    {"must": [{"key": "a", "match": {"value": 1.5}}]},
    {"must": [{"key": "a", "match": {"any": [1, "x"]}}]},
    {"shall": []},
    {"must": "x"},
]


async def test_malformed_filters_are_rejected(engine: VectorEngine) -> None:
    name = await _with_filter_points(engine)
    try:
        for spec in MALFORMED_FILTERS:
            with pytest.raises(VectorEngineRejected):
                await engine.scroll(name, filter=spec)
            with pytest.raises(VectorEngineRejected):
                await engine.query(name, [1.0, 0.0], filter=spec)
            with pytest.raises(VectorEngineRejected):
                await engine.delete_points(name, filter=spec)
        assert await _scroll_all(engine, name) == _ids(*ALL_IDS)
    finally:
        await engine.drop_collection(name)


async def test_has_id_must_be_point_ids(engine: VectorEngine) -> None:
    name = await _with_filter_points(engine)
    try:
        with pytest.raises(VectorEngineRejected):
            await engine.scroll(name, filter={"must": [{"has_id": ["not-a-uuid"]}]})
    finally:
        await engine.drop_collection(name)


async def test_delete_by_ids_and_by_filter(engine: VectorEngine) -> None:
    name = await _with_filter_points(engine)
    await engine.delete_points(name, ids=[1, U1.upper(), 12345])
    assert 1 not in await _scroll_all(engine, name) and U1 not in await _scroll_all(engine, name)
    await engine.delete_points(name, filter={"must": [{"key": "geo.country", "match": {"value": "fr"}}]})
    assert await _scroll_all(engine, name) == _ids(2, 4, 5, 6, 7, 9, U2)
    info = await engine.collection_info(name)
    assert info is not None and info.points_count == 7
    await engine.drop_collection(name)


async def test_missing_collection_and_wrong_width_are_rejected(engine: VectorEngine) -> None:
    missing = fresh_name()
    with pytest.raises(VectorEngineRejected):
        await engine.upsert(missing, [Point(1, [1.0])])
    with pytest.raises(VectorEngineRejected):
        await engine.query(missing, [1.0])
    with pytest.raises(VectorEngineRejected):
        await engine.scroll(missing)
    with pytest.raises(VectorEngineRejected):
        await engine.delete_points(missing, ids=[1])
    name = fresh_name()
    await engine.create_collection(name, CollectionConfig(dimensions=3))
    with pytest.raises(VectorEngineRejected):
        await engine.upsert(name, [Point(1, [1.0, 2.0, 3.0]), Point(2, [1.0, 2.0])])
    with pytest.raises(VectorEngineRejected):
        await engine.query(name, [1.0, 2.0])
    info = await engine.collection_info(name)
    assert info is not None and info.points_count == 0, "a refused batch writes nothing"
    await engine.drop_collection(name)


async def test_health(engine: VectorEngine) -> None:
    await engine.health()
    assert engine.service_url()


# ------------------------------------------------------------------------------------------ search params

RECALL_POINTS, RECALL_DIMS, RECALL_QUERIES, RECALL_K = 2000, 64, 40, 10


async def wait_green(engine: VectorEngine, name: str, ceiling: float = 180.0) -> None:
    """Until the collection reports green (an engine building its index in the background says yellow)."""
    deadline = time.monotonic() + ceiling
    while True:
        info = await engine.collection_info(name)
        assert info is not None
        if info.status == "green":
            return
        assert time.monotonic() < deadline, f"{name} still {info.status} after {ceiling} s"
        await anyio.sleep(0.2)


async def _recall(engine: VectorEngine, name: str, rows: np.ndarray, queries: np.ndarray,
                  params: SearchParams | None) -> float:
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    found = 0
    for q in queries:
        truth = set(np.argsort(-(unit @ (q / np.linalg.norm(q))))[:RECALL_K].tolist())
        hits = await engine.query(name, q.tolist(), top_k=RECALL_K, with_payload=False, params=params)
        found += len(truth & {int(h.id) for h in hits})
    return found / (RECALL_K * len(queries))


async def test_search_params_exact_and_beam(engine: VectorEngine) -> None:
    """Qdrant's `params`: on uniform random vectors (the hard case for HNSW) `exact` answers exactly what
    brute force does, and a wide `hnsw_ef` finds more of the true neighbours than a narrow one where the
    engine is approximate. The collection asks for a graph at once (`indexing_threshold`, and a
    `full_scan_threshold` below its size) and a sparse one (`m` 4, `ef_construct` 8), so the graph is
    what answers an unfiltered query."""
    rng = np.random.default_rng(35)
    rows = rng.random((RECALL_POINTS, RECALL_DIMS), dtype=np.float32) - 0.5
    queries = rng.random((RECALL_QUERIES, RECALL_DIMS), dtype=np.float32) - 0.5
    name = fresh_name()
    config = CollectionConfig(dimensions=RECALL_DIMS, hnsw=HnswConfig(m=4, ef_construct=8, full_scan_threshold=10),
                              indexing_threshold=100)
    await engine.create_collection(name, config)
    try:
        for start in range(0, RECALL_POINTS, 500):
            await engine.upsert(name, [Point(start + i, row.tolist()) for i, row in enumerate(rows[start:start + 500])])
        await wait_green(engine, name)
        exact = await _recall(engine, name, rows, queries, SearchParams(exact=True))
        narrow = await _recall(engine, name, rows, queries, SearchParams(hnsw_ef=10))
        wide = await _recall(engine, name, rows, queries, SearchParams(hnsw_ef=1000))
        assert exact == 1.0
        if narrow < 1.0:  # an approximate engine: the beam must matter
            assert wide >= narrow + 0.1, (narrow, wide)
        else:  # an exact engine ignores the beam
            assert wide == 1.0
    finally:
        await engine.drop_collection(name)
