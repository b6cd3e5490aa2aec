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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
