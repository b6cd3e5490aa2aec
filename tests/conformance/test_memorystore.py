"""Memory store provisioner conformance: the in-memory double and the local Valkey processes."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.memorystore import *  # noqa: F403
from caiplatform.testing.conformance.memorystore import apply_notimpl


@pytest.fixture(params=["memory", "local"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def provisioner(request, backend, tmp_path):
    apply_notimpl(request, backend)
    if backend == "memory":
        from caiplatform.adapters.memory.memorystore import InMemoryProvisioner

        adapter = InMemoryProvisioner()
    else:
        from caiplatform.adapters.local.memorystore import LocalValkeyProvisioner

        adapter = LocalValkeyProvisioner(tmp_path / "data")
    await adapter.start()
    try:
        yield adapter
    finally:
        await adapter.close()
