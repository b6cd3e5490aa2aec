"""Fixtures for the memory store tests: the default project and three users with different standing."""

from __future__ import annotations

import secrets
from functools import cache

import pytest

from caiplatform import security
from caiplatform.testing.users import Users
from caiplatform.testing.users import project_users as shared_project_users

PASSWORD = "memorystore test password"


@cache
def password_hash() -> str:
    return security.hash_password(PASSWORD)  # argon2 is slow on purpose: hash once per run


async def project_users(platform) -> Users:
    """A member and an admin of the default project, and a signed-up user with no grant on it, all with
    `PASSWORD`."""
    return await shared_project_users(platform, f"{secrets.token_hex(3)}-", password_hash=password_hash())


@pytest.fixture
async def users(platform) -> Users:
    return await project_users(platform)


@pytest.fixture
def users_of():
    """`await users_of(platform)` for tests that build their own platform."""
    return project_users
