"""The Kubernetes adapters' conformance runs: an emulated cluster per test, audited when the test ends
(every object written validated against the schemas, every API call against the shipped ClusterRole).

With `CAI_TEST_KUBECONFIG` set, the same suites run against that real cluster instead (opt-in, not part
of `.ci/run`; see docs/kubernetes.md): nothing is emulated, the emulator's `notimpl` marks do not apply
(a real cluster has a data plane), builds write their context to `CAI_BUILD_CONTEXT_DIR`, which must
be the build-context volume the cluster's Jobs mount, and the images, the registry and its push settings
are the platform's own variables (`CAI_HARNESS_IMAGE`, `CAI_REGISTRY_HOST`, `CAI_BUILD_PUSH_SECRET`, ...)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

from caiplatform.adapters.kubernetes.client import ClusterSettings

ROLE = Path(__file__).resolve().parents[2] / "backends" / "kubernetes" / "base" / "rbac.yaml"


def real_cluster() -> bool:
    return bool(os.environ.get("CAI_TEST_KUBECONFIG"))


def marked_as(backend: str) -> str:
    """The name `notimpl` marks know this run by: the emulator's gaps are not a real cluster's."""
    return "kubernetes-cluster" if backend == "kubernetes" and real_cluster() else backend


def registry_host() -> str:
    """Where builds push: the cluster's registry (`CAI_REGISTRY_HOST`), or the emulator's pretend one."""
    if not real_cluster():
        return "registry.local"
    from caiplatform.settings import Settings

    return Settings().registry_host


def build_context_dir(default: Path) -> Path:
    return Path(os.environ["CAI_BUILD_CONTEXT_DIR"]) if real_cluster() else default


@dataclass
class Cluster:
    settings: ClusterSettings
    emulated: object | None = None  # kube_cluster.EmulatedCluster


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    kubeconfig = os.environ.get("CAI_TEST_KUBECONFIG")
    if kubeconfig:
        from caiplatform.adapters.kubernetes.client import cluster_settings
        from caiplatform.settings import Settings

        yield Cluster(replace(cluster_settings(Settings()), kubeconfig=kubeconfig, host=None))
        return
    from caiplatform.testing.kube_cluster import emulated_cluster
    from caiplatform.testing.kube_schemas import audit

    with emulated_cluster() as emulated:
        yield Cluster(emulated.settings, emulated)
    audit(emulated.emulator, emulated.calls(), ROLE)  # once the emulator's loop has stopped
