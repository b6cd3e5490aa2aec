"""Fixtures for the vector index tests: the default project, a member, an admin and a stranger."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import pytest

from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer, project_users


@dataclass
class Project3:
    """The default project and bearer headers for a member, a project admin and a user with no grant."""

    id: str
    short: str
    member: dict[str, str]
    admin: dict[str, str]
    stranger: dict[str, str]


async def project_with_users(platform) -> Project3:
    users = await project_users(platform, prefix=f"{secrets.token_hex(3)}-")
    return Project3(users.project_id, users.project_short, *(bearer(platform, p) for p in (users.member, users.admin, users.stranger)))


@pytest.fixture
async def project(platform) -> Project3:
    return await project_with_users(platform)


@pytest.fixture
async def http(platform):
    async with asgi_client(platform, ["vectordb"]) as c:
        yield c


@pytest.fixture
def project_of():
    """`await project_of(platform)` for tests that build their own platform."""
    return project_with_users
