"""Each agent holds its own internal credential (issue 26): one read from an agent's environment does not
open another agent's internal surface (its sessions)."""

from __future__ import annotations

import pytest

from caiplatform.errors import Unauthenticated
from caiplatform.turns.browse import check_internal, workload_internal_token


def test_each_workload_gets_its_own_internal_credential():
    mine = workload_internal_token("platform-token", "p0001-agent-mine")
    other = workload_internal_token("platform-token", "p0001-agent-other")
    assert mine != other and "platform-token" not in mine
    assert workload_internal_token("platform-token", "p0001-agent-mine") == mine  # stable across restarts
    check_internal(other, other)
    with pytest.raises(Unauthenticated):
        check_internal(mine, other)  # the other agent's harness refuses my credential
