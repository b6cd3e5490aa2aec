"""Fixtures for the serverless tests: an in-memory platform whose runtime runs a recording echo app
for any image, and a member, an admin and a stranger of the default project."""

from __future__ import annotations

import pytest

from caiplatform.testing.serverless import Received, echo_app_factory, test_images
from caiplatform.testing.users import Users, project_users


@pytest.fixture
def received() -> Received:
    return Received()


@pytest.fixture
async def platform(settings, clock, received):
    """The in-memory platform, its runtime running the echo app for every image."""
    from caiplatform.platform import Platform

    p = Platform.in_memory(settings, clock=clock)
    p.runtime.app_factory = echo_app_factory(received)
    p.serverless.resolve_image = test_images(p.builder)
    await p.start()
    await p.serverless.triggers.close()  # tests drive the scheduler through `run_due`, not a timer
    yield p
    await p.aclose()


@pytest.fixture
async def users(platform) -> Users:
    return await project_users(platform)
