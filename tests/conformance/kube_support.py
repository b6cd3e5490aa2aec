"""The Kubernetes adapters' conformance runs: an emulated cluster per test, audited when the test ends
(every object written validated against the schemas, every API call against the shipped ClusterRole).

With `CAI_TEST_KUBECONFIG` set, the same suites run against that real cluster instead (opt-in, not part
of `.ci/run`; see docs/kubernetes.md): nothing is emulated and nothing audited beyond the suites."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from caiplatform.adapters.kubernetes.client import ClusterSettings

ROLE = Path(__file__).resolve().parents[2] / "backends" / "kubernetes" / "rbac.yaml"


@dataclass
class Cluster:
    settings: ClusterSettings
    emulated: object | None = None  # kube_cluster.EmulatedCluster


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    kubeconfig = os.environ.get("CAI_TEST_KUBECONFIG")
    if kubeconfig:
        yield Cluster(ClusterSettings(kubeconfig=kubeconfig))
        return
    from caiplatform.testing.kube_cluster import emulated_cluster
    from caiplatform.testing.kube_schemas import audit

    with emulated_cluster() as emulated:
        yield Cluster(emulated.settings, emulated)
        audit(emulated.emulator, emulated.calls(), ROLE)
