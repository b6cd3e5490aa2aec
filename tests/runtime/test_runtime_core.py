"""The shared scheduling core's small rules: durations, the weighted split, scale-up decisions."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from caiplatform.adapters.instances import Revision, Workload, parse_duration
from caiplatform.ports.runtime import RevisionSpec, Scaling, TrafficTarget, WorkloadRef


@pytest.mark.parametrize(("text", "expected"), [
    ("336h", timedelta(days=14)),
    ("14d", timedelta(days=14)),
    ("1h30m", timedelta(minutes=90)),
    ("90s", timedelta(seconds=90)),
    ("48", timedelta(hours=48)),
    ("", timedelta(days=14)),
    ("soon", timedelta(days=14)),
    ("5x", timedelta(days=14)),
])
def test_parse_duration(text: str, expected: timedelta):
    assert parse_duration(text) == expected


REF = WorkloadRef("p", "abcd1234", "w")


def revision(generation: int, state: str = "ready", **scaling) -> Revision:
    spec = RevisionSpec(REF, f"w-{generation:05d}", generation, "img", scaling=Scaling(**scaling))
    return Revision(spec=spec, created_at=datetime.now(UTC), state=state)  # type: ignore[arg-type]


def test_split_is_exact_over_every_hundred_requests():
    workload = Workload(REF)
    for r in (revision(1), revision(2), revision(3)):
        workload.revisions[r.name] = r
    workload.traffic = [TrafficTarget(13, "w-00001"), TrafficTarget(50, "w-00002"), TrafficTarget(37, "w-00003")]
    picks = Counter(workload.pick(None)[0].name for _ in range(300))
    assert picks == {"w-00001": 39, "w-00002": 150, "w-00003": 111}


def test_latest_follows_the_newest_ready_revision():
    workload = Workload(REF)
    for r in (revision(1), revision(2, "not_ready"), revision(3, "unknown")):
        workload.revisions[r.name] = r
    assert workload.pick(None)[0].name == "w-00001"
    assert workload.routed() == {"w-00001"}
    with pytest.raises(LookupError):
        workload.pick("nope")


def test_zero_percent_entries_are_never_picked_but_tags_route():
    workload = Workload(REF)
    for r in (revision(1), revision(2)):
        workload.revisions[r.name] = r
    workload.traffic = [TrafficTarget(100, latest_revision=True), TrafficTarget(0, "w-00001", tag="old")]
    assert {workload.pick(None)[0].name for _ in range(50)} == {"w-00002"}
    assert workload.pick("old")[0].name == "w-00001"
    assert workload.routed() == {"w-00001", "w-00002"}


def test_scale_up_decisions():
    cold = revision(1, max_scale=3, container_concurrency=10)
    assert cold.should_scale_up()  # nothing runs or starts
    cold.starting, cold.waiting = 1, 5
    assert not cold.should_scale_up()  # the one on its way holds ten
    cold.waiting = 10
    assert cold.should_scale_up()  # eleven requests need a second
    cold.starting = 3
    assert not cold.should_scale_up()  # the ceiling
    unbounded = revision(2, container_concurrency=0)
    unbounded.starting, unbounded.waiting = 1, 500
    assert not unbounded.should_scale_up()
    assert revision(3, max_scale=0).ceiling == 10  # 0: the runtime's default ceiling
