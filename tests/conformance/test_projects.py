"""The project provisioning conformance suite over the in-memory, local and Kubernetes adapters."""

from __future__ import annotations

import pytest

from caiplatform.clock import ManualClock
from caiplatform.registry import default_registry
from caiplatform.testing.conformance.projects import *  # noqa: F403 - the shared suite
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "kubernetes"])
async def provisioner_factory(request, tmp_path):
    clock = ManualClock()
    if request.param == "memory":
        shared = default_registry.load("projects", "memory")(clock=clock)
        yield lambda: shared
    elif request.param == "local":
        cls = default_registry.load("projects", "local")
        yield lambda: cls(tmp_path, clock=clock)
    else:
        cls = default_registry.load("projects", "kubernetes")
        async with kube_support.cluster() as cluster:
            yield lambda: cls(settings=cluster.settings, clock=clock)
