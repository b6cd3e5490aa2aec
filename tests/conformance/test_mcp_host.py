"""MCP host conformance: the in-memory host and the local (supervised process) host."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.mcp_host import *  # noqa: F403
from caiplatform.testing.conformance.memorystore import apply_notimpl


@pytest.fixture(params=["memory", "local"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def mcp_host(request, backend, tmp_path):
    apply_notimpl(request, backend)
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
