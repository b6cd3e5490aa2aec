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
from collections.abc import AsyncIterator, Mapping
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


#: Why the real-cluster runs do not run here: they are opt-in (docs/kubernetes.md).
OPT_IN = ("opt-in: set CAI_TEST_KUBECONFIG (and CAI_BUILD_CONTEXT_DIR, the build-context volume the cluster's "
          "build Jobs mount) to run against a real cluster; docs/kubernetes.md")


def cluster_serve_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What `caiplatform serve` is given, beyond its own environment, to run the HTTP scenario
    (tests/kubernetes/test_e2e_serve.py) on the real cluster of `CAI_TEST_KUBECONFIG`: that kubeconfig as its
    `CAI_KUBECONFIG`, and the build-context directory its build Jobs share. The images, the registry and its
    push settings are the platform's own variables, which the process inherits (`CAI_HARNESS_IMAGE`,
    `CAI_REGISTRY_HOST`, `CAI_BUILD_PUSH_SECRET`, ...); `CAI_KUBE_API_URL` must be left out (it would win
    over the kubeconfig)."""
    kubeconfig = environ.get("CAI_TEST_KUBECONFIG")
    if not kubeconfig:
        raise LookupError(OPT_IN)
    context_dir = environ.get("CAI_BUILD_CONTEXT_DIR")
    if not context_dir:
        raise LookupError("CAI_BUILD_CONTEXT_DIR must name the build-context volume the cluster's build Jobs mount "
                          "(a directory of the test's own would build nothing the Jobs can read)")
    return {"CAI_RUNTIME": "kubernetes", "CAI_KUBECONFIG": kubeconfig, "CAI_BUILD_CONTEXT_DIR": context_dir}


def real_cluster_settings(environ: Mapping[str, str]) -> ClusterSettings:
    """How the test itself reads that cluster (the same kubeconfig, context and namespaces as the server)."""
    from caiplatform.adapters.kubernetes.client import cluster_settings
    from caiplatform.settings import Settings

    return replace(cluster_settings(Settings()), kubeconfig=environ["CAI_TEST_KUBECONFIG"], host=None)


@dataclass
class Cluster:
    settings: ClusterSettings
    emulated: object | None = None  # kube_cluster.EmulatedCluster


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    if real_cluster():
        yield Cluster(real_cluster_settings(os.environ))
        return
    from caiplatform.testing.kube_cluster import emulated_cluster
    from caiplatform.testing.kube_schemas import audit

    with emulated_cluster() as emulated:
        yield Cluster(emulated.settings, emulated)
    audit(emulated.emulator, emulated.calls(), ROLE)  # once the emulator's loop has stopped
