"""Builder conformance: the in-memory builder and the local image builder."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.builder import *  # noqa: F403
from caiplatform.testing.conformance.builder import apply_notimpl


@pytest.fixture(params=["memory", "local"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def builder(request, backend, tmp_path):
    apply_notimpl(request, backend)
    if backend == "memory":
        from caiplatform.adapters.memory.builder import InMemoryBuilder

        adapter = InMemoryBuilder()
    else:
        from caiplatform.adapters.local.builder import LocalBuilder

        adapter = LocalBuilder(tmp_path / "data")
    try:
        yield adapter
    finally:
        await adapter.close()
