"""Conformance suite of the project provisioning port (`caiplatform.ports.projects`).

Tests take a `provisioner_factory` fixture: a zero-argument callable returning a provisioner on the same
storage every time (a second call is "the platform restarted"; an in-memory adapter returns itself).
"""

from __future__ import annotations

import uuid

from caiplatform.ports.projects import PROVISION_STEPS, ProjectProvisioner, ProjectSpec


def _spec() -> ProjectSpec:
    short = uuid.uuid4().hex[:6]
    return ProjectSpec(str(uuid.uuid4()), f"p-{short}", short, str(uuid.uuid4()), {"pods": "50"})


async def test_provision_runs_every_step_in_order(provisioner_factory):
    provisioner: ProjectProvisioner = provisioner_factory()
    spec = _spec()
    report = await provisioner.provision(spec)
    assert report.done == list(PROVISION_STEPS) and report.failed == {} and report.warning is None
    assert await provisioner.provisioned(spec) == list(PROVISION_STEPS)


async def test_steps_are_idempotent(provisioner_factory):
    provisioner: ProjectProvisioner = provisioner_factory()
    spec = _spec()
    await provisioner.provision(spec)
    await provisioner.cache_access_user(spec)
    report = await provisioner.provision(spec)
    assert report.failed == {} and await provisioner.provisioned(spec) == list(PROVISION_STEPS)


async def test_projects_are_independent(provisioner_factory):
    provisioner: ProjectProvisioner = provisioner_factory()
    first, second = _spec(), _spec()
    await provisioner.namespace(first)
    assert await provisioner.provisioned(first) == ["namespace"]
    assert await provisioner.provisioned(second) == []


async def test_deprovision_forgets_and_is_idempotent(provisioner_factory):
    provisioner: ProjectProvisioner = provisioner_factory()
    spec = _spec()
    await provisioner.provision(spec)
    await provisioner.deprovision(spec)
    await provisioner.deprovision(spec)
    assert await provisioner.provisioned(spec) == []


async def test_a_failing_step_is_reported_and_the_rest_still_run(provisioner_factory):
    provisioner: ProjectProvisioner = provisioner_factory()
    spec = _spec()
    original = provisioner.network_policy

    async def broken(_spec: ProjectSpec) -> None:
        raise RuntimeError("policy engine unreachable")

    provisioner.network_policy = broken  # type: ignore[method-assign]
    try:
        report = await provisioner.provision(spec)
    finally:
        provisioner.network_policy = original  # type: ignore[method-assign]
    assert report.failed == {"network_policy": "policy engine unreachable"}
    assert report.done == [s for s in PROVISION_STEPS if s != "network_policy"]
    assert "network_policy: policy engine unreachable" in (report.warning or "")


async def test_records_survive_a_restart(provisioner_factory):
    spec = _spec()
    await provisioner_factory().provision(spec)
    assert await provisioner_factory().provisioned(spec) == list(PROVISION_STEPS)
