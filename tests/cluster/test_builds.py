"""A build on two replicas: the replica building is killed (-9) in the middle, the other finishes it.
The function built here (`sink`, tests/cluster/support.py) is the target of the later cluster tests."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from caiplatform.testing.cluster import kill_replica

from .conftest import Cluster
from .support import agent, deploy, poll, settled

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("replicas_up")]


def test_a_build_whose_replica_is_killed_is_finished_by_the_other_and_every_replica_serves_it(cluster: Cluster, work: dict[str, Any]) -> None:
    a, b = cluster.replicas
    deploy(a, cluster, work["code"])
    kill_replica(a)  # in the middle of the build (a fresh builder makes its Python environment first)
    killed = time.monotonic()
    settled(cluster)
    assert "resuming build" in b.log_tail(200_000), "the build was not taken over"
    print(f"build taken over and finished {time.monotonic() - killed:.1f} s after the kill")
    work["image"] = agent(cluster)["image"]
    cluster.restart(a)
    # The restarted replica serves the function too: it builds the same image from the stored sources.
    for replica in cluster.replicas:
        answer = poll(lambda r=replica: httpx.post(f"{r.base_url}/v1/agents/sink-fn/invoke", headers=cluster.automation,
                                                   json={"id": "hello"}, timeout=60),
                      lambda answer: answer.status_code == 200, "a replica does not serve the function", timeout=60)
        assert answer.json() == {"ok": True}, answer.text
