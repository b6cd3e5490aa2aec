"""The Qdrant adapter's server path without a server: the requests it builds (read back with
qdrant-client's REST models), how each kind of Qdrant answer maps onto the spec's errors, and the
per-project credential against Qdrant's JWT RBAC (`caiplatform.testing.qdrant_rest.QdrantRestFake`)."""

from __future__ import annotations

import json

import anyio.to_thread
import httpx
import pytest
from qdrant_client import QdrantClient
from qdrant_client.http import models
from qdrant_client.http.exceptions import UnexpectedResponse

from caiplatform.adapters.qdrant.vector import QdrantUnavailable, QdrantVectorEngine
from caiplatform.ports.vector import (
    CollectionConfig,
    HnswConfig,
    Point,
    Quantization,
    SearchParams,
    VectorEngineRejected,
)
from caiplatform.testing.qdrant_rest import QdrantRestFake

MASTER_KEY = "engine-master-key-of-at-least-32-bytes"
U1 = "00000000-0000-4000-8000-000000000001"


@pytest.fixture
async def served():
    fake = QdrantRestFake(api_key=MASTER_KEY)
    engine = QdrantVectorEngine("https://qdrant.test:6333", api_key=MASTER_KEY, transport=fake)
    await engine.start()
    try:
        yield fake, engine
    finally:
        await engine.close()
        await anyio.to_thread.run_sync(fake.shutdown)


def sent(fake: QdrantRestFake, method: str, suffix: str) -> dict:
    return [body for m, path, body in fake.requests if m == method and path.endswith(suffix)][-1]


async def test_requests_follow_qdrants_rest_models(served):
    fake, engine = served
    config = CollectionConfig(dimensions=3, distance="dot", on_disk=True, payload_on_disk=True,
                              quantization=Quantization("scalar", 0.95, True), shards=2, replicas=3)
    await engine.create_collection("docs", config)
    create = models.CreateCollection.model_validate(sent(fake, "PUT", "/collections/docs"))
    assert create.vectors == models.VectorParams(size=3, distance=models.Distance.DOT, on_disk=True)
    assert (create.shard_number, create.replication_factor, create.on_disk_payload) == (2, 3, True)
    assert create.quantization_config == models.ScalarQuantization(
        scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.95, always_ram=True))

    await engine.update_collection("docs", replicas=2, payload_on_disk=False)
    update = models.UpdateCollection.model_validate(sent(fake, "PATCH", "/collections/docs"))
    assert update.params == models.CollectionParamsDiff(replication_factor=2, on_disk_payload=False)

    await engine.upsert("docs", [Point(1, [1, 0, 0], {"k": "a"}), Point(U1, [0, 1, 0])])
    upsert = models.PointsList.model_validate(sent(fake, "PUT", "/collections/docs/points"))
    assert [(p.id, p.vector, p.payload) for p in upsert.points] == [(1, [1.0, 0.0, 0.0], {"k": "a"}),
                                                                    (U1, [0.0, 1.0, 0.0], {})]

    flt = {"must": [{"key": "k", "match": {"value": "a"}}, {"has_id": [1, U1.upper()]}]}
    hits = await engine.query("docs", [1, 0, 0], top_k=5, offset=1, filter=flt, with_vector=True,
                              score_threshold=-1.0)
    query = models.QueryRequest.model_validate(sent(fake, "POST", "/points/query"))
    assert (query.limit, query.offset, query.with_vector, query.score_threshold) == (5, 1, True, -1.0)
    assert query.filter == models.Filter.model_validate({"must": [{"key": "k", "match": {"value": "a"}},
                                                                  {"has_id": [1, U1]}]})
    assert hits == []  # offset 1 skips the only match

    records, next_offset = await engine.scroll("docs", limit=1, offset=0)
    scroll = models.ScrollRequest.model_validate(sent(fake, "POST", "/points/scroll"))
    assert (scroll.limit, scroll.offset, scroll.with_vector) == (1, 0, False)
    assert [r.id for r in records] == [1] and next_offset == U1

    await engine.delete_points("docs", ids=[1])
    assert models.PointIdsList.model_validate(sent(fake, "POST", "/points/delete")).points == [1]
    await engine.delete_points("docs", filter={"must": [{"has_id": [U1]}]})
    assert models.FilterSelector.model_validate(sent(fake, "POST", "/points/delete")).filter is not None
    info = await engine.collection_info("docs")
    assert info is not None and (info.status, info.points_count) == ("green", 0)


