"""Fuzz (issue 26): arbitrary JSON values, as the platform admin with a project full of objects, to every
route of the app that takes a body. No answer may be a 5xx, and every refusal is the spec's envelope.

The values come from hypothesis: nested arrays and objects, huge integers, floats, unicode, and objects
whose keys are the field names the services read (so every field also gets every wrong type). The run
is derandomized so CI is stable; `CAI_FUZZ_EXAMPLES` sets the examples per route (10; `nox -s unit` runs 3)
and `CAI_FUZZ_RANDOM=1` draws new ones on each run, for a longer hunt.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import caiplatform
from tests.openapi_support import served_document
from tests.world_support import VERBS

EXAMPLES = int(os.environ.get("CAI_FUZZ_EXAMPLES", "10"))
WRITES = ("post", "put", "patch")


def _routes() -> list[tuple[str, str]]:
    document = served_document()  # the app's, kept across runs per state of the source (tests/openapi_support.py)
    return [(method, path) for path, ops in document["paths"].items() for method in ops if method in WRITES]


def _field_names() -> list[str]:
    """Every key the library reads from a mapping: the fields of every body, and then some."""
    names: set[str] = set()
    for path in Path(caiplatform.__file__).parent.rglob("*.py"):
        names.update(re.findall(r"""(?:\.get\(|\[|pick\()["']([a-z][a-z0-9_]{1,40})["']""", path.read_text()))
    return sorted(names)


def _cases() -> list[tuple[str, str, dict[str, str]]]:
    cases = []
    for method, path in _routes():
        variants = VERBS.get(path, {}) if method == "post" else {}
        cases += [(method, path, {name: value}) for name, values in variants.items() for value in values] or [
            (method, path, {})]
    return cases


CASES = _cases()
FIELDS = _field_names()

leaves = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
          | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24)
          | st.sampled_from(["", " ", "a" * 300, "default", "fn1", "t1", "0 * * * *", "10Gi", "-1", "1.5"])
          | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2))  # lone surrogates
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
                      max_leaves=16)
bodies = (st.dictionaries(st.sampled_from(FIELDS), values, max_size=6) | values).map(
    lambda value: json.dumps(value).encode())
# What no encoder writes: nesting past any recursion limit, non-numbers, broken text.
raw_bodies = st.sampled_from([b"[" * 3000 + b"]" * 3000, b'{"a":' * 1500 + b"1" + b"}" * 1500, b'{"a": NaN}',
                              b"[1e999]", b'{"name": "\\ud800"}', b"", b"{", b"\xff\xfe{}", b"1" * 5000])


@pytest.mark.parametrize("method,path,overrides", CASES,
                         ids=[f"{m.upper()} {p} {' '.join(o.values())}".strip() for m, p, o in CASES])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("CAI_FUZZ_RANDOM") != "1", database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies | raw_bodies)
def test_no_json_body_gets_a_5xx(world, method, path, overrides, body):
    portal, w = world
    url = w.fill(path, overrides)
    r = portal.call(lambda: w.client.request(method, url, content=body, headers={
        **w.headers, "content-type": "application/json"}))
    assert r.status_code < 500, (method, url, body[:300], r.status_code, r.text[:300])
    if r.status_code >= 400:
        answer = r.json()
        assert isinstance(answer.get("error"), str) and answer["error"], answer
        assert answer.get("request_id") == r.headers["x-request-id"], answer
