"""Generated filters (hypothesis) give identical answers on the in-memory engine (the hand-written
evaluator of `domain/vector_filter.py`) and on Qdrant Edge (Qdrant's own)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caiplatform.adapters.edge.vector import EdgeVectorEngine
from caiplatform.adapters.memory.vector import InMemoryVectorEngine
from caiplatform.ports.vector import CollectionConfig, Point, VectorEngineRejected
from caiplatform.testing.conformance.vector import FILTER_POINTS

KEYS = ["city", "n", "tags", "ok", "flag", "geo.country", "geo.zip", "items[].sku", "items[].qty",
        "nested.deep.v", "missing"]
STRINGS = ["Paris", "paris", "Berlin", "Lyon", "a", "b", "c", "x", "y", "fr", "de", "5"]
INTS = [-1, 0, 1, 2, 3, 5, 7, 10, 75, 10115]

keys = st.sampled_from(KEYS)
numbers = st.one_of(st.sampled_from(INTS), st.floats(min_value=-2, max_value=12, allow_nan=False).map(lambda f: round(f, 2)))
match = st.one_of(
    st.builds(lambda v: {"value": v}, st.one_of(st.sampled_from(STRINGS), st.sampled_from(INTS), st.booleans())),
    st.builds(lambda v: {"any": v}, st.one_of(st.lists(st.sampled_from(STRINGS), max_size=3),
                                              st.lists(st.sampled_from(INTS), max_size=3))),
    st.builds(lambda v: {"except": v}, st.one_of(st.lists(st.sampled_from(STRINGS), max_size=3),
                                                 st.lists(st.sampled_from(INTS), max_size=3))),
)


def _range(bounds: dict[str, float | None]) -> dict[str, float]:
    return {k: v for k, v in bounds.items() if v is not None}


ranges = st.fixed_dictionaries({k: st.one_of(st.none(), numbers) for k in ("gt", "gte", "lt", "lte")}).map(_range)
ids = st.sampled_from([pid for pid, _ in FILTER_POINTS] + [404])

leaf = st.one_of(
    st.builds(lambda k, m: {"key": k, "match": m}, keys, match),
    st.builds(lambda k, r: {"key": k, "range": r}, keys, ranges),
    st.builds(lambda k: {"is_empty": {"key": k}}, keys),
    st.builds(lambda k: {"is_null": {"key": k}}, keys),
    st.builds(lambda k, b: {"key": k, "is_empty": b}, keys, st.booleans()),
    st.builds(lambda v: {"has_id": v}, st.lists(ids, max_size=3)),
    st.builds(lambda m: {"nested": {"key": "items", "filter": {"must": [{"key": "sku", "match": m}]}}}, match),
)


def _filter(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    clause = st.lists(children, max_size=3)
    return st.fixed_dictionaries({}, optional={"must": clause, "should": clause, "must_not": clause})


filters = st.recursive(leaf, _filter, max_leaves=6).map(lambda f: f if "key" not in f and "has_id" not in f
                                                        and "is_empty" not in f and "is_null" not in f
                                                        and "nested" not in f else {"must": [f]})


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    loop = asyncio.new_event_loop()
    memory = InMemoryVectorEngine()
    edge = EdgeVectorEngine(tmp_path_factory.mktemp("edge"))
    points = [Point(pid, [1.0, float(i)], payload) for i, (pid, payload) in enumerate(FILTER_POINTS)]

    async def setup() -> None:
        for engine in (memory, edge):
            await engine.start()
            await engine.create_collection("eq", CollectionConfig(dimensions=2))
            await engine.upsert("eq", points)

    loop.run_until_complete(setup())
    yield loop, memory, edge
    loop.run_until_complete(edge.close())
    loop.close()


def _answer(loop, engine, spec) -> Any:
    async def run() -> Any:
        try:
            records, _ = await engine.scroll("eq", limit=100, filter=spec)
            hits = await engine.query("eq", [1.0, 0.5], top_k=100, filter=spec)
        except VectorEngineRejected:
            return "rejected"
        return [r.id for r in records], sorted(map(str, (h.id for h in hits)))

    return loop.run_until_complete(run())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=filters)
def test_generated_filters_answer_alike(engines, spec):
    loop, memory, edge = engines
    assert _answer(loop, memory, spec) == _answer(loop, edge, spec), spec
