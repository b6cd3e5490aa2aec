"""Conformance suite for the secret-backend port (`caiplatform.ports.secrets.SecretBackend`).

Use from a test module that provides these fixtures:

- `secret_backend`: a working backend (fresh or shared; every test uses its own random project id);
- `secret_backend_control`: a `BackendControl` whose backend can be sealed and stopped by the test;
- `advance_time`: a callable `(seconds) -> awaitable` that lets that much time pass for the backend
  (a ManualClock moves, a real server is waited for).

Then `from caiplatform.testing.conformance.secrets import *` collects the tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

import pytest

from caiplatform.ports.secrets import (
    MAX_TOKEN_TTL_SECONDS,
    SecretBackend,
    SecretMissing,
    StoreHealth,
    StoreUnavailable,
    StoreUnconfigured,
    TokenRejected,
    UnconfiguredSecretBackend,
    VersionDestroyed,
    VersionMissing,
)

pytestmark = pytest.mark.anyio

AdvanceTime = Callable[[float], Awaitable[None]]


class BackendControl(Protocol):
    backend: SecretBackend

    def seal(self) -> None: ...

    def stop(self) -> None: ...


def new_project() -> str:
    return str(uuid.uuid4())


async def test_write_adds_versions(secret_backend: SecretBackend) -> None:
    p = new_project()
    assert await secret_backend.write(p, "api-key", "one") == 1
    assert await secret_backend.write(p, "api-key", "two") == 2
    assert (await secret_backend.read(p, "api-key")).value == "two"
    first = await secret_backend.read(p, "api-key", 1)
    assert (first.version, first.value) == (1, "one")
    assert (await secret_backend.read(p, "api-key", 0)).version == 2


async def test_metadata_lists_versions(secret_backend: SecretBackend) -> None:
    p = new_project()
    assert await secret_backend.metadata(p, "db") is None
    await secret_backend.write(p, "db", "a")
    await secret_backend.write(p, "db", "b")
    meta = await secret_backend.metadata(p, "db")
    assert meta is not None
    assert meta.name == "db" and meta.current_version == 2
    assert [(v.version, v.destroyed) for v in meta.versions] == [(1, False), (2, False)]
    assert meta.created_at <= meta.updated_at
    assert meta.created_at.tzinfo is not None
    assert all(v.created_at is not None for v in meta.versions)


async def test_more_than_ten_versions_are_kept(secret_backend: SecretBackend) -> None:
    p = new_project()
    for i in range(12):
        await secret_backend.write(p, "many", f"v{i + 1}")
    assert (await secret_backend.read(p, "many", 1)).value == "v1"
    meta = await secret_backend.metadata(p, "many")
    assert meta is not None and len(meta.versions) == 12 and not any(v.destroyed for v in meta.versions)


async def test_read_errors(secret_backend: SecretBackend) -> None:
    p = new_project()
    with pytest.raises(SecretMissing):
        await secret_backend.read(p, "nope")
    await secret_backend.write(p, "x", "1")
    with pytest.raises(VersionMissing) as info:
        await secret_backend.read(p, "x", 5)
    assert str(info.value) == "x has no version 5 (current is 1)"


async def test_destroy_versions(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "k", "old")
    await secret_backend.write(p, "k", "new")
    await secret_backend.destroy_versions(p, "k", [1])
    with pytest.raises(VersionDestroyed):
        await secret_backend.read(p, "k", 1)
    assert (await secret_backend.read(p, "k")).value == "new"
    meta = await secret_backend.metadata(p, "k")
    assert meta is not None and [v.destroyed for v in meta.versions] == [True, False]


async def test_destroy_all(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "gone", "v")
    await secret_backend.write(p, "gone", "w")
    assert await secret_backend.destroy(p, "gone") is True
    assert await secret_backend.metadata(p, "gone") is None
    with pytest.raises(SecretMissing):
        await secret_backend.read(p, "gone", 1)
    assert await secret_backend.destroy(p, "gone") is False
    # a name can be used again and starts over at version 1
    assert await secret_backend.write(p, "gone", "again") == 1


async def test_list_is_per_project_and_sorted(secret_backend: SecretBackend) -> None:
    p, q = new_project(), new_project()
    assert await secret_backend.list(p) == []
    for name in ("b", "A", "c_1"):
        await secret_backend.write(p, name, "v")
    await secret_backend.write(p, "b", "v2")
    await secret_backend.write(q, "other", "v")
    listed = await secret_backend.list(p)
    assert [m.name for m in listed] == sorted(["b", "A", "c_1"])
    assert {m.name: m.current_version for m in listed} == {"A": 1, "b": 2, "c_1": 1}
    assert [m.name for m in await secret_backend.list(q)] == ["other"]


async def test_case_sensitive_names(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "Token", "upper")
    await secret_backend.write(p, "token", "lower")
    assert (await secret_backend.read(p, "Token")).value == "upper"
    assert (await secret_backend.read(p, "token")).value == "lower"


async def test_values_round_trip(secret_backend: SecretBackend) -> None:
    p = new_project()
    values = ["ünïcødé ✓ \n\t\"quotes\" {json}", "x" * 65536, " leading and trailing "]
    for i, value in enumerate(values):
        await secret_backend.write(p, f"v{i}", value)
        assert (await secret_backend.read(p, f"v{i}")).value == value


async def test_path_prefix_is_per_project(secret_backend: SecretBackend) -> None:
    p, q = new_project(), new_project()
    assert secret_backend.path_prefix(p).endswith("/")
    assert p in secret_backend.path_prefix(p)
    assert secret_backend.path_prefix(p) != secret_backend.path_prefix(q)


async def test_token_for_one_secret_reads_only_that_secret(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "mine", "my-value")
    await secret_backend.write(p, "other", "other-value")
    token = await secret_backend.mint_read_token(p, "mine", 300)
    assert token.ttl_seconds == 300
    assert token.path == secret_backend.path_prefix(p) + "mine"
    got = await secret_backend.read_with_token(token.token, token.path)
    assert (got.value, got.version) == ("my-value", 1)
    with pytest.raises(TokenRejected):
        await secret_backend.read_with_token(token.token, secret_backend.path_prefix(p) + "other")
    with pytest.raises(TokenRejected):
        await secret_backend.read_with_token(token.token, secret_backend.path_prefix(p) + "mine-2")


async def test_project_token_reads_the_project_only(secret_backend: SecretBackend) -> None:
    p, q = new_project(), new_project()
    await secret_backend.write(p, "a", "A")
    await secret_backend.write(p, "b", "B1")
    await secret_backend.write(p, "b", "B2")
    await secret_backend.write(q, "a", "foreign")
    token = await secret_backend.mint_read_token(p, None, 120)
    assert token.path == secret_backend.path_prefix(p)
    assert (await secret_backend.read_with_token(token.token, token.path + "a")).value == "A"
    assert (await secret_backend.read_with_token(token.token, token.path + "b")).value == "B2"
    assert (await secret_backend.read_with_token(token.token, token.path + "b", 1)).value == "B1"
    with pytest.raises(TokenRejected):
        await secret_backend.read_with_token(token.token, secret_backend.path_prefix(q) + "a")


async def test_token_ttl_is_clamped(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "s", "v")
    token = await secret_backend.mint_read_token(p, "s", 7200)
    assert 0 < token.ttl_seconds <= MAX_TOKEN_TTL_SECONDS


async def test_unknown_token_is_rejected(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "s", "v")
    with pytest.raises(TokenRejected):
        await secret_backend.read_with_token("not-a-token", secret_backend.path_prefix(p) + "s")


async def test_token_expires(secret_backend: SecretBackend, advance_time: AdvanceTime) -> None:
    p = new_project()
    await secret_backend.write(p, "s", "v")
    token = await secret_backend.mint_read_token(p, "s", 1)
    assert token.ttl_seconds == 1
    await advance_time(2.5)
    with pytest.raises(TokenRejected):
        await secret_backend.read_with_token(token.token, token.path)


async def test_token_sees_later_versions_and_not_destroyed_ones(secret_backend: SecretBackend) -> None:
    p = new_project()
    await secret_backend.write(p, "s", "one")
    token = await secret_backend.mint_read_token(p, "s", 60)
    await secret_backend.write(p, "s", "two")
    assert (await secret_backend.read_with_token(token.token, token.path)).value == "two"
    await secret_backend.destroy_versions(p, "s", [1])
    with pytest.raises((VersionDestroyed, SecretMissing)):
        await secret_backend.read_with_token(token.token, token.path, 1)


async def test_health_ok(secret_backend: SecretBackend) -> None:
    assert await secret_backend.health() is StoreHealth.OK


async def test_sealed_store_reports_sealed(secret_backend_control: BackendControl) -> None:
    backend = secret_backend_control.backend
    p = new_project()
    await backend.write(p, "s", "v")
    secret_backend_control.seal()
    assert await backend.health() is StoreHealth.SEALED
    with pytest.raises(StoreUnavailable) as info:
        await backend.list(p)
    assert info.value.status == 503
    with pytest.raises(StoreUnavailable):
        await backend.read(p, "s")
    with pytest.raises(StoreUnavailable):
        await backend.write(p, "s", "w")


async def test_stopped_store_reports_unreachable(secret_backend_control: BackendControl) -> None:
    backend = secret_backend_control.backend
    p = new_project()
    await backend.write(p, "s", "v")
    secret_backend_control.stop()
    assert await backend.health() is StoreHealth.UNREACHABLE
    with pytest.raises(StoreUnavailable) as info:
        await backend.list(p)
    assert info.value.status == 503


async def test_unconfigured_backend() -> None:
    backend = UnconfiguredSecretBackend()
    assert await backend.health() is StoreHealth.UNCONFIGURED
    with pytest.raises(StoreUnconfigured) as info:
        await backend.list(new_project())
    assert info.value.status == 503
    assert str(info.value) != str(StoreUnavailable())
