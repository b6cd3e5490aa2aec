"""The project provisioning conformance suite over the in-memory and local adapters."""

from __future__ import annotations

import pytest

from caiplatform.clock import ManualClock
from caiplatform.registry import default_registry
from caiplatform.testing.conformance.projects import *  # noqa: F403 - the shared suite


@pytest.fixture(params=["memory", "local"])
def provisioner_factory(request, tmp_path):
    clock = ManualClock()
    if request.param == "memory":
        shared = default_registry.load("projects", "memory")(clock=clock)
        return lambda: shared
    cls = default_registry.load("projects", "local")
    return lambda: cls(tmp_path, clock=clock)
