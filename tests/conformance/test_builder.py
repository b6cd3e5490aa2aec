"""Builder conformance: the in-memory builder, the local image builder and BuildKit Jobs on the Kubernetes API
emulator."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.builder import *  # noqa: F403
from caiplatform.testing.conformance.builder import apply_notimpl
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "kubernetes"])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def shared_data_dir(tmp_path_factory):
    """One data dir for the module: Python environments are shared the way a server shares them."""
    return tmp_path_factory.mktemp("builder-data")


@pytest.fixture
async def builder(request, backend, shared_data_dir):
    apply_notimpl(request, kube_support.marked_as(backend))
    if backend == "kubernetes":
        from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder

        async with kube_support.cluster() as cluster:
            adapter = BuildKitJobBuilder(settings=cluster.settings, context_dir=kube_support.build_context_dir(shared_data_dir / "build-context"),
                                       registry_host=kube_support.registry_host())
            try:
                yield adapter
            finally:
                await adapter.close()
        return
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
