"""Workload runtime conformance: the in-memory runtime and local processes, both running the tiny app, and
Knative on the Kubernetes API emulator (its objects and API calls audited after each test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import caiplatform
from caiplatform.ports.builder import Image
from caiplatform.testing import tiny_app
from caiplatform.testing.conformance.runtime import *  # noqa: F403
from caiplatform.testing.conformance.runtime import IDLE_SECONDS, RuntimeKit, apply_notimpl
from tests.conformance import kube_support


@pytest.fixture(params=["memory", "local", "kubernetes"])
def backend(request) -> str:
    return request.param


def _memory_image(reference: str, env: dict[str, str]) -> Image:
    return Image(reference=reference, digest=reference.rpartition("@")[2], framework="tiny", env=env)


def _local_image(reference: str, env: dict[str, str]) -> Image:
    # The subprocess sees only what it is given: point it at this checkout's package.
    package_root = str(Path(caiplatform.__file__).resolve().parent.parent)
    return Image(
        reference=reference,
        digest=reference.rpartition("@")[2],
        framework="tiny",
        command=[sys.executable, "-m", "caiplatform.testing.tiny_app"],
        env={"PYTHONPATH": package_root, **env},
    )


@pytest.fixture
async def kit(request, backend, tmp_path):
    apply_notimpl(request, kube_support.marked_as(backend))
    if backend == "memory":
        from caiplatform.adapters.memory.runtime import InMemoryRuntime

        kit = RuntimeKit(runtime=None, image_for=_memory_image)  # type: ignore[arg-type]
        kit.runtime = InMemoryRuntime(
            app_factory=lambda image, env: tiny_app.create_app(env), images=kit.resolve, idle_seconds=IDLE_SECONDS
        )
    elif backend == "kubernetes":
        async with kube_support.cluster() as cluster:
            from caiplatform.adapters.kubernetes.runtime import KnativeRuntime

            kit = RuntimeKit(runtime=None, image_for=_memory_image)  # type: ignore[arg-type]
            transport = cluster.emulated.data_plane if cluster.emulated else None  # type: ignore[attr-defined]
            kit.runtime = KnativeRuntime(settings=cluster.settings, images=kit.resolve,
                                         transport=transport, history_dir=tmp_path / "history")
            try:
                yield kit
            finally:
                await kit.runtime.close()
        return
    else:
        from caiplatform.adapters.local.runtime import LocalProcessRuntime

        kit = RuntimeKit(runtime=None, image_for=_local_image)  # type: ignore[arg-type]
        kit.runtime = LocalProcessRuntime(tmp_path / "data", images=kit.resolve, idle_seconds=IDLE_SECONDS)
    await kit.runtime.start()
    try:
        yield kit
    finally:
        await kit.runtime.close()
        await kit.http.aclose()
