"""A Kubernetes API in process for the Kubernetes adapters' tests: `kmock`'s emulator
(`kube_emulator`, with the differences from a real API server it works around) plus the controller double
and the request path of `kube_controllers`, on an event loop of their own in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import kmock

from caiplatform.adapters.kubernetes.client import ClusterSettings
from caiplatform.testing.kube_controllers import ControllerDouble, DataPlane
from caiplatform.testing.kube_emulator import RESOURCES, ApiCall, FilteringEmulator, live, recorded_calls

__all__ = ["ApiCall", "EmulatedCluster", "emulated_cluster", "live"]


@dataclass
class EmulatedCluster:
    emulator: FilteringEmulator
    controllers: ControllerDouble
    settings: ClusterSettings

    @cached_property
    def data_plane(self) -> DataPlane:
        return DataPlane(self.emulator)

    def calls(self) -> list[ApiCall]:
        return recorded_calls(self.emulator)


@contextlib.contextmanager
def emulated_cluster(**settings: Any) -> Iterator[EmulatedCluster]:
    """The emulator and the controller double on an event loop of their own, in a thread: the API server
    answers whatever loop (or none) the test and the adapters run on."""
    started: queue.Queue[EmulatedCluster | BaseException] = queue.Queue()
    stop: list[Callable[[], object]] = []

    async def serve() -> None:
        try:
            async with FilteringEmulator() as emulator, kmock.Server(emulator) as server:
                for resource in RESOURCES:
                    emulator.resources[resource] = kmock.ResourceInfo()
                # What the install makes before the control plane runs (backends/kubernetes/base/namespace.yaml):
                # its own namespace, where its builds run.
                platform_namespace = settings.get("platform_namespace", "caiplatform")
                emulator.objects["v1/namespaces", None, platform_namespace] = {
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": platform_namespace, "labels": {"app.kubernetes.io/name": "caiplatform"}}}
                controllers = ControllerDouble(emulator)
                task = asyncio.ensure_future(controllers.run())
                stopped = asyncio.Event()
                loop = asyncio.get_running_loop()
                stop.append(lambda: loop.call_soon_threadsafe(stopped.set))
                started.put(EmulatedCluster(emulator, controllers,
                                            ClusterSettings(host=str(server.url).rstrip("/"), **settings)))
                await stopped.wait()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting test
            started.put(exc)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="kube-emulator", daemon=True)
    thread.start()
    cluster = started.get(timeout=30)
    if isinstance(cluster, BaseException):
        raise cluster
    try:
        yield cluster
    finally:
        stop[0]()
        thread.join(timeout=10)
