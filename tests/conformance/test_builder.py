"""Builder conformance: the in-memory builder and the local image builder."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.builder import *  # noqa: F403
from caiplatform.testing.conformance.builder import apply_notimpl


@pytest.fixture(params=["memory", "local"])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def shared_data_dir(tmp_path_factory):
    """One data dir for the module: Python environments are shared the way a server shares them."""
    return tmp_path_factory.mktemp("builder-data")


@pytest.fixture
async def builder(request, backend, shared_data_dir):
    apply_notimpl(request, backend)
    if backend == "memory":
        from caiplatform.adapters.memory.builder import InMemoryBuilder

        adapter = InMemoryBuilder()
    else:
        from caiplatform.adapters.local.builder import LocalBuilder

        adapter = LocalBuilder(shared_data_dir)
    try:
        yield adapter
    finally:
        await adapter.close()
