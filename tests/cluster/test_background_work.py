"""Background work on two replicas, each replica killed (-9) in the middle of it once: a build, push
delivery and a cron firing are each done by one replica and taken over by the other when it dies.

The work's target is `sink`, a Python function run as a serverless service: it appends a line per call
to a file (`begin` when it starts, `done` when it answers) with its `HOME`, which lies in the data dir of
the replica whose process runs it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from caiplatform.testing.cluster import kill_replica
from caiplatform.testing.serve import ServeProcess
from caiplatform.testing.sources import directory_tarball, write_tree

from .conftest import Cluster

pytestmark = pytest.mark.e2e

SINK = {
    "main.py": (
        "import json, os, time\n\n\n"
        "def _log(event, phase):\n"
        "    with open(os.environ['SINK_LOG'], 'a') as fh:\n"
        "        fh.write(json.dumps({'id': event.get('id'), 'phase': phase, 'home': os.environ.get('HOME', '')}) + '\\n')\n\n\n"
        "def handle(event, context):\n"
        "    _log(event, 'begin')\n"
        "    time.sleep(float(event.get('sleep', 0)))\n"
        "    if event.get('fail'):\n"
        "        raise RuntimeError('refused on purpose')\n"
        "    _log(event, 'done')\n"
        "    return {'ok': True}\n"
    ),
}


def poll(read: Callable[[], Any], done: Callable[[Any], bool], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not done(value := read()):
        assert time.monotonic() < deadline, f"{what}: {value}"
        time.sleep(0.2)
    return value


class Sink:
    def __init__(self, path: Path):
        self.path = path

    def calls(self, ident: str | None = None, phase: str | None = None) -> list[dict[str, str]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [c for c in map(json.loads, lines)
                if (ident is None or c["id"] == ident) and (phase is None or c["phase"] == phase)]


@pytest.fixture(scope="module")
def work(cluster: Cluster) -> dict[str, Any]:
    """What the tests share: the default project and the sink's log."""
    project = next(p for p in cluster.lb.get("/v1/projects", headers=cluster.automation).json()["projects"]
                   if p["slug"] == "default")
    return {"pid": project["id"], "short": project["short"], "sink": Sink(cluster.root / "sink.log"),
            "code": directory_tarball(write_tree(cluster.root / "sink-src", SINK))}


def deploy(replica: ServeProcess, cluster: Cluster, code: bytes) -> None:
    import httpx

    answer = httpx.post(f"{replica.base_url}/v1/agents", params={"project": "default"}, headers=cluster.automation,
                        data={"name": "sink", "framework": "function"},
                        files={"code": ("code.tar.gz", code, "application/gzip")}, timeout=60)
    assert answer.status_code == 202, answer.text


def agent(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.lb.get("/v1/agents/sink", headers=cluster.automation).json())


def test_a_build_whose_replica_is_killed_is_finished_by_the_other(cluster: Cluster, work: dict[str, Any]) -> None:
    a, b = cluster.replicas
    deploy(a, cluster, work["code"])
    kill_replica(a)  # in the middle of the build (a fresh builder makes its Python environment first)
    killed = time.monotonic()
    view = poll(lambda: agent(cluster), lambda v: v.get("state") not in ("building", "deploying"),
                "the build was not taken over", timeout=90)
    assert view["ready"], view
    assert "resuming build" in b.log_tail(200_000)
    print(f"build taken over and finished {time.monotonic() - killed:.1f} s after the kill")
    cluster.restart(a)
    # The same source built by the restarted replica too, so both can run the image (same digest).
    deploy(a, cluster, work["code"])
    view = poll(lambda: agent(cluster), lambda v: v.get("state") not in ("building", "deploying"),
                "the second build did not finish", timeout=90)
    assert view["ready"], view
    work["image"] = view["image"]


