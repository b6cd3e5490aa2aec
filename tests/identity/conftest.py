"""Fixtures of the identity tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch):
    """argon2id with minimal cost: these tests hash hundreds of passwords and check rules, not the hasher."""
    from argon2 import PasswordHasher

    from caiplatform import security

    monkeypatch.setattr(security, "_hasher", PasswordHasher(time_cost=1, memory_cost=64, parallelism=1))


@pytest.fixture
def world(platform, settings):
    from .world import build_world

    return build_world(platform, settings.automation_token)