async def test_refusals_and_failures_map_onto_the_spec(served):
    fake, engine = served
    await engine.create_collection("docs", CollectionConfig(dimensions=2))
    # Qdrant's own refusals, in its words
    with pytest.raises(VectorEngineRejected, match="Not found: Collection `nope` doesn't exist!"):
        await engine.query("nope", [1, 0])
    with pytest.raises(VectorEngineRejected, match="Vector dimension error: expected dim: 2, got 3"):
        await engine.upsert("docs", [Point(1, [1, 2, 3])])
    with pytest.raises(VectorEngineRejected, match="already exists"):
        await engine.create_collection("docs", CollectionConfig(dimensions=2))
    with pytest.raises(VectorEngineRejected, match="invalid point id 'not-a-uuid'"):
        await engine.scroll("docs", filter={"must": [{"has_id": ["not-a-uuid"]}]})
    # any 4xx answer is a refusal of the request; the words are Qdrant's, or the status when it gave none
    for status, body, words in [
        (400, {"status": {"error": "Bad request: Wrong input"}}, "Bad request: Wrong input"),
        (404, {"status": {"error": "Not found: Collection `x` doesn't exist!"}}, "Not found: Collection"),
        (409, {"status": {"error": "Wrong input: Collection `docs` already exists!"}}, "already exists"),
        (422, {"status": {"error": "Validation error"}}, "Validation error"),
        (400, "not json", "400 Bad Request"),
    ]:
        fake.fail_next = (status, json.dumps(body).encode() if isinstance(body, dict) else body.encode())
        with pytest.raises(VectorEngineRejected, match=words):
            await engine.scroll("docs")
    # the engine refusing the platform's key, throttling or failing is not the caller's fault
    for status in (401, 403, 429, 500, 503):
        fake.fail_next = (status, json.dumps({"status": {"error": "nope"}}).encode())
        with pytest.raises(QdrantUnavailable, match=f"Qdrant answered {status}: nope"):
            await engine.query("docs", [1, 0])
    assert (await engine.scroll("docs"))[0] == []


async def test_concurrent_calls_share_the_client(served):
    """The server path runs calls side by side (up to its limiter's 16 threads) on one client."""
    import asyncio

    fake, engine = served
    await engine.create_collection("docs", CollectionConfig(dimensions=2, distance="dot"))
    await asyncio.gather(*(engine.upsert("docs", [Point(i, [float(i), 1.0])]) for i in range(1, 41)))
    answers = await asyncio.gather(*(engine.query("docs", [1.0, 0.0], top_k=3) for _ in range(40)))
    assert all([h.id for h in hits] == [40, 39, 38] for hits in answers)


async def test_unreachable_server_is_not_a_refusal():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    engine = QdrantVectorEngine("http://qdrant.test:6333", transport=httpx.MockTransport(refuse))
    try:
        with pytest.raises(Exception) as caught:
            await engine.health()
        assert not isinstance(caught.value, VectorEngineRejected)
    finally:
        await engine.close()


async def test_the_per_project_token_reaches_only_its_collections(settings, clock, project_of):
    """The credential the API mints under access control: accepted by Qdrant's RBAC for read and write
    on the listed collections, refused for others and for creating collections."""
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    enforced = settings.model_copy(update={"vector_access_control": True, "qdrant_api_key": MASTER_KEY})
    platform = Platform.in_memory(enforced, clock=clock)
    await platform.start()
    fake = QdrantRestFake(api_key=MASTER_KEY, now=clock.time)
    try:
        project = await project_of(platform)
        async with asgi_client(platform, ["vectordb"]) as http:
            created = await http.post(f"/v1/projects/{project.id}/indexes", headers=project.member,
                                      json={"name": "one", "dimensions": 2})
            assert created.status_code == 201
            body = (await http.get(f"/v1/projects/{project.id}/vectordb/credentials", headers=project.admin)).json()
        own, other = f"p_{project.short}_one", "p_someone_else"

        def as_engine_owner() -> None:
            master = QdrantClient(url="https://qdrant.test:6333", api_key=MASTER_KEY, transport=fake,
                                  check_compatibility=False)
            for name in (own, other):
                master.create_collection(name, vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))

        def as_project() -> None:
            client = QdrantClient(url="https://qdrant.test:6333", api_key=body["token"], transport=fake,
                                  check_compatibility=False)
            client.upsert(own, points=[models.PointStruct(id=1, vector=[1.0, 0.0], payload={"a": 1})], wait=True)
            assert [p.id for p in client.query_points(own, query=[1.0, 0.0]).points] == [1]
            assert [c.name for c in client.get_collections().collections] == [own]
            for forbidden in (
                lambda: client.scroll(other),
                lambda: client.create_collection("p_new", vectors_config=models.VectorParams(
                    size=2, distance=models.Distance.DOT)),
                lambda: client.delete_collection(own),
            ):
                with pytest.raises(UnexpectedResponse) as refused:
                    forbidden()
                assert refused.value.status_code == 403
            wrong = QdrantClient(url="https://qdrant.test:6333", api_key=body["token"] + "x", transport=fake,
                                 check_compatibility=False)
            with pytest.raises(UnexpectedResponse) as refused:
                wrong.scroll(own)
            assert refused.value.status_code == 401
            clock.advance(3601)  # the token lives one hour
            with pytest.raises(UnexpectedResponse) as refused:
                client.scroll(own)
            assert refused.value.status_code == 401

        await anyio.to_thread.run_sync(as_engine_owner)
        await anyio.to_thread.run_sync(as_project)
    finally:
        await anyio.to_thread.run_sync(fake.shutdown)
        await platform.aclose()


