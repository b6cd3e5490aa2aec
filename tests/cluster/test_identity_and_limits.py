"""Identity and limits hold for the cluster as a whole: tokens and keys, rate limits, sign-in throttle."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from caiplatform.testing.http import ADMIN_EMAIL
from caiplatform.testing.serve import ServeProcess

from .conftest import RATE_BURST, RATE_RPS, Cluster
from .support import poll

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("replicas_up")]


def test_a_session_token_from_one_replica_is_accepted_by_every_replica(cluster: Cluster) -> None:
    a, b = cluster.replicas
    token = cluster.sign_in(via=a)
    for replica in (a, b):
        me = httpx.get(f"{replica.base_url}/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200 and me.json()["email"] == ADMIN_EMAIL


def test_a_key_revoked_on_one_replica_is_refused_by_the_other_on_the_next_request(cluster: Cluster) -> None:
    a, b = cluster.replicas
    created = httpx.post(f"{a.base_url}/v1/users/me/keys", headers=cluster.admin, json={"display_name": "cluster"})
    assert created.status_code == 201, created.text
    key, key_id = created.json()["secret"], created.json()["key"]["key_id"]
    as_key = {"Authorization": f"Bearer {key}"}
    for replica in (a, b):  # warm: each replica has authorized it once
        assert httpx.get(f"{replica.base_url}/v1/auth/me", headers=as_key).status_code == 200
    assert httpx.delete(f"{b.base_url}/v1/users/me/keys/{key_id}", headers=cluster.admin).status_code in (200, 204)
    assert httpx.get(f"{a.base_url}/v1/auth/me", headers=as_key).status_code == 401
    assert httpx.get(f"{b.base_url}/v1/auth/me", headers=as_key).status_code == 401


def _new_key(cluster: Cluster, name: str) -> dict[str, str]:
    created = cluster.lb.post("/v1/users/me/keys", headers=cluster.admin, json={"display_name": name})
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['secret']}"}


def test_the_rate_limit_holds_for_the_cluster_within_ten_percent(cluster: Cluster) -> None:
    """A token bucket of RATELIMIT_BURST and RATELIMIT_RPS for one principal across both replicas (each
    replica alone would let about twice as much through). Requests go 8 at a time; the bucket refills
    between the first request's arrival and the last one's, which the client brackets by send and
    answer times."""
    headers = _new_key(cluster, "rate")

    def one(_: int) -> tuple[float, float, int]:
        sent = time.monotonic()
        status = cluster.lb.get("/v1/auth/me", headers=headers).status_code
        return sent, time.monotonic(), status

    # In rounds until the requests came faster than the bucket refills (a loaded machine answers slowly:
    # four bursts' worth could take longer than the refill of as many), at most twelve bursts' worth.
    calls: list[tuple[float, float, int]] = []
    with ThreadPoolExecutor(8) as pool:
        while len(calls) < 12 * RATE_BURST:
            calls += list(pool.map(one, range(2 * RATE_BURST)))
            high = RATE_BURST + RATE_RPS * (max(c[1] for c in calls) - min(c[0] for c in calls))
            if len(calls) >= 4 * RATE_BURST and 1.1 * high < len(calls):
                break
    statuses = [status for _, _, status in calls]
    assert set(statuses) <= {200, 429} and 429 in statuses
    allowed = statuses.count(200)
    first_sent, first_answered = min(c[0] for c in calls), min(c[1] for c in calls)
    last_sent, last_answered = max(c[0] for c in calls), max(c[1] for c in calls)
    low = RATE_BURST + RATE_RPS * max(0.0, last_sent - first_answered)
    high = RATE_BURST + RATE_RPS * (last_answered - first_sent)
    print(f"rate limit: {allowed} allowed, expected {low:.0f} to {high:.0f}")
    assert 0.9 * low <= allowed <= 1.1 * high, (allowed, low, high)
    # One bucket per replica would let nearly every request through: the test tells them apart only
    # when the requests came faster than that.
    assert 1.1 * high < len(calls), "the requests were too slow to reach the limit"


def _fail_sign_in(cluster: Cluster, client_ip: str) -> int:
    """One failed sign-in attempt through the balancer: a bad invitation token (the IP limit's other
    door, without a password hash to verify, so the test stays fast)."""
    return cluster.lb.post("/v1/invitations/accept", headers={"X-Forwarded-For": client_ip},
                           json={"token": "not-an-invitation", "password": "whatever-password-1"}).status_code


def _recorded_in_the_store(cluster: Cluster, store: redis.Redis, replica: ServeProcess, client_ip: str) -> bool:
    """One failed attempt from a fresh address through `replica`: whether it reached the shared store."""
    answer = httpx.post(f"{replica.base_url}/v1/invitations/accept", headers={"X-Forwarded-For": client_ip},
                        json={"token": "not-an-invitation", "password": "whatever-password-1"})
    assert answer.status_code == 404, answer.text
    return any(store.scan_iter(match=f"{cluster.redis_prefix}signin:*{client_ip}*"))


def _login_everywhere(cluster: Cluster, client_ip: str) -> list[int]:
    return [httpx.post(f"{replica.base_url}/v1/auth/login", headers={"X-Forwarded-For": client_ip},
                       json={"email": ADMIN_EMAIL, "password": "wrong-password-1"}).status_code
            for replica in cluster.replicas]


def test_the_sign_in_throttle_counts_failures_on_every_replica(cluster: Cluster) -> None:
    """10 failed attempts per IP in 15 minutes, whichever replica saw them; then 429 everywhere."""
    assert [_fail_sign_in(cluster, "203.0.113.10") for _ in range(10)] == [404] * 10
    for replica in cluster.replicas:
        refused = httpx.post(f"{replica.base_url}/v1/auth/login", headers={"X-Forwarded-For": "203.0.113.10"},
                             json={"email": ADMIN_EMAIL, "password": "wrong-password-1"})
        assert refused.status_code == 429 and "too many sign-in attempts" in refused.json()["error"]


def test_without_redis_each_replica_enforces_its_own_limits_and_shares_them_again_after(cluster: Cluster) -> None:
    """The documented failure direction: the store down, limits hold per replica (nothing is refused
    for the outage itself, nothing is unlimited); the store back, they are shared again."""
    cluster.redis.stop()
    try:
        # Each replica counts its own 10: 20 failures pass, then both refuse.
        statuses = [_fail_sign_in(cluster, "203.0.113.20") for _ in range(22)]
        assert statuses == [404] * 20 + [429, 429], statuses
        assert cluster.lb.get("/v1/auth/me", headers=cluster.admin).status_code == 200
    finally:
        cluster.redis.start()
    # The replicas try the store again 2 s after it last failed: wait until each records a failure there.
    store = redis.Redis(port=cluster.redis.port, socket_timeout=2)
    probes = (f"198.51.100.{n}" for n in itertools.count(1))
    for replica in cluster.replicas:
        poll(lambda r=replica: _recorded_in_the_store(cluster, store, r, next(probes)), bool,
             f"{replica.base_url} did not use the store again", timeout=15)
    store.close()
    assert [_fail_sign_in(cluster, "203.0.113.21") for _ in range(10)] == [404] * 10
    assert _login_everywhere(cluster, "203.0.113.21") == [429, 429]
