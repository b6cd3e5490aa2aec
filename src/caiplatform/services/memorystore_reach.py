"""A project's memory stores, reachable from that project's workloads alone (local runtime, docs/sandbox.md).

Every workload runs in a network namespace of its own (caiplatform.sandbox.network). The addresses of a
project's memory stores, as the memory-store API reports them (`connection`, `credential.uri`: the store's
own loopback address and port 6379), are published to the sandbox's bridges (caiplatform.sandbox.bridge)
under the project's id; every workload of that project then has a listener on each of those addresses in
its namespace, copying to the store on the host, and no workload of another project has one:

- at once when a store is created, deleted or restarted through this server (`changed`, the service's hook);
- before an instance or a hosted MCP server of the project starts (`changed`, the runtime's hook), so its
  first instruction sees its project's stores;
- every `INTERVAL_SECONDS` for every project with a live run (`round`), which takes in what other replicas
  did (they share the records) and an address a restart had to move.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

from caiplatform.periodic import PeriodicWork
from caiplatform.ports.memorystore import MemoryStoreProvisioner
from caiplatform.sandbox.bridge import Bridges, Endpoint

INTERVAL_SECONDS = 5.0
log = logging.getLogger(__name__)


def _on_this_machine(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class MemoryStoreReach(PeriodicWork):
    name = "memorystore-reach"

    def __init__(self, provisioner: MemoryStoreProvisioner, bridges: Bridges, interval: float = INTERVAL_SECONDS):
        super().__init__(interval)
        self.provisioner = provisioner
        self.bridges = bridges

    async def endpoints(self, project_id: str) -> set[Endpoint]:
        """The project's stores' addresses on this machine (a store elsewhere is routed, not bridged)."""
        return {(i.host, i.port) for i in await self.provisioner.list(project_id) if _on_this_machine(i.host)}

    async def changed(self, project_id: str) -> None:
        """The project's workloads reach exactly its stores of now (listeners opened and closed). Never
        raises: a store request or a workload start is not failed for it; the next round tries again."""
        try:
            await asyncio.wrap_future(self.bridges.publish(project_id, await self.endpoints(project_id)))
        except Exception:  # noqa: BLE001 - logged; `round` repairs it within INTERVAL_SECONDS
            log.warning("the workloads of %s were not told of its memory stores", project_id, exc_info=True)

    async def round(self) -> None:
        for project_id in sorted(self.bridges.groups()):
            if await self.endpoints(project_id) != self.bridges.published(project_id):
                await self.changed(project_id)
