"""The vector index API over HTTP (in-process ASGI) on the in-memory platform: every route and message."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.domain import vector as rules

UUID_A = "6f1c2b9e-3d4a-4e5f-8a7b-1c2d3e4f5a6b"


@pytest.fixture(params=["memory", "qdrant"])
async def on_engine(request, platform, tmp_path):
    """Run a test on the in-memory engine and again with Qdrant (local mode) behind the same service."""
    if request.param == "memory":
        yield request.param
        return
    from caiplatform.adapters.qdrant.vector import QdrantVectorEngine

    engine = QdrantVectorEngine(path=tmp_path / "qdrant")
    await engine.start()
    platform.indexes.engine = engine
    try:
        yield request.param
    finally:
        await engine.close()


def base(pid: str) -> str:
    return f"/v1/projects/{pid}/indexes"


async def make_index(http, project, name="docs", **fields) -> dict:
    r = await http.post(base(project.id), headers=project.member, json={"name": name, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def ready_index(http, project, name="docs", **fields) -> dict:
    await make_index(http, project, name, **fields)
    got = await http.get(f"{base(project.id)}/{name}", headers=project.member)
    assert got.status_code == 200 and got.json()["ready"] is True, got.text
    return got.json()


async def verb(http, project, name, verb_name, body, headers=None):
    return await http.post(f"{base(project.id)}/{name}:{verb_name}", headers=headers or project.member, json=body)


def error(r) -> str:
    return r.json()["error"]


# ------------------------------------------------------------------------------------------- create


async def test_create_defaults_then_ready_with_live_counts(http, project):
    created = await make_index(http, project)
    assert created["state"] == "pending" and created["ready"] is False
    assert "collection_status" not in created
    assert created["name"] == "docs"
    assert created["resource_path"] == f"projects/{project.short}/indexes/docs"
    assert created["collection"] == f"p_{project.short}_docs"
    assert created["dimensions"] == 1536 and created["distance"] == "cosine"
    assert created["on_disk"] is False and created["payload_on_disk"] is False
    assert created["quantization"] == {"kind": "none", "always_ram": False}
    assert created["shards"] == 1 and created["replicas"] == 1
    assert created["created_at"].endswith("Z")

    got = (await http.get(f"{base(project.id)}/docs", headers=project.member)).json()
    assert got["state"] == "ready" and got["ready"] is True and got["collection_status"] == "green"
    assert (got["points_count"], got["vectors_count"]) == (0, 0)
    assert "message" not in got


async def test_create_aliases_and_options(http, project):
    body = await make_index(
        http, project, "a1", dimensions=0, distance="DOT_PRODUCT",
        quantization={"kind": "int8", "quantile": "0.99", "always_ram": True},
        on_disk=True, payload_on_disk=True, shards=2, replicas=3,
    )
    assert body["dimensions"] == 1536 and body["distance"] == "dot"
    assert body["quantization"] == {"kind": "scalar", "quantile": "0.99", "always_ram": True}
    assert (body["on_disk"], body["payload_on_disk"], body["shards"], body["replicas"]) == (True, True, 2, 3)
    for alias, canonical in (("dotproduct", "dot"), ("Euclidean", "euclid"), ("l2", "euclid"), ("COSINE", "cosine")):
        name = "x-" + canonical + "-" + alias.lower().replace("_", "")
        assert (await make_index(http, project, name, distance=alias, dimensions=4))["distance"] == canonical
    assert (await make_index(http, project, "bin", dimensions=8, quantization={"kind": "binary"}))["quantization"] == {
        "kind": "binary", "always_ram": False}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "x", "dimensions": 65537}, rules.DIMENSIONS_RULE),
        ({"name": "x", "dimensions": -1}, rules.DIMENSIONS_RULE),
        ({"name": "x", "dimensions": "12"}, rules.DIMENSIONS_RULE),
        ({"name": "x", "distance": "manhattan"}, 'distance must be one of "cosine", "dot" or "euclid"'),
        ({"name": "x", "quantization": {"kind": "product"}},
         'quantization.kind must be one of "none", "scalar" or "binary"'),
        ({"name": "x", "replicas": 9}, "replicas must be between 1 and 8"),
        ({"name": "x", "replicas": 0}, "replicas must be between 1 and 8"),
        ({"name": "Docs"}, rules.NAME_RULE),
        ({"name": "-docs"}, rules.NAME_RULE),
        ({"name": "docs-"}, rules.NAME_RULE),
        ({"name": "d_s"}, rules.NAME_RULE),
        ({"name": "a" * 49}, rules.NAME_TOO_LONG),
        ({}, rules.NAME_REQUIRED),
    ],
)
async def test_create_refusals(http, project, body, message):
    r = await http.post(base(project.id), headers=project.member, json=body)
    assert r.status_code == 400 and error(r) == message
    listed = (await http.get(base(project.id), headers=project.member)).json()
    assert listed["indexes"] == []


async def test_create_name_limits_and_conflict(http, project):
    await make_index(http, project, "a" * 48, dimensions=2)
    await make_index(http, project, "x", dimensions=2)
    r = await http.post(base(project.id), headers=project.member, json={"name": "x", "dimensions": 3})
    assert r.status_code == 409 and error(r) == "an index with that name already exists"


async def test_invalid_json_body(http, project):
    r = await http.post(base(project.id), headers=project.member, content=b"{nope")
    assert r.status_code == 400 and error(r).startswith("invalid JSON body: ")


# ------------------------------------------------------------------------------------------- access


async def test_access_rules(http, project):
    r = await http.get(base(project.id))
    assert r.status_code == 401
    r = await http.get(base(project.id), headers=project.stranger)
    assert r.status_code == 404
    r = await http.get(base("not-a-uuid"), headers=project.member)
    assert r.status_code == 400 and "UUID" in error(r)
    r = await http.get(base(str(uuid.uuid4())), headers=project.member)
    assert r.status_code == 404
    await ready_index(http, project, dimensions=2)
    for method, path, body in (
        ("PATCH", f"{base(project.id)}/docs", {"replicas": 2}),
        ("DELETE", f"{base(project.id)}/docs", None),
        ("GET", f"/v1/projects/{project.id}/vectordb/credentials", None),
    ):
        r = await http.request(method, path, headers=project.member, json=body)
        assert r.status_code == 403, (method, path, r.text)
    r = await verb(http, project, "docs", "upsert", {"points": [{"vector": [1, 2]}]}, headers=project.stranger)
    assert r.status_code == 404
    r = await http.get(f"{base(project.id)}/missing", headers=project.member)
    assert r.status_code == 404
    r = await http.get(f"{base(project.id)}/Bad_Name", headers=project.member)
    assert r.status_code == 404


async def test_wrong_method_is_405(http, project):
    await ready_index(http, project, dimensions=2)
    r = await http.put(f"{base(project.id)}/docs", headers=project.member, json={})
    assert r.status_code == 405
    r = await http.get(f"{base(project.id)}/docs:query", headers=project.member)
    assert r.status_code == 405


# ------------------------------------------------------------------------------------------- list


async def test_list_paging_omits_token_on_last_page(http, project):
    for name in ("c", "a", "b"):
        await make_index(http, project, name, dimensions=2)
    first = await http.get(base(project.id), headers=project.member, params={"page_size": 2})
    body = first.json()
    assert [i["name"] for i in body["indexes"]] == ["a", "b"] and body["next_page_token"]
    second = (await http.get(base(project.id), headers=project.member,
                             params={"limit": 2, "page_token": body["next_page_token"]})).json()
    assert [i["name"] for i in second["indexes"]] == ["c"]
    assert "next_page_token" not in second
    assert second["indexes"][0]["ready"] is True
    for bad in ("0", "201", "x"):
        r = await http.get(base(project.id), headers=project.member, params={"page_size": bad})
        assert r.status_code == 400
    r = await http.get(base(project.id), headers=project.member, params={"page_token": "garbage.sig"})
    assert r.status_code == 400 and error(r) == (
        "page_token is invalid or was issued for a different list; start from the first page")


# ------------------------------------------------------------------------------------------- patch, delete


async def test_patch_rules(http, project):
    await ready_index(http, project, dimensions=2)
    path = f"{base(project.id)}/docs"
    r = await http.patch(path, headers=project.admin, json={"replicas": 4, "payload_on_disk": True})
    assert r.status_code == 200, r.text
    assert (r.json()["replicas"], r.json()["payload_on_disk"]) == (4, True)
    assert (await http.get(path, headers=project.member)).json()["replicas"] == 4
    for field in ("dimensions", "distance", "shards", "on_disk", "quantization"):
        r = await http.patch(path, headers=project.admin, json={field: 1, "replicas": 2})
        assert r.status_code == 400 and error(r).startswith(f"{field} is immutable"), r.text
    for body in ({}, {"name": "other"}):
        r = await http.patch(path, headers=project.admin, json=body)
        assert r.status_code == 400
        assert error(r) == "no mutable fields to change; the editable fields are replicas and payload_on_disk"
    r = await http.patch(path, headers=project.admin, content=b"")
    assert r.status_code == 400 and error(r) == rules.EMPTY_PATCH
    for bad in (0, 9, "2", True):
        r = await http.patch(path, headers=project.admin, json={"replicas": bad})
        assert r.status_code == 400 and error(r) == "replicas must be between 1 and 8"
    assert (await http.get(path, headers=project.member)).json()["replicas"] == 4


async def test_delete_destroys_the_collection(http, platform, project, on_engine):
    await ready_index(http, project, dimensions=2)
    await verb(http, project, "docs", "upsert", {"points": [{"id": 1, "vector": [1, 0]}]})
    collection = f"p_{project.short}_docs"
    assert collection in await platform.vector_engine.list_collections()
    r = await http.delete(f"{base(project.id)}/docs", headers=project.admin)
    assert r.status_code == 204 and r.content == b""
    assert collection not in await platform.vector_engine.list_collections()
    assert (await http.get(f"{base(project.id)}/docs", headers=project.member)).status_code == 404
    assert (await http.delete(f"{base(project.id)}/docs", headers=project.admin)).status_code == 404
    # the name is free again, and the new index starts empty
    await ready_index(http, project, dimensions=2)
    scrolled = (await verb(http, project, "docs", "scroll", {})).json()
    assert scrolled["points"] == []


# ------------------------------------------------------------------------------------------- data verbs


async def test_pending_index_answers_409(http, platform, project):
    await make_index(http, project, dimensions=2)
    # The engine is down while the collection would be created: the index stays pending.
    engine = platform.vector_engine
    original = engine.create_collection

    async def refuse(*args, **kwargs):
        raise ConnectionError("engine down")

    engine.create_collection = refuse
    try:
        await make_index(http, project, "later", dimensions=2)
        await platform.indexes.wait_reconciled()
        got = (await http.get(f"{base(project.id)}/later", headers=project.member)).json()
        assert got["state"] == "pending" and got["ready"] is False and "engine down" in got["message"]
        r = await verb(http, project, "later", "upsert", {"points": [{"vector": [1, 2]}]})
        assert r.status_code == 409 and error(r) == "index is not ready yet; its collection has not been created"
    finally:
        engine.create_collection = original
    r = await verb(http, project, "later", "upsert", {"points": [{"vector": [1, 2]}]})
    assert r.status_code == 200


async def test_verb_routing_errors(http, project):
    await ready_index(http, project, dimensions=2)
    r = await http.post(f"{base(project.id)}/docs:frobnicate", headers=project.member, json={})
    assert r.status_code == 400
    for word in (":upsert", ":query", ":scroll", ":delete-points"):
        assert word in error(r)
    for path in ("docs", "docs:"):
        r = await http.post(f"{base(project.id)}/{path}", headers=project.member, json={})
        assert r.status_code == 400 and error(r).startswith("missing verb") and ":upsert" in error(r)
    r = await http.post(f"{base(project.id)}/missing:query", headers=project.member, json={"vector": [1, 2]})
    assert r.status_code == 404


async def test_upsert_generated_ids_and_all_or_nothing(http, project, on_engine):
    await ready_index(http, project, dimensions=3)
    r = await verb(http, project, "docs", "upsert", {"points": [
        {"id": 7, "vector": [1, 0, 0], "payload": {"k": "a"}},
        {"id": UUID_A.upper(), "vector": [0, 1, 0]},
        {"vector": [0, 0, 1], "payload": {"k": "gen"}},
    ]})
    assert r.status_code == 200 and r.json() == {"index": "docs", "upserted_count": 3}
    points = (await verb(http, project, "docs", "scroll", {})).json()["points"]
    assert points[0] == {"id": 7, "payload": {"k": "a"}}
    assert {"id": UUID_A, "payload": {}} in points
    generated = [p for p in points if p["payload"] == {"k": "gen"}]
    assert len(generated) == 1 and uuid.UUID(generated[0]["id"])

    bad_batches = [
        ({"points": []}, "points must contain at least one point"),
        ({}, "points must contain at least one point"),
        ({"points": [{"vector": [1, 0, 0]}] * 1001}, "at most 1000 points per request (got 1001)"),
        ({"points": [{"id": 8, "vector": [1, 0, 0]}, {"vector": [1, 0]}, {"vector": [1, 2, 3, 4]}]},
         'point 1 has 2 dimensions; index "docs" expects 3'),
        ({"points": [{"id": -1, "vector": [1, 0, 0]}]}, "point 0: id must be an unsigned integer or a UUID string"),
        ({"points": [{"id": 1.5, "vector": [1, 0, 0]}]}, "point 0: id must be an unsigned integer or a UUID string"),
        ({"points": [{"id": 9, "vector": [1, 0, 0]}, {"id": "doc-1", "vector": [1, 0, 0]}]},
         "a string id must be a UUID (or use an unsigned integer)"),
    ]
    for body, message in bad_batches:
        r = await verb(http, project, "docs", "upsert", body)
        assert r.status_code == 400 and error(r) == message, (body if len(str(body)) < 200 else message, r.text)
    got = (await http.get(f"{base(project.id)}/docs", headers=project.member)).json()
    assert got["points_count"] == 3  # nothing of a refused batch was written


async def test_query_options_and_messages(http, project, on_engine):
    await ready_index(http, project, dimensions=2)
    points = [{"id": i, "vector": [1, i / 10], "payload": {"i": i, "even": i % 2 == 0}} for i in range(1, 11)]
    assert (await verb(http, project, "docs", "upsert", {"points": points})).status_code == 200

    r = await verb(http, project, "docs", "query", {"vector": [1, 0]})
    body = r.json()
    assert r.status_code == 200 and body["index"] == "docs" and len(body["results"]) == 10
    assert [h["id"] for h in body["results"]][:3] == [1, 2, 3]
    assert set(body["results"][0]) == {"id", "score", "payload"}

    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "top_k": 2, "offset": 1,
                                                    "with_payload": False, "with_vector": True})
    hits = r.json()["results"]
    assert [h["id"] for h in hits] == [2, 3] and set(hits[0]) == {"id", "score", "vector"}
    assert abs(sum(x * x for x in hits[0]["vector"]) - 1) < 1e-5  # cosine vectors come back normalised

    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "filter": {
        "must": [{"key": "even", "match": {"value": True}}], "must_not": [{"has_id": [2]}]}})
    assert [h["id"] for h in r.json()["results"]] == [4, 6, 8, 10]

    threshold = r.json()["results"][1]["score"]
    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "score_threshold": threshold - 1e-6,
                                                    "filter": {"must": [{"key": "i", "range": {"gte": 4}}]}})
    assert [h["id"] for h in r.json()["results"]] == [4, 5, 6]

    refusals = [
        ({"vector": [1, 0], "top_k": 1001}, "top_k must be at most 1000"),
        ({"vector": [1, 0], "filter": [1]}, "filter must be a JSON object"),
        ({"vector": [1, 0], "filter": "x"}, "filter must be a JSON object"),
        ({"vector": [1, 0], "filter": {"should": [{"key": "k" * 70000, "match": {"value": 1}}]}},
         "filter is too large"),
        ({"vector": [1, 0], "offset": -1}, "offset must not be negative"),
        ({"vector": [1, 0, 0]}, 'query vector has 3 dimensions; index "docs" expects 2'),
    ]
    for body, message in refusals:
        r = await verb(http, project, "docs", "query", body)
        assert r.status_code == 400 and error(r) == message, r.text
    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "filter": {"must": [{"key": "i", "oops": 1}]}})
    assert r.status_code == 400 and error(r).startswith("vector database rejected the request: ")
    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "top_k": 1000})
    assert r.status_code == 200


async def test_scroll_in_id_order(http, project, on_engine):
    await ready_index(http, project, dimensions=2)
    ids = [5, UUID_A, 1, 3, "00000000-0000-4000-8000-000000000001"]
    await verb(http, project, "docs", "upsert", {"points": [{"id": i, "vector": [1, 1]} for i in ids]})
    first = (await verb(http, project, "docs", "scroll", {"limit": 2})).json()
    assert [p["id"] for p in first["points"]] == [1, 3] and first["next_offset"] == 5
    assert all(set(p) == {"id", "payload"} for p in first["points"])
    second = (await verb(http, project, "docs", "scroll", {"limit": 2, "offset": first["next_offset"]})).json()
    assert [p["id"] for p in second["points"]] == [5, "00000000-0000-4000-8000-000000000001"]
    last = (await verb(http, project, "docs", "scroll", {"limit": 2, "offset": second["next_offset"]})).json()
    assert [p["id"] for p in last["points"]] == [UUID_A] and "next_offset" not in last
    everything = (await verb(http, project, "docs", "scroll", {})).json()
    assert len(everything["points"]) == 5 and "next_offset" not in everything
    for body, message in (
        ({"limit": 1001}, "limit must be at most 1000"),
        ({"offset": "nope"}, "offset must be an unsigned integer or a UUID string"),
        ({"offset": -3}, "offset must be an unsigned integer or a UUID string"),
    ):
        r = await verb(http, project, "docs", "scroll", body)
        assert r.status_code == 400 and error(r) == message


async def test_delete_points(http, project, on_engine):
    await ready_index(http, project, dimensions=2)
    await verb(http, project, "docs", "upsert", {"points": [
        {"id": i, "vector": [1, i], "payload": {"tag": "odd" if i % 2 else "even"}} for i in range(1, 7)]})
    r = await verb(http, project, "docs", "delete-points", {"ids": [1, 2, 99]})
    assert r.status_code == 200 and r.json() == {"index": "docs", "status": "ok", "ids_requested": 3}
    r = await verb(http, project, "docs", "delete-points", {"filter": {"must": [{"key": "tag", "match": {"value": "odd"}}]}})
    assert r.status_code == 200 and r.json() == {"index": "docs", "status": "ok"}
    left = [p["id"] for p in (await verb(http, project, "docs", "scroll", {})).json()["points"]]
    assert left == [4, 6]
    for body, message in (
        ({}, "provide exactly one of ids or filter"),
        ({"ids": [4], "filter": {"must": [{"has_id": [4]}]}}, "provide exactly one of ids or filter"),
        ({"ids": list(range(1001))}, "at most 1000 ids per request"),
        ({"filter": {}}, rules.EMPTY_FILTER),
        ({"filter": {"must": []}}, rules.EMPTY_FILTER),
        ({"filter": "x"}, "filter must be a JSON object"),
    ):
        r = await verb(http, project, "docs", "delete-points", body)
        assert r.status_code == 400 and error(r) == message, r.text
    assert [p["id"] for p in (await verb(http, project, "docs", "scroll", {})).json()["points"]] == [4, 6]


# ------------------------------------------------------------------------------------------- credential, health


async def test_direct_credential_without_token(http, project):
    for name in ("b", "a"):
        await make_index(http, project, name, dimensions=2)
    r = await http.get(f"/v1/projects/{project.id}/vectordb/credentials", headers=project.admin)
    assert r.status_code == 200
    body = r.json()
    assert body["collection_prefix"] == f"p_{project.short}_"
    assert body["collections"] == [f"p_{project.short}_a", f"p_{project.short}_b"]
    assert body["truncated"] is False and body["service_url"] and body["note"]
    assert body["token"] == "" and "external_service_url" not in body


async def test_healthz(http):
    r = await http.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert set(body["dependencies"]) == {"vector_store", "kubernetes", "database"}
    for dep in body["dependencies"].values():
        assert dep["ok"] is True and isinstance(dep["latency_ms"], int | float) and "error" not in dep
    # No cluster: the entry keeps the document's shape and says what is true.
    kubernetes = body["dependencies"]["kubernetes"]
    assert kubernetes["status"] == "not configured" and "no cluster is configured" in kubernetes["detail"]


async def test_healthz_degraded_when_engine_fails(http, platform):
    async def broken():
        raise ConnectionError("qdrant is down")

    platform.vector_engine.health = broken
    r = await http.get("/healthz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded"
    assert body["dependencies"]["vector_store"]["ok"] is False
    assert body["dependencies"]["vector_store"]["error"] == "qdrant is down"


async def test_operator_limits(settings, clock, project_of):
    """MAX_BODY_BYTES (413), MAX_POINTS_PER_REQUEST and MAX_TOP_K come from the environment."""
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    limited = settings.model_copy(update={"vector_max_body_bytes": 4096, "vector_max_points_per_request": 2,
                                          "vector_max_top_k": 5})
    platform = Platform.in_memory(limited, clock=clock)
    await platform.start()
    try:
        project = await project_of(platform)
        async with asgi_client(platform, ["vectordb"]) as http:
            await ready_index(http, project, dimensions=2)
            r = await verb(http, project, "docs", "upsert", {"points": [{"vector": [1, 2]}] * 3})
            assert r.status_code == 400 and error(r) == "at most 2 points per request (got 3)"
            r = await verb(http, project, "docs", "upsert", {"points": [{"vector": [1, 2], "payload": {"x": "y" * 5000}}]})
            assert r.status_code == 413 and error(r) == "request body too large (limit 4096 bytes)"
            r = await verb(http, project, "docs", "query", {"vector": [1, 2], "top_k": 6})
            assert r.status_code == 400 and error(r) == "top_k must be at most 5"
    finally:
        await platform.aclose()


async def test_collection_dropped_behind_the_platforms_back(http, platform, project):
    await ready_index(http, project, dimensions=2)
    assert (await verb(http, project, "docs", "scroll", {})).status_code == 200
    await platform.vector_engine.drop_collection(f"p_{project.short}_docs")
    got = (await http.get(f"{base(project.id)}/docs", headers=project.member)).json()
    assert got["state"] == "degraded" and got["ready"] is False and "missing" in got["message"]
    r = await verb(http, project, "docs", "scroll", {})
    assert r.status_code == 400 and error(r).startswith("vector database rejected the request: ")
    r = await verb(http, project, "docs", "scroll", {})  # the cached record was dropped: still refused
    assert r.status_code == 400
    assert (await http.delete(f"{base(project.id)}/docs", headers=project.admin)).status_code == 204


async def test_direct_credential_with_access_control(settings, clock, project_of):
    """With per-project access control on the engine, the token is a JWT scoped read-write to the list."""
    import jwt

    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    enforced = settings.model_copy(update={"vector_access_control": True, "qdrant_api_key": "engine-master-key-of-at-least-32-bytes"})
    platform = Platform.in_memory(enforced, clock=clock)
    await platform.start()
    try:
        project = await project_of(platform)
        async with asgi_client(platform, ["vectordb"]) as http:
            await make_index(http, project, "one", dimensions=2)
            body = (await http.get(f"/v1/projects/{project.id}/vectordb/credentials", headers=project.admin)).json()
        claims = jwt.decode(body["token"], "engine-master-key-of-at-least-32-bytes", algorithms=["HS256"],
                            options={"verify_exp": False})
        assert claims["access"] == [{"collection": f"p_{project.short}_one", "access": "rw"}]
        assert claims["exp"] == int(clock.time()) + 3600
        assert "engine-master-key-of-at-least-32-bytes" not in str(body)
    finally:
        await platform.aclose()


# ------------------------------------------------------------------------------------------- Qdrant's knobs


async def test_create_with_qdrant_index_settings(http, platform, project):
    created = await make_index(http, project, "tuned", dimensions=4,
                               hnsw_config={"m": 8, "ef_construct": 64, "full_scan_threshold": 100},
                               indexing_threshold=0)
    assert created["hnsw_config"] == {"m": 8, "ef_construct": 64, "full_scan_threshold": 100}
    assert created["indexing_threshold"] == 0
    got = (await http.get(f"{base(project.id)}/tuned", headers=project.member)).json()
    assert (got["hnsw_config"], got["indexing_threshold"]) == (created["hnsw_config"], 0)
    # Qdrant's spelling of the threshold; unset fields are not reported
    other = await make_index(http, project, "qdrant-spelling", dimensions=4, optimizers_config={"indexing_threshold": 50})
    assert other["indexing_threshold"] == 50 and "hnsw_config" not in other
    plain = await make_index(http, project, "plain", dimensions=4)
    assert "hnsw_config" not in plain and "indexing_threshold" not in plain
    # the engine's collection was created with them
    record = platform.indexes.engine._collections[created["collection"]].config
    assert (record.hnsw.m, record.hnsw.ef_construct, record.indexing_threshold) == (8, 64, 0)


@pytest.mark.parametrize(("body", "message"), [
    ({"hnsw_config": []}, "hnsw_config must be a JSON object"),
    ({"hnsw_config": {"M": 8}}, "hnsw_config.M is not supported; the supported fields are m, ef_construct and "
                                "full_scan_threshold"),
    ({"hnsw_config": {"m": -1}}, f"hnsw_config.m must be an integer between 0 and {rules.MAX_HNSW_M}"),
    ({"hnsw_config": {"m": 8.5}}, f"hnsw_config.m must be an integer between 0 and {rules.MAX_HNSW_M}"),
    ({"hnsw_config": {"m": True}}, f"hnsw_config.m must be an integer between 0 and {rules.MAX_HNSW_M}"),
    ({"hnsw_config": {"ef_construct": 3}},
     f"hnsw_config.ef_construct must be an integer between 4 and {rules.MAX_EF_CONSTRUCT}"),
    ({"hnsw_config": {"full_scan_threshold": 9}},
     f"hnsw_config.full_scan_threshold must be an integer between 10 and {rules.MAX_THRESHOLD_KB}"),
    ({"indexing_threshold": -1}, f"indexing_threshold must be an integer between 0 and {rules.MAX_THRESHOLD_KB}"),
    ({"indexing_threshold": "20000"}, f"indexing_threshold must be an integer between 0 and {rules.MAX_THRESHOLD_KB}"),
    ({"optimizers_config": {"deleted_threshold": 0.2}},
     "optimizers_config.deleted_threshold is not supported; the supported fields are indexing_threshold"),
    ({"optimizers_config": {"indexing_threshold": 5}, "indexing_threshold": 5},
     "send indexing_threshold or optimizers_config.indexing_threshold, not both"),
])
async def test_create_refuses_bad_index_settings(http, project, body, message):
    r = await http.post(base(project.id), headers=project.member, json={"name": "docs", "dimensions": 4, **body})
    assert r.status_code == 400 and error(r) == message


async def test_index_settings_are_immutable(http, project):
    await ready_index(http, project, dimensions=4)
    r = await http.patch(f"{base(project.id)}/docs", headers=project.admin, json={"hnsw_config": {"m": 4}})
    assert r.status_code == 400 and error(r).startswith("hnsw_config is immutable")


async def test_query_search_params(http, project, on_engine):
    await ready_index(http, project, dimensions=2, distance="dot")
    await verb(http, project, "docs", "upsert", {"points": [{"id": 1, "vector": [1, 0]}, {"id": 2, "vector": [0, 1]}]})
    for params in ({"exact": True}, {"hnsw_ef": 1}, {"hnsw_ef": rules.MAX_HNSW_EF, "exact": False}, {}):
        r = await verb(http, project, "docs", "query", {"vector": [1, 0.1], "top_k": 1, "params": params})
        assert r.status_code == 200 and [h["id"] for h in r.json()["results"]] == [1], r.text
    for params, message in [
        ([], "params must be a JSON object"),
        ({"hnsw_ef": 0}, f"params.hnsw_ef must be an integer between 1 and {rules.MAX_HNSW_EF}"),
        ({"hnsw_ef": rules.MAX_HNSW_EF + 1}, f"params.hnsw_ef must be an integer between 1 and {rules.MAX_HNSW_EF}"),
        ({"hnsw_ef": "64"}, f"params.hnsw_ef must be an integer between 1 and {rules.MAX_HNSW_EF}"),
        ({"exact": "yes"}, "params.exact must be true or false"),
        ({"quantization": {"rescore": True}}, "params.quantization is not supported; the supported fields are "
                                              "hnsw_ef and exact"),
    ]:
        r = await verb(http, project, "docs", "query", {"vector": [1, 0], "params": params})
        assert r.status_code == 400 and error(r) == message, (params, r.text)
