"""Every Prometheus metric the platform exports at `GET /metrics`, defined once (docs/observability.md).

One `Metrics` per `Platform`, each with its own `CollectorRegistry` (never the process-wide default): tests
build many platforms in one process, and each counts only its own. Recording is a prometheus-client
increment or observation (microseconds, its own lock, no I/O).

Labels are bounded: a route's template (never the raw path), a project and an agent name, an outcome, a
status class; never a session, user or request id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED = "<unmatched>"
# The health answers' top-level checks (those without a `checks` or `dependencies` map).
HEALTH_KEYS = ("database", "sessions", "kubernetes", "crd")
NOT_CONFIGURED = "not configured"

# Requests are mostly milliseconds; invokes and starts run to minutes; builds to many minutes.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
INVOKE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BUILD_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "none"


class _InstancesCollector(Collector):
    """`cai_agent_instances{project,agent}`, read from the runtime at scrape time (a callable set later)."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, str, int]]] | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("cai_agent_instances", "Running instances of an agent on this replica's runtime",
                                   labels=["project", "agent"])
        if self.source is not None:
            try:
                for project, agent, count in self.source():
                    family.add_metric([project, agent], count)
            except Exception:  # noqa: BLE001 - a scrape never fails on a runtime's count
                pass
        yield family


