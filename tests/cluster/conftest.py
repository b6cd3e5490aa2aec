"""Two `caiplatform serve` replicas behind a round-robin balancer, on engines of this group's own.

PostgreSQL is a fresh database on the machine's server (never stopped here). NATS (JetStream), Redis (a
Valkey server) and OpenBao (a dev server) are processes of the group's own on free loopback ports, so the
fault tests can stop and start them without touching anyone else's engines. The replicas share the
session key and every engine, and each has its own data dir (workload processes, images) and replica id.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from caiplatform.testing import engines
from caiplatform.testing.cluster import (
    OwnProcess,
    RoundRobin,
    dev_root_token,
    own_nats,
    own_openbao_dev,
    own_valkey,
)
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess
from caiplatform.testing.sources import directory_tarball, write_tree

from .support import SINK, Sink

RATE_RPS = 20
RATE_BURST = 40
AUTOMATION_TOKEN = "cluster-automation-token"


@dataclass
class Cluster:
    replicas: list[ServeProcess]
    lb: RoundRobin
    database_url: str
    nats: OwnProcess
    redis: OwnProcess
    redis_prefix: str
    bao: OwnProcess
    admin: dict[str, str]
    root: Path
    sink: Sink
    starting: dict[ServeProcess, threading.Thread] = field(default_factory=dict)

    @property
    def automation(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {AUTOMATION_TOKEN}"}

    def replica_of(self, instance: str) -> ServeProcess:
        """The replica that ran the sink's `instance`: the one whose data dir holds that instance's home, where
        it wrote its name (`support.SINK`)."""
        return next(r for r in self.replicas
                    if any(instance in p.read_text().split() for p in r.data_dir.glob("runtime/home/*/sink-instances")))

    def restart(self, replica: ServeProcess, *, wait: bool = True) -> None:
        """Start a stopped (or killed) replica again on its port and data dir; without `wait` it comes up
        while the test goes on (the next test's `replicas_up` waits for it)."""
        if replica.proc is None and replica not in self.starting:
            thread = threading.Thread(target=replica.start, daemon=True)
            self.starting[replica] = thread
            thread.start()
        if wait:
            for thread in self.starting.values():
                thread.join(180)
            self.starting.clear()

    def sign_in(self, via: ServeProcess | None = None) -> str:
        url = (via.base_url if via else self.replicas[0].base_url) + "/v1/auth/login"
        answer = httpx.post(url, json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}, timeout=30)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["token"])


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        engines.require_tcp("postgres", engines.POSTGRES_URL, 5432)
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    root: Path = tmp_path_factory.mktemp("cluster")
    bao = own_openbao_dev(root / "openbao").start()
    nats = own_nats(root / "nats").start()
    redis = own_valkey(root / "valkey").start()
    prefix = f"cai-test-{secrets.token_hex(4)}:"
    replicas: list[ServeProcess] = []
    # The sink service reports to this collector on host loopback: a workload's own network reaches no port
    # of the host but the ones the operator opens (CAI_SANDBOX_ALLOW), so the replicas open this one.
    sink = Sink()
    try:
        with engines.fresh_postgres_database() as database_url:
            env = {
                "CAI_DATABASE_URL": database_url,
                "CAI_NATS_URL": f"nats://127.0.0.1:{nats.port}",
                "CAI_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
                "CAI_REDIS_PREFIX": prefix,
                "CAI_BAO_ADDR": f"http://127.0.0.1:{bao.port}",
                "CAI_BAO_TOKEN": dev_root_token(bao),
                "CAI_SESSION_KEY": secrets.token_urlsafe(48),
                "CAI_SECRETS_KEY": secrets.token_urlsafe(48),
                "RATELIMIT_RPS": str(RATE_RPS),
                "RATELIMIT_BURST": str(RATE_BURST),
                "CAI_AUTOMATION_TOKEN": AUTOMATION_TOKEN,
                "CAI_SCALE_TO_ZERO_SECONDS": "600",
                "CAI_FORWARDED_ALLOW_IPS": "127.0.0.1",  # the balancer (and the tests, as one) on loopback
                "CAI_SANDBOX_ALLOW": f"127.0.0.1:{sink.port}",
            }
            for name in ("a", "b"):
                (root / f"replica-{name}").mkdir()
                replica = ServeProcess(root / f"replica-{name}" / "data", env={**env, "CAI_REPLICA_ID": f"replica-{name}"})
                replicas.append(replica)
            # Started at once: one migrates the schema and creates the admin, the other waits for it.
            starting = [threading.Thread(target=replica.start) for replica in replicas]
            for thread in starting:
                thread.start()
            for thread in starting:
                thread.join()
            assert all(r.proc is not None and r.proc.poll() is None for r in replicas), [r.log_tail() for r in replicas]
            lb = RoundRobin(replicas)
            token = httpx.post(f"{replicas[0].base_url}/v1/auth/login",
                               json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}, timeout=30).json()["token"]
            cluster = Cluster(replicas, lb, database_url, nats, redis, prefix, bao, {"Authorization": f"Bearer {token}"},
                              root, sink)
            yield cluster
            for thread in cluster.starting.values():  # a replica a test started again in the background
                thread.join(180)
            lb.close()
            for replica in replicas:
                replica.stop()
    finally:
        for replica in replicas:
            replica.stop()
        nats.stop()
        redis.stop()
        bao.stop()
        sink.close()


@pytest.fixture(scope="package")
def work(cluster: Cluster) -> dict[str, Any]:
    """The default project, the sink's collector and code; `image` once the function is built everywhere."""
    project = next(p for p in cluster.lb.get("/v1/projects", headers=cluster.automation).json()["projects"]
                   if p["slug"] == "default")
    return {"pid": project["id"], "short": project["short"], "sink": cluster.sink,
            "code": directory_tarball(write_tree(cluster.root / "sink-src", SINK))}


@pytest.fixture
def replicas_up(cluster: Cluster) -> Cluster:
    """Every replica serving when the test starts: one a previous test killed is started again."""
    for replica in cluster.replicas:
        cluster.restart(replica)
    assert all(r.proc is not None and r.proc.poll() is None for r in cluster.replicas)
    return cluster
