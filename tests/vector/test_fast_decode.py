"""The vector data verbs' fast JSON path (`json_input.decode_fast`) answers and refuses exactly as
`json_input.decode`, the path every other route uses, in the same words."""

from __future__ import annotations

import json

import pytest

from caiplatform import json_input

VECTOR = ", ".join(["0.0012345678901234567", "-1.5e-05", "3"] * 4)
BODIES = [
    b'{"points": [{"id": 1, "vector": [' + VECTOR.encode() + b']}]}',
    b'{"vector": [NaN, 1]}', b'{"vector": [Infinity]}', b'{"vector": [-Infinity]}', b'{"vector": [1e400]}',
    b'{"vector": [1, "2"]}', b'{"points": [{"id": 18446744073709551616, "vector": [1]}]}',
    b'{"points": [{"id": -1, "vector": [1]}]}', b'{"top_k": 123456789012345678901234567890}',
    b'{"id": 12345678901234567890123}', b'{"x": "\\ud800"}', b'\xef\xbb\xbf{"x": 1}', b'{"x": 1',
    b'[' * 70 + b']' * 70, b'{"a": ' + b'[' * 65 + b']' * 65 + b'}', b'{"a": ' + b'[' * 63 + b']' * 63 + b'}',
    b'{"x": 1} 2', b'"text"', b'{"a": 1, "a": 2}', b'{"t": true, "n": null, "f": 1.0}',
    b'{"n": 1' + b'0' * 1001 + b'}', json.dumps({"x": "\u00e9\U0001f600"}).encode("utf-16"),
    b'{"x": "a\nb"}', b'{"x": "a\x00b"}', b'{"x": "\\u0000"}', b'{"v": [1e-400, -0, -0.0, 1E5, 2e+3]}',
    b'{"x": "\xff"}', b'{"x": "\xed\xa0\x80"}', b' \t\r\n{"x": 1}\n', b'{}', b'42', b'[1,]', b'{"x": 01}',
    b'{"x": .5}', b'{"x": 1.}', b'{"x": +1}', b'{"v": [9223372036854775807, 18446744073709551615, -9223372036854775808]}',
    b'{"v": [-18446744073709551616]}', b'{"v": [0.00020164294983260334123]}', b'{"x": "\\ud83d\\ude00"}',
]


def outcome(decoder, raw: bytes):
    try:
        value = decoder(raw)
    except json_input.JSONInputError as exc:
        return "refused", str(exc)
    return "value", json.dumps(value, sort_keys=True), [type(v).__name__ for v in _leaves(value)]


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


@pytest.mark.parametrize("raw", BODIES)
def test_fast_path_answers_as_the_standard_path(raw):
    assert outcome(json_input.decode_fast, raw) == outcome(json_input.decode, raw)


async def test_the_upsert_route_refuses_as_before(http, project):
    base = f"/v1/projects/{project.id}/indexes"
    assert (await http.post(base, headers=project.member, json={"name": "docs", "dimensions": 2})).status_code == 201
    await http.get(f"{base}/docs", headers=project.member)
    cases = [
        (b'{"points": [{"id": 1, "vector": [NaN, 1]}]}', "invalid JSON body: NaN is not a JSON number"),
        (b'{"points": [{"id": 1, "vector": [1e400, 1]}]}', "invalid JSON body: number 1e400 is out of range"),
        (b'{"points": [{"id": 1, "vector": [1, "2"]}]}', "point 0: vector must contain only finite numbers"),
        (b'{"points": [{"id": 1, "vector": [1, 2, 3]}]}', 'point 0 has 3 dimensions; index "docs" expects 2'),
        (b'{"points": [{"id": 18446744073709551616, "vector": [1, 2]}]}',
         "point 0: id must be an unsigned integer or a UUID string"),
        (b'{"points": [{"id": "nope", "vector": [1, 2]}]}', "a string id must be a UUID (or use an unsigned integer)"),
        (json.dumps({"points": [{"id": i, "vector": [1, 2]} for i in range(1001)]}).encode(),
         "at most 1000 points per request (got 1001)"),
    ]
    for raw, message in cases:
        r = await http.post(f"{base}/docs:upsert", headers={**project.member, "content-type": "application/json"},
                            content=raw)
        assert r.status_code == 400 and r.json()["error"] == message, (raw[:80], r.text)
    ok = await http.post(f"{base}/docs:upsert", headers=project.member,
                         json={"points": [{"id": 1, "vector": [0.5, -1.5e-05]}]})
    assert ok.status_code == 200 and ok.json()["upserted_count"] == 1