def test_push_delivery_is_once_per_message_and_survives_a_killed_replica(cluster: Cluster, work: dict[str, Any]) -> None:
    pid, sink = work["pid"], work["sink"]
    created = cluster.lb.post(f"/v1/projects/{pid}/services", headers=cluster.automation,
                              json={"name": "sink", "image": work["image"], "env": {"SINK_LOG": str(sink.path)},
                                    "scaling": {"min_scale": 1}})
    assert created.status_code == 202, created.text
    assert cluster.lb.post(f"/v1/projects/{pid}/topics", headers=cluster.automation,
                           json={"name": "events"}).status_code == 201
    sub = cluster.lb.post(f"/v1/projects/{pid}/topics/events/subscriptions", headers=cluster.automation, json={
        "name": "to-sink", "ack_deadline_seconds": 3,
        "deliver": {"mode": "push", "push": {"url": f"http://sink.cai-p-{work['short']}/invoke",
                                             "content_mode": "cloudevents-binary"}}})
    assert sub.status_code == 201, sub.text
    time.sleep(4)  # each replica's follower serves the service, each push worker reads the subscription

    def publish(*events: dict[str, Any]) -> None:
        answer = cluster.lb.post(f"/v1/projects/{pid}/topics/events:publish", headers=cluster.automation,
                                 json={"messages": [{"text": json.dumps(e)} for e in events]})
        assert answer.status_code == 200, answer.text

    ids = [f"m{i}" for i in range(20)]
    publish(*({"id": i} for i in ids))
    poll(lambda: {c["id"] for c in sink.calls(phase="done")}, lambda got: set(ids) <= got, "not every message arrived")
    time.sleep(1)
    done = [c["id"] for c in sink.calls(phase="done") if c["id"] in ids]
    assert sorted(done) == sorted(ids)  # each once
    assert {cluster.replica_of(c["home"]).data_dir for c in sink.calls(phase="done")} == {
        r.data_dir for r in cluster.replicas}  # both replicas delivered

    # Slow messages: kill the replica running one of them; the other delivers it after the ack deadline.
    slow = [f"s{i}" for i in range(4)]
    publish(*({"id": i, "sleep": 3} for i in slow))
    begun = poll(lambda: sink.calls(phase="begin"), lambda calls: any(c["id"] in slow for c in calls),
                 "no slow message began")
    victim = cluster.replica_of(next(c["home"] for c in begun if c["id"] in slow))
    kill_replica(victim)
    killed = time.monotonic()
    poll(lambda: {c["id"] for c in sink.calls(phase="done")}, lambda got: set(slow) <= got,
         "a message held by the killed replica was not delivered again", timeout=30)
    print(f"every slow message delivered {time.monotonic() - killed:.1f} s after the kill")
    cut = [c["id"] for c in begun if c["id"] in slow and cluster.replica_of(c["home"]) is victim]
    survivor = next(r for r in cluster.replicas if r is not victim)
    for ident in cut:  # what the killed replica was delivering, the survivor delivered
        assert [cluster.replica_of(c["home"]) for c in sink.calls(ident, "done")] == [survivor]
    cluster.restart(victim)


def test_the_retry_budget_and_dead_letter_hold_across_replicas(cluster: Cluster, work: dict[str, Any]) -> None:
    pid, sink = work["pid"], work["sink"]
    auth = cluster.automation
    assert cluster.lb.post(f"/v1/projects/{pid}/topics", headers=auth, json={"name": "parked"}).status_code == 201
    assert cluster.lb.post(f"/v1/projects/{pid}/topics/parked/subscriptions", headers=auth,
                           json={"name": "inspect"}).status_code == 201
    patched = cluster.lb.request("PATCH", f"/v1/projects/{pid}/topics/events/subscriptions/to-sink", headers=auth,
                                 json={"dead_letter": {"topic": "parked", "after_attempts": 3}})
    assert patched.status_code == 200, patched.text
    time.sleep(2.5)  # the push workers re-read the subscription
    answer = cluster.lb.post(f"/v1/projects/{pid}/topics/events:publish", headers=auth,
                             json={"messages": [{"text": json.dumps({"id": "doomed", "fail": True})}]})
    assert answer.status_code == 200
    parked = poll(lambda: cluster.lb.post(f"/v1/projects/{pid}/topics/parked/subscriptions/inspect:pull", headers=auth,
                                          json={"max_messages": 10, "timeout_ms": 1000}).json()["messages"],
                  bool, "the message was not dead-lettered", timeout=30)
    assert len(parked) == 1 and parked[0]["attributes"]["cai-dead-letter-attempts"] == "3", parked
    assert len(sink.calls("doomed", "begin")) == 3  # three attempts in all, whichever replica made them


def test_a_cron_tick_fires_once_and_a_killed_replica_s_firing_is_taken_over(cluster: Cluster, work: dict[str, Any]) -> None:
    pid, sink = work["pid"], work["sink"]
    created = cluster.lb.post(f"/v1/projects/{pid}/triggers", headers=cluster.automation, json={
        "name": "new-year", "target": {"service": "sink", "path": "/invoke"},
        "source": {"type": "schedule", "schedule": {"cron": "0 0 1 1 *", "payload": json.dumps({"id": "cron", "sleep": 4})}}})
    assert created.status_code == 202, created.text
    poll(lambda: cluster.lb.get(f"/v1/projects/{pid}/triggers/new-year", headers=cluster.automation).json()["state"],
         lambda state: state == "ready", "the trigger did not become ready")
    # Every replica was down since before the last new year: three ticks missed, the newest fires once.
    engine = create_engine(cluster.database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE serverless_triggers SET schedule_from = now() - interval '1100 days' "
                          "WHERE name = 'new-year'"))
    engine.dispose()
    begun = poll(lambda: sink.calls("cron", "begin"), bool, "the missed tick did not fire", timeout=15)
    time.sleep(1)
    assert len(sink.calls("cron", "begin")) == 1  # one firing across both replicas
    owner = cluster.replica_of(begun[0]["home"])
    kill_replica(owner)
    killed = time.monotonic()
    survivor = next(r for r in cluster.replicas if r is not owner)
    poll(lambda: [c for c in sink.calls("cron", "done") if cluster.replica_of(c["home"]) is survivor], bool,
         "the survivor did not fire the tick again", timeout=30)
    assert [cluster.replica_of(c["home"]) for c in sink.calls("cron", "done")] == [survivor]  # the first was cut
    print(f"cron firing taken over and done {time.monotonic() - killed:.1f} s after the kill")
    runs = poll(lambda: cluster.lb.get(f"/v1/projects/{pid}/triggers/new-year", headers=cluster.automation).json()["runs"],
                lambda runs: runs and runs[0]["status"] != "running", "the run stayed running")
    assert len(runs) == 1 and runs[0]["status"] == "succeeded", runs
    cluster.restart(owner)
