"""MCP host conformance: the in-memory host, the local (supervised process) host and Knative Services on
the Kubernetes API emulator (its objects and API calls audited after each test)."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.mcp_host import *  # noqa: F403
from caiplatform.testing.conformance.memorystore import apply_notimpl
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "kubernetes"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def mcp_host(request, backend, tmp_path):
    apply_notimpl(request, kube_support.marked_as(backend))
    if backend == "kubernetes":
        from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder
        from caiplatform.adapters.kubernetes.mcp_host import KnativeMcpHost
        from caiplatform.adapters.kubernetes.runtime import KnativeRuntime

        async with kube_support.cluster() as cluster:
            builder = BuildKitJobBuilder(settings=cluster.settings, registry_host=kube_support.registry_host(),
                                       context_dir=kube_support.build_context_dir(tmp_path / "build-context"))
            runtime = KnativeRuntime(settings=cluster.settings, images=builder.resolve)
            try:
                yield KnativeMcpHost(builder, runtime, startup_timeout=60)
            finally:
                await runtime.close()
                await builder.close()
        return
    if backend == "memory":
        from caiplatform.adapters.memory.mcp_host import InMemoryMcpHost

        yield InMemoryMcpHost()
        return
    from caiplatform.adapters.local.mcp_host import LocalMcpHost
    from caiplatform.supervisor import ProcessSupervisor

    supervisor = ProcessSupervisor(tmp_path / "run")
    host = LocalMcpHost(tmp_path / "data", supervisor=supervisor)
    try:
        yield host
    finally:
        await host.close()
        await supervisor.stop_all()
