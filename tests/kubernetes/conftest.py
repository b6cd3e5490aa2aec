"""What the Kubernetes tests share: a cluster emulated per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from caiplatform.testing.kube_cluster import EmulatedCluster, emulated_cluster


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with emulated_cluster() as emulated:
        yield emulated

