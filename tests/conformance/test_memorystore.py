"""Memory store provisioner conformance: the in-memory double, the local Valkey processes and Valkey
StatefulSets on the Kubernetes API emulator."""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.memorystore import *  # noqa: F403
from caiplatform.testing.conformance.memorystore import apply_notimpl
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "kubernetes"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def provisioner(request, backend, tmp_path):
    apply_notimpl(request, kube_support.marked_as(backend))
    if backend == "kubernetes":
        from caiplatform.adapters.kubernetes.memorystore import ValkeyStatefulSetProvisioner

        async with kube_support.cluster() as cluster:
            adapter = ValkeyStatefulSetProvisioner(settings=cluster.settings)
            try:
                yield adapter
            finally:
                await adapter.close()
        return
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
