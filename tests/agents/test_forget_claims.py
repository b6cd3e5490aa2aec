"""Erasures on the in-memory platform without any agent process: one erasure per user and scope while it
is unfinished, and the claim that keeps it on one replica until its lease lapses (docs/erasure.md)."""

from __future__ import annotations

import pytest

ALICE, BOB = "alice-7", "bob-9"


async def test_a_pending_erasure_is_answered_again_and_run_once(platform, world):
    """Two requests for the same user and scope before it runs are one erasure; a round claims it once."""
    from caiplatform.models.erasures import ForgetRequest
    from caiplatform.principal import Principal, PrincipalKind

    service = platform.erasures
    await service.aclose()  # no background round: this test runs them
    automation = Principal(PrincipalKind.AUTOMATION)
    first = await service.forget(automation, world.project_id, ForgetRequest(user_id=ALICE))
    second = await service.forget(automation, world.project_id, ForgetRequest(user_id=ALICE))
    assert first.erasure_id == second.erasure_id and first.state == "pending"
    other = await service.forget(automation, world.project_id, ForgetRequest(user_id=BOB))
    assert other.erasure_id != first.erasure_id
    assert await service.run_pending() == 2
    assert await service.run_pending() == 0
    done = await service.get(automation, world.project_id, first.erasure_id)
    assert done.state == "done" and done.receipts == [] and done.agents == []


async def test_a_claimed_erasure_is_run_by_one_replica_and_taken_over_when_its_lease_lapses(platform, world, clock):
    """Two services on one database stand for two replicas: a live claim is left alone; a lapsed one (its
    replica died mid-way, one step recorded) is taken over and only the steps left are run."""
    from sqlalchemy import update

    from caiplatform.db.models import Erasure
    from caiplatform.domain.erasure import LEASE_SECONDS
    from caiplatform.models.erasures import ForgetRequest
    from caiplatform.principal import Principal, PrincipalKind
    from caiplatform.services.erasures import ErasureService

    one = platform.erasures
    await one.aclose()
    two = ErasureService(platform.db, platform.access, clock, agents=platform.agents, runtime=lambda: platform.runtime,
                         memory=lambda: platform.invoke.memory, replica_id="replica-two", shared=True)
    automation = Principal(PrincipalKind.AUTOMATION)
    erasure = await one.forget(automation, world.project_id, ForgetRequest(user_id=ALICE))
    assert await one._claim() == erasure.erasure_id  # replica one holds it (and then dies)
    step = {"agent": "gone", "store": "log_history", "removed": {"lines": 0},
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:00Z"}
    await platform.db.run(lambda s: s.execute(update(Erasure).where(Erasure.id == erasure.erasure_id)
                                              .values(agents=["gone"], receipts=[step])))
    assert await two.run_pending() == 0  # the lease is live: not run twice
    clock.advance(LEASE_SECONDS + 1)
    assert await two.run_pending() == 1
    done = await two.get(automation, world.project_id, erasure.erasure_id)
    assert done.state == "done" and [(r.agent, r.store) for r in done.receipts] == [
        ("gone", "log_history"), ("gone", "memory"), ("gone", "sessions")]
    assert done.receipts[0].removed == {"lines": 0}  # the recorded step was not run again
    assert await one._run(erasure.erasure_id) is False  # the dead replica's late work changes nothing


async def test_forget_everywhere_is_one_erasure_per_project_for_platform_admins(platform, world):
    from caiplatform.errors import Forbidden
    from caiplatform.models.erasures import ForgetEverywhere
    from caiplatform.principal import Principal, PrincipalKind
    from caiplatform.testing.users import project_users

    users = await project_users(platform, "everywhere-")
    automation = Principal(PrincipalKind.AUTOMATION)
    listed = await platform.erasures.forget_everywhere(automation, ForgetEverywhere(user_id=ALICE))
    assert {e.project_id for e in listed.erasures} >= {world.project_id, world.other_project_id}
    again = await platform.erasures.forget_everywhere(automation, ForgetEverywhere(user_id=ALICE))
    pending = [e for e in listed.erasures if e.state != "done"]
    assert {e.erasure_id for e in pending} <= {e.erasure_id for e in again.erasures}
    with pytest.raises(Forbidden):  # a project admin is no platform admin
        await platform.erasures.forget_everywhere(users.admin, ForgetEverywhere(user_id=ALICE))


async def test_a_failing_step_is_tried_again_and_never_reported_done(platform, world, clock):
    from sqlalchemy import update

    from caiplatform.db.models import Erasure
    from caiplatform.domain.erasure import LEASE_SECONDS
    from caiplatform.models.erasures import ForgetRequest
    from caiplatform.principal import Principal, PrincipalKind

    service = platform.erasures
    await service.aclose()
    automation = Principal(PrincipalKind.AUTOMATION)
    erasure = await service.forget(automation, world.project_id, ForgetRequest(user_id=ALICE))
    await platform.db.run(lambda s: s.execute(update(Erasure).where(Erasure.id == erasure.erasure_id)
                                              .values(agents=["gone"])))
    erase, failed = service._erase, []

    async def flaky(project_id, step, user_id):
        if not failed:
            failed.append(step.key)
            raise ConnectionError("the store does not answer")
        return await erase(project_id, step, user_id)

    service._erase = flaky
    with pytest.raises(ConnectionError):
        await service.run_pending()
    view = await service.get(automation, world.project_id, erasure.erasure_id)
    assert (view.state, view.steps_done) == ("running", 0)
    assert await service.run_pending() == 0  # its lease is still held
    clock.advance(LEASE_SECONDS + 1)
    assert await service.run_pending() == 1
    view = await service.get(automation, world.project_id, erasure.erasure_id)
    assert (view.state, view.steps_done, failed) == ("done", 3, ["gone/log_history"])
