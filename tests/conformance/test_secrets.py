"""The secret-backend conformance suite against the in-memory adapter and a real OpenBao server."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import anyio
import hvac
import pytest

from caiplatform.adapters.memory.secrets import InMemorySecretBackend
from caiplatform.adapters.openbao.secrets import OpenBaoSecretBackend
from caiplatform.clock import ManualClock
from caiplatform.ports.secrets import SecretBackend, StoreHealth
from caiplatform.testing import engines
from caiplatform.testing.conformance.secrets import *  # noqa: F403

BACKENDS = ["memory", "openbao"]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    request.applymarker(pytest.mark.backend(request.param))
    return request.param


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=datetime.now(UTC))


def _openbao_backend(addr: str, token: str) -> OpenBaoSecretBackend:
    # A private prefix per test keeps concurrent test runs on the shared dev server apart.
    return OpenBaoSecretBackend(addr, token, prefix=f"caiplatform-test-{secrets.token_hex(6)}/projects")


@pytest.fixture
def secret_backend(backend_name: str, clock: ManualClock, request: pytest.FixtureRequest) -> SecretBackend:
    if backend_name == "memory":
        return InMemorySecretBackend(clock=clock)
    server: engines.OpenBaoDev = request.getfixturevalue("openbao")
    return _openbao_backend(server.addr, server.root_token)


@pytest.fixture
def advance_time(backend_name: str, clock: ManualClock):
    async def advance(seconds: float) -> None:
        if backend_name == "memory":
            clock.advance(seconds)
        else:
            await anyio.sleep(seconds)

    return advance


class _MemoryControl:
    def __init__(self) -> None:
        self.backend = InMemorySecretBackend()

    def seal(self) -> None:
        self.backend.set_health(StoreHealth.SEALED)

    def stop(self) -> None:
        self.backend.set_health(StoreHealth.UNREACHABLE)


class _OpenBaoControl:
    """Its own `bao server -dev` (`own_openbao`), so that sealing and stopping it disturbs no other test."""

    def __init__(self, server: engines.OpenBaoDev) -> None:
        self.server = server
        self.backend = _openbao_backend(self.server.addr, self.server.root_token)

    def seal(self) -> None:
        hvac.Client(url=self.server.addr, token=self.server.root_token, timeout=5).sys.seal()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def secret_backend_control(backend_name: str, request: pytest.FixtureRequest) -> _MemoryControl | _OpenBaoControl:
    if backend_name == "memory":
        return _MemoryControl()
    return _OpenBaoControl(request.getfixturevalue("own_openbao"))