class _BacklogCollector(Collector):
    """`cai_subscription_backlog` and `cai_subscription_unacknowledged`, from the last round of the backlog
    sampler (`services/messaging_backlog.py`): the scrape reads memory, never the broker. A subscription
    gone since is gone from the next round's rows."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], tuple[int, int]] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["project", "topic", "subscription"]
        backlog = GaugeMetricFamily("cai_subscription_backlog",
                                    "Messages a subscription owes (not yet delivered or not yet acknowledged), "
                                    "as of the last sampling round", labels=labels)
        unacked = GaugeMetricFamily("cai_subscription_unacknowledged",
                                    "Messages delivered and not yet acknowledged, as of the last sampling round",
                                    labels=labels)
        for key, (owed, pending_ack) in list(self.rows.items()):
            backlog.add_metric(list(key), owed)
            unacked.add_metric(list(key), pending_ack)
        yield from (backlog, unacked)


class _PoolsCollector(Collector):
    """The warm sandbox pools (`caiplatform.codesandbox.pool.BasePool.describe()`), read at scrape time:
    `cai_sandbox_pool_size`, `cai_sandbox_pool_sandboxes{state}` (warm, starting, running) and the
    pools' own counts of snippets served, callers refused after the wait, and sandboxes that failed to start."""

    def __init__(self) -> None:
        self.pools: dict[str, Any] = {}

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        size = GaugeMetricFamily("cai_sandbox_pool_size", "Sandboxes a warm pool keeps", labels=["pool"])
        states = GaugeMetricFamily("cai_sandbox_pool_sandboxes", "A warm pool's sandboxes by state",
                                   labels=["pool", "state"])
        served = CounterMetricFamily("cai_sandbox_pool_served", "Snippets a pool's sandboxes ran", labels=["pool"])
        refused = CounterMetricFamily("cai_sandbox_pool_refused",
                                      "Callers refused (503) after waiting the pool's wait for a warm sandbox",
                                      labels=["pool"])
        failed = CounterMetricFamily("cai_sandbox_pool_failed_starts", "Sandboxes that failed to start",
                                     labels=["pool"])
        for name, pool in list(self.pools.items()):
            try:
                described = pool.describe()
            except Exception:  # noqa: BLE001 - a scrape never fails on a pool
                continue
            size.add_metric([name], described.get("size", 0))
            for state in ("warm", "starting", "running"):
                states.add_metric([name, state], described.get(state, 0))
            served.add_metric([name], described.get("served", 0))
            refused.add_metric([name], described.get("refused", 0))
            failed.add_metric([name], described.get("failed_starts", 0))
        yield from (size, states, served, refused, failed)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("cai_http_requests", "HTTP requests answered, by route template",
                                     ["method", "route", "status_class"], registry=r)
        self.http_duration = Histogram("cai_http_request_duration_seconds", "Time to answer an HTTP request",
                                       ["method", "route"], buckets=HTTP_BUCKETS, registry=r)
        self.agent_invokes = Counter("cai_agent_invokes", "Agent invocations, by outcome (ok or error)",
                                     ["project", "agent", "outcome"], registry=r)
        self.agent_invoke_duration = Histogram("cai_agent_invoke_duration_seconds", "Time of an agent invocation",
                                               ["project", "agent"], buckets=INVOKE_BUCKETS, registry=r)
        self.cold_starts = Counter("cai_agent_cold_starts", "Instances the runtime started for an agent",
                                   ["project", "agent"], registry=r)
        self.instance_start_duration = Histogram("cai_instance_start_duration_seconds",
                                                 "Time for the runtime to start an instance",
                                                 buckets=INVOKE_BUCKETS, registry=r)
        self.builds = Counter("cai_builds", "Builds finished, by outcome", ["outcome"], registry=r)
        self.build_duration = Histogram("cai_build_duration_seconds", "Time of a build, start to finish",
                                        buckets=BUILD_BUCKETS, registry=r)
        self.messages_published = Counter("cai_messages_published", "Messages published to a topic",
                                          ["project", "topic"], registry=r)
        self.push_deliveries = Counter(
            "cai_push_deliveries", "Push delivery attempts, by outcome (acked, retry, dead_lettered, dropped)",
            ["project", "topic", "outcome"], registry=r)
        self.sandbox_waits = Histogram("cai_sandbox_pool_wait_seconds", "Time a caller waited for a warm sandbox",
                                       ["pool"], buckets=HTTP_BUCKETS, registry=r)
        self.trigger_firings = Counter("cai_trigger_firings", "Trigger deliveries to their target, by outcome",
                                       ["project", "kind", "outcome"], registry=r)
        self.engine_up = Gauge("cai_engine_up", "1 when a dependency passed the last /healthz check, else 0",
                               ["api", "check"], registry=r)
        self._instances = _InstancesCollector()
        r.register(self._instances)
        self._pools = _PoolsCollector()
        r.register(self._pools)
        self._backlog = _BacklogCollector()
        r.register(self._backlog)

    def instances_from(self, source: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Where `cai_agent_instances` is read at scrape time: (project, agent, count) rows."""
        self._instances.source = source

    def pool(self, name: str, pool: Any) -> None:
        """Export a warm sandbox pool (`describe()` at scrape time, `observe_wait` per acquisition)."""
        self._pools.pools[name] = pool
        waits = self.sandbox_waits.labels(name)
        pool.observe_wait = waits.observe

    def set_backlog(self, rows: dict[tuple[str, str, str], tuple[int, int]]) -> None:
        """A sampling round's (project, topic, subscription) -> (backlog, unacknowledged), replacing the last."""
        self._backlog.rows = rows

    def observe_trigger(self, project: str, kind: str, ok: bool) -> None:
        self.trigger_firings.labels(project, kind, "ok" if ok else "error").inc()

    def observe_health(self, api: str, body: Mapping[str, Any]) -> None:
        """`cai_engine_up{api,check}` from one API's `/healthz` answer, whichever shape it has (`checks`,
        `dependencies`, or top-level `database`/`sessions`/...); a check that is `not configured` is left out."""
        checks = body.get("checks") or body.get("dependencies")
        if not isinstance(checks, Mapping):
            checks = {k: v for k, v in body.items() if k in HEALTH_KEYS}
        for check, result in checks.items():
            state = result.get("status") if isinstance(result, Mapping) else result
            if state == NOT_CONFIGURED:
                continue
            up = state == "ok" or (isinstance(result, Mapping) and result.get("ok") is True)
            self.engine_up.labels(api, check).set(1 if up else 0)

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, status_class(status)).inc()
        self.http_duration.labels(method, route).observe(seconds)

    def observe_invoke(self, project: str, agent: str, ok: bool, seconds: float) -> None:
        self.agent_invokes.labels(project, agent, "ok" if ok else "error").inc()
        self.agent_invoke_duration.labels(project, agent).observe(seconds)

    def observe_start(self, project: str, agent: str, seconds: float) -> None:
        self.cold_starts.labels(project, agent).inc()
        self.instance_start_duration.observe(seconds)

    def observe_build(self, outcome: str, seconds: float | None) -> None:
        self.builds.labels(outcome).inc()
        if seconds is not None and seconds >= 0:
            self.build_duration.observe(seconds)

    def observe_published(self, project: str, topic: str, count: int) -> None:
        if count:
            self.messages_published.labels(project, topic).inc(count)

    def observe_push(self, project: str, topic: str, outcome: str) -> None:
        self.push_deliveries.labels(project, topic, outcome.replace("-", "_")).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def route_template(scope: Mapping[str, Any]) -> str:
    """The template of the route that answered (`/v1/agents/{name}/invoke`), or `<unmatched>`."""
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template if isinstance(template, str) and template else UNMATCHED
