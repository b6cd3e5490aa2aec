"""Issue 38: a revision's pods on the Kubernetes runtime get the traces endpoint and the log format like the
local runtime's instances, after the tenant's variables: read from the Knative Service the runtime renders
on the emulated cluster. The endpoint is one a pod reaches: `CAI_KUBE_OTEL_ENDPOINT`, else the server's
collector unless it is on the server's loopback; nothing while tracing is off."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from caiplatform import logjson, tracing
from caiplatform.adapters.kubernetes.runtime import KnativeRuntime
from caiplatform.ports.runtime import RevisionSpec, WorkloadRef

IMAGE = "registry.local/fn@sha256:" + "1" * 64
TENANT = {"GREETING": "hi", tracing.WORKLOAD_ENDPOINT: "http://tenant.example/v1/traces", logjson.ENV: "json"}


@pytest.fixture
def traced():
    """`traced(endpoint, capture)`: tracing on for the test, the server's collector at `endpoint`."""
    from opentelemetry.sdk.trace import TracerProvider

    providers = []

    def on(endpoint: str, capture: bool = False) -> None:
        provider = TracerProvider()
        providers.append(provider)
        tracing.activate(provider, workload_endpoint=endpoint, capture=capture)

    yield on
    tracing.deactivate()
    for provider in providers:
        provider.shutdown()


async def _env(runtime: KnativeRuntime, name: str, **secret_env: str) -> dict[str, str]:
    ref = WorkloadRef(str(uuid.uuid4()), "p" + uuid.uuid4().hex[:7], name)
    await runtime.apply(RevisionSpec(ref, f"{name}-00001", 1, IMAGE, env=dict(TENANT), secret_env=secret_env))
    container = (await runtime.spec_document(ref))["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names  # one entry a name: the tenant's never shadow ours
    return {e["name"]: e.get("value", "<secret>") for e in container["env"]}


async def test_off_pods_get_the_log_format_and_no_traces_endpoint(cluster):
    env = await _env(KnativeRuntime(settings=cluster.settings), "off", **{logjson.ENV: "json"})
    assert env["GREETING"] == "hi" and env[logjson.ENV] == "text"  # the server's format, not the tenant's
    assert tracing.WORKLOAD_ENDPOINT not in env and tracing.WORKLOAD_CAPTURE not in env


async def test_the_operators_cluster_endpoint_wins(cluster, traced, monkeypatch):
    traced("http://127.0.0.1:4318/v1/traces", capture=True)
    monkeypatch.setattr(logjson, "_format", "json")
    settings = replace(cluster.settings, otel_endpoint="http://otel-collector.monitoring:4318/")
    env = await _env(KnativeRuntime(settings=settings), "named")
    assert env[tracing.WORKLOAD_ENDPOINT] == "http://otel-collector.monitoring:4318/v1/traces"
    assert env[tracing.WORKLOAD_CAPTURE] == "true" and env[logjson.ENV] == "json"


async def test_the_servers_collector_unless_on_loopback(cluster, traced):
    traced("http://127.0.0.1:4318/v1/traces")
    env = await _env(KnativeRuntime(settings=cluster.settings), "loopback")
    assert tracing.WORKLOAD_ENDPOINT not in env  # the server's loopback is not the pod's: untraced
    traced("http://collector.internal:4318/v1/traces")
    env = await _env(KnativeRuntime(settings=cluster.settings), "shared")
    assert env[tracing.WORKLOAD_ENDPOINT] == "http://collector.internal:4318/v1/traces"
    assert tracing.WORKLOAD_CAPTURE not in env  # message contents only on the operator's opt-in


async def test_a_revision_keeps_its_environment(cluster, traced, monkeypatch):
    """Applying an existing revision again after the server's settings changed rewrites nothing (Knative
    refuses a changed template under the same name; a new revision gets the new values)."""
    runtime = KnativeRuntime(settings=cluster.settings)
    ref = WorkloadRef(str(uuid.uuid4()), "p" + uuid.uuid4().hex[:7], "kept")
    spec = RevisionSpec(ref, "kept-00001", 1, IMAGE)
    await runtime.apply(spec)
    monkeypatch.setattr(logjson, "_format", "json")
    traced("http://collector.internal:4318/v1/traces")
    await runtime.apply(spec)

    async def env() -> dict[str, str]:
        container = (await runtime.spec_document(ref))["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    assert (await env())[logjson.ENV] == "text" and tracing.WORKLOAD_ENDPOINT not in await env()
    await runtime.apply(RevisionSpec(ref, "kept-00002", 2, IMAGE))
    assert (await env())[logjson.ENV] == "json"
    assert (await env())[tracing.WORKLOAD_ENDPOINT] == "http://collector.internal:4318/v1/traces"
