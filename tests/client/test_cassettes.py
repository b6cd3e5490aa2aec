"""The client against recorded answers of a live server (issue 20).

`test_the_client_replays_the_recording` needs no server: it runs the scenario on the cassette committed in
`tests/client/cassettes/`. `test_the_recording_still_matches_a_live_server` runs the same scenario on a
live `caiplatform serve` and fails when what the server answers now differs from the cassette (requests,
statuses, the shape of every answer); `nox -s cassettes` re-records the cassette instead
(`CAI_RECORD_CASSETTES=1`).
"""

from __future__ import annotations

import os

import pytest

from caiplatform.client import Client
from caiplatform.models.vector import Index, IndexCredential
from caiplatform.testing.serve import ServeProcess

from .cassette_support import CASSETTE, RECORDED_BASE, recorder, scenario, summary


def test_the_client_replays_the_recording():
    with recorder(CASSETTE, "none").use_cassette(CASSETTE.name), Client(RECORDED_BASE, token="unused") as client:
        seen = scenario(client)
    assert isinstance(seen["created"], Index) and seen["created"].dimensions == 3
    assert seen["listed"] == ["recorded"] and isinstance(seen["credential"], IndexCredential)
    assert seen["after_delete"] == "NotFound"


@pytest.mark.e2e
def test_the_recording_still_matches_a_live_server(tmp_path):
    record = os.environ.get("CAI_RECORD_CASSETTES") == "1"
    target = CASSETTE if record else tmp_path / "live.yaml"
    if record and CASSETTE.exists():
        CASSETTE.unlink()
    with ServeProcess(tmp_path / "data", env={"RATELIMIT_RPS": "1000", "RATELIMIT_BURST": "1000"}) as server:
        with recorder(target, "all").use_cassette(target.name), Client(server.base_url, token=None) as client:
            scenario(client)
    if not record:
        assert summary(target) == summary(CASSETTE), "the live server answers differently: `nox -s cassettes`"
