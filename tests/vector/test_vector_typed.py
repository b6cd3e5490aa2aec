"""Typed data verbs (issue 19): unknown fields are a 400 naming them and write nothing; the spec's
messages are unchanged; the document declares each verb's body and result."""

from __future__ import annotations

from .test_vector_http import base, error, ready_index, verb


async def test_a_misspelled_index_field_is_refused_and_nothing_is_created(http, project):
    r = await http.post(base(project.id), headers=project.member, json={"name": "typo", "dimension": 3})
    assert r.status_code == 400 and error(r) == 'unknown field "dimension"'
    assert (await http.get(f"{base(project.id)}/typo", headers=project.member)).status_code == 404


async def test_unknown_verb_fields_are_refused_and_nothing_is_written(http, project):
    await ready_index(http, project, dimensions=2)
    r = await verb(http, project, "docs", "upsert", {"points": [{"id": 1, "vector": [1, 0], "paylod": {}}]})
    assert r.status_code == 400 and error(r) == 'unknown field "points.0.paylod"'
    r = await verb(http, project, "docs", "query", {"vector": [1, 0], "topk": 3})
    assert r.status_code == 400 and error(r) == 'unknown field "topk"'
    r = await verb(http, project, "docs", "scroll", {"limits": 3})
    assert r.status_code == 400 and error(r) == 'unknown field "limits"'
    r = await verb(http, project, "docs", "delete-points", {"ids": [1], "wait": True})
    assert r.status_code == 400 and error(r) == 'unknown field "wait"'
    scrolled = await verb(http, project, "docs", "scroll", {})
    assert scrolled.status_code == 200 and scrolled.json() == {"index": "docs", "points": []}


async def test_the_spec_messages_come_before_the_models_own(http, project):
    await ready_index(http, project, dimensions=2)
    cases = [
        ("upsert", {"points": []}, "points must contain at least one point"),
        ("upsert", {"points": [{"id": "doc-1", "vector": [1, 0]}]}, "a string id must be a UUID (or use an unsigned integer)"),
        ("upsert", {"points": [{"vector": [1, 0], "payload": "x"}]}, "point 0: payload must be a JSON object"),
        ("query", {"vector": [1, 0], "top_k": 1001}, "top_k must be at most 1000"),
        ("query", {"vector": [1, 0], "filter": []}, "filter must be a JSON object"),
        ("query", {"vector": [1, 0], "offset": -1}, "offset must not be negative"),
        ("query", {"vector": [1, 0, 0]}, 'query vector has 3 dimensions; index "docs" expects 2'),
        ("scroll", {"limit": 1001}, "limit must be at most 1000"),
        ("scroll", {"offset": "nope"}, "offset must be an unsigned integer or a UUID string"),
        ("delete-points", {}, "provide exactly one of ids or filter"),
        ("delete-points", {"ids": list(range(1001))}, "at most 1000 ids per request"),
    ]
    for name, body, message in cases:
        r = await verb(http, project, "docs", name, body)
        assert r.status_code == 400 and error(r) == message, (name, body, r.text)


def test_the_verb_route_declares_one_of_the_verbs(platform):
    from caiplatform_server.app import create_app

    document = create_app(platform, manage_lifecycle=False).app.openapi()  # type: ignore[attr-defined]
    op = document["paths"]["/v1/projects/{project_id}/indexes/{name}"]["post"]
    bodies = op["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    results = op["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
    assert [b["$ref"].rsplit("/", 1)[1] for b in bodies] == ["IndexUpsert", "IndexQuery", "IndexScroll",
                                                               "IndexDeletePoints"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in results] == ["IndexUpsertResult", "IndexQueryResult",
                                                                "IndexScrollResult", "IndexDeletePointsResult"]
    schemas = document["components"]["schemas"]
    assert schemas["IndexQuery"]["additionalProperties"] is False and "vector" in schemas["IndexQuery"]["required"]
