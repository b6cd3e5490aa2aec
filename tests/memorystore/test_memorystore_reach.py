"""Which store addresses a project's runs reach (services/memorystore_reach.py): what the provisioner lists
now, on this machine, published for the projects with a live run; changes made elsewhere (another replica)
arrive by the periodic round; a failure never fails the caller."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from caiplatform.sandbox.network import Network
from caiplatform.services.memorystore_reach import MemoryStoreReach


class Listed:
    """A provisioner's `list`, changed by the test as another replica would change the records."""

    def __init__(self) -> None:
        self.stores: dict[str, list[tuple[str, int]]] = {}
        self.broken = False

    async def list(self, project_id: str) -> list[SimpleNamespace]:
        if self.broken:
            raise ConnectionError("database unreachable")
        return [SimpleNamespace(host=h, port=p) for h, p in self.stores.get(project_id, [])]


@pytest.mark.process
async def test_the_round_publishes_what_changed_elsewhere_for_projects_with_a_live_run():
    network = Network()
    if network.problem():
        pytest.fail(network.problem())
    listed = Listed()
    reach = MemoryStoreReach(listed, network.bridges)  # type: ignore[arg-type]
    listed.stores = {"p1": [("127.0.0.7", 6379), ("10.0.0.5", 6379)], "p2": [("127.0.0.8", 6379)]}
    run = network.create(network.policy(), group="p1")
    try:
        await reach.round()
        # p1's store on this machine; a store elsewhere is routed, not bridged; p2 has no run: nothing asked.
        assert network.bridges.published("p1") == {("127.0.0.7", 6379)}
        assert network.bridges.published("p2") == frozenset()
        listed.stores["p1"] = []  # deleted through another replica
        await reach.round()
        assert network.bridges.published("p1") == frozenset()
        listed.broken = True
        await reach.changed("p1")  # logged, not raised: a store request or an instance start goes on
    finally:
        run.close()
    assert network.bridges.groups() == set()
