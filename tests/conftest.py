"""Shared fixtures: real engines (fail loudly when one is missing) and a fresh platform per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from caiplatform.testing import engines


def _require(engine: str, url: str, port: int) -> str:
    try:
        engines.require_tcp(engine, url, port)
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session."""
    _require("postgres", engines.POSTGRES_URL, 5432)
    with engines.fresh_postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _require("redis", engines.REDIS_URL, 6379)


@pytest.fixture(scope="session")
def nats_url() -> str:
    return _require("nats", engines.NATS_URL, 4222)


@pytest.fixture(scope="session")
def openbao() -> Iterator[engines.OpenBaoDev]:
    try:
        server = engines.start_openbao_dev()
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock():
    from caiplatform.clock import ManualClock

    return ManualClock()


@pytest.fixture
def settings():
    from caiplatform.settings import Settings
    from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

    return Settings(
        CAI_ADMIN_EMAIL=ADMIN_EMAIL,
        CAI_ADMIN_PASSWORD=ADMIN_PASSWORD,
        CAI_AUTOMATION_TOKEN="automation-token-for-tests",
        CAI_INTERNAL_TOKEN="internal-token-for-tests",
        RATELIMIT_RPS=10_000,
        RATELIMIT_BURST=10_000,
    )


@pytest.fixture
async def platform(settings, clock):
    """An in-memory platform with the bootstrap admin, on a manual clock."""
    from caiplatform.platform import Platform

    p = Platform.in_memory(settings, clock=clock)
    await p.start()
    yield p
    await p.aclose()


@pytest.fixture
async def client(platform):
    from caiplatform.testing.http import asgi_client

    async with asgi_client(platform) as c:
        yield c


@pytest.fixture
async def admin_headers(client):
    from caiplatform.testing.http import login

    return await login(client)