async def test_search_knobs_pass_through_unchanged(served):
    """`hnsw_config`, `indexing_threshold` and a query's `params` reach the server as Qdrant's own fields;
    what the caller did not set is not sent, so the server's defaults apply."""
    fake, engine = served
    await engine.create_collection("knobs", CollectionConfig(
        dimensions=3, hnsw=HnswConfig(m=8, ef_construct=64, full_scan_threshold=20), indexing_threshold=500))
    create = json.loads(json.dumps(sent(fake, "PUT", "/collections/knobs")))
    assert create["hnsw_config"] == {"m": 8, "ef_construct": 64, "full_scan_threshold": 20}
    assert create["optimizers_config"] == {"indexing_threshold": 500}
    await engine.create_collection("plain", CollectionConfig(dimensions=3))
    plain = sent(fake, "PUT", "/collections/plain")
    assert "hnsw_config" not in plain and "optimizers_config" not in plain

    await engine.upsert("knobs", [Point(1, [1, 0, 0])])
    await engine.query("knobs", [1, 0, 0], params=SearchParams(hnsw_ef=256, exact=True))
    assert sent(fake, "POST", "/points/query")["params"] == {"hnsw_ef": 256, "exact": True}
    await engine.query("knobs", [1, 0, 0])
    assert "params" not in sent(fake, "POST", "/points/query")


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/collections/bad", {"vectors": {"size": 3, "distance": "Cosine"}, "hnsw_config": {"ef_construct": 3}},
     "Validation error in JSON body: [hnsw_config.ef_construct: value 3 invalid, must be 4 or larger]"),
    ("/collections/bad", {"vectors": {"size": 3, "distance": "Cosine"}, "hnsw_config": {"full_scan_threshold": 9}},
     "Validation error in JSON body: [hnsw_config.full_scan_threshold: value 9 invalid, must be 10 or larger]"),
    ("/collections/bad", {"vectors": {"size": 3, "distance": "Cosine"}, "hnsw_config": {"m": -1}},
     "Format error in JSON body: hnsw_config.m: invalid value: integer `-1`, expected usize"),
    ("/collections/bad", {"vectors": {"size": 3, "distance": "Cosine"}, "optimizers_config": {"indexing_threshold": -5}},
     "Format error in JSON body: optimizers_config.indexing_threshold: invalid value: integer `-5`, expected usize"),
])
async def test_the_fake_refuses_what_qdrant_refuses_on_create(served, path, body, message):
    """Qdrant's bounds (its REST schema and validators: `hnsw_ef` >= 1, `ef_construct` >= 4,
    `full_scan_threshold` >= 10, the rest unsigned), in Qdrant's words."""
    fake, _engine = served
    answer = await anyio.to_thread.run_sync(lambda: httpx.Client(transport=fake).put(
        f"https://qdrant.test:6333{path}", json=body, headers={"api-key": MASTER_KEY}))
    assert answer.status_code == 400 and answer.json()["status"]["error"] == message


async def test_the_fake_refuses_a_beam_of_zero(served):
    fake, engine = served
    await engine.create_collection("beam", CollectionConfig(dimensions=2))
    with pytest.raises(VectorEngineRejected, match=r"params\.hnsw_ef: value 0 invalid, must be 1 or larger"):
        await engine.query("beam", [1, 0], params=SearchParams(hnsw_ef=0))
    # accepted at Qdrant's lower bound
    assert await engine.query("beam", [1, 0], params=SearchParams(hnsw_ef=1)) == []
