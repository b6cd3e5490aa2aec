"""Issue 26: the harness (what a published address reaches) decodes bodies within the same limits as the
platform: a deep body or an unpaired surrogate is its 400 in the envelope, never a 500."""

from __future__ import annotations

import pytest

from caiplatform.json_input import MAX_DEPTH
from caiplatform.testing.example_agents import PYTHON_FUNCTION

DEEP = b"[" * 3500 + b"]" * 3500


@pytest.mark.parametrize("body,error", [
    (DEEP, f"invalid JSON body: nesting is deeper than {MAX_DEPTH} levels"),
    (b'{"message": "\\ud800"}', "invalid JSON body: a string holds an unpaired UTF-16 surrogate escape"),
    (b'{"message": NaN}', "invalid JSON body: NaN is not a JSON number"),
])
@pytest.mark.parametrize("route", ["/invoke", "/invoke/stream"])
async def test_the_harness_refuses_what_the_platform_refuses(harness_env, harness_client, route, body, error):
    client = harness_client(harness_env("function", PYTHON_FUNCTION))
    r = await client.post(route, content=body, headers={"content-type": "application/json",
                                                        "x-forwarded-host": "fn-abc.apps.localhost"})
    assert r.status_code == 400 and r.json() == {"error": error, "request_id": r.headers["x-request-id"]}
