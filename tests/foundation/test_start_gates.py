"""A server that answers while its platform starts (`create_app(answer_while_starting=True)`, as `caiplatform
serve` runs it): each request waits for the engines its route needs, bounded, then 503; nothing answers from
an engine that is not up yet (docs/performance.md, "Restart")."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from caiplatform.platform import Platform, StartGates
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform_server import app as app_module
from caiplatform_server.app import ALL_APIS, START_FAILED_MESSAGE, STARTING_MESSAGE, create_app, gates_of


def test_each_route_waits_for_what_it_needs():
    assert gates_of("/v1/agents/a0/invoke") == ("workloads",)
    assert gates_of("/v1/agents/a0/invoke/stream") == ("workloads",)
    assert gates_of("/v1/secret-store/v1/secret/data/x") == ("engines",)
    for path in ("/v1/agents/a0", "/v1/auth/login", "/v1/projects/p/topics/t:publish", "/v1/agents/a0/invoke/x"):
        assert gates_of(path) == ("started",), path
    for path in ("/healthz", "/livez", "/metrics", "/openapi.json", "/docs", "/docs/assets/app.js"):
        assert gates_of(path) == (), path


async def test_gates_open_fail_and_time_out():
    gates = StartGates()
    assert not gates.is_open("workloads")
    waiting = asyncio.ensure_future(gates.wait(("workloads", "vector"), 5))
    gates.open("workloads")
    await asyncio.sleep(0)
    assert not waiting.done()  # the vector engine is not up yet
    gates.open("vector")
    await waiting
    with pytest.raises(TimeoutError):
        await gates.wait(("started",), 0.01)
    failing = asyncio.ensure_future(gates.wait(("started",), 5))
    await asyncio.sleep(0)
    gates.fail(RuntimeError("no engine"))
    with pytest.raises(RuntimeError, match="no engine"):
        await failing
    with pytest.raises(RuntimeError):  # a request that comes after the failure is refused at once
        await gates.wait(("started",), 5)
    assert gates.is_open("workloads")  # what did open stays open


@pytest.fixture
async def starting(settings, clock):
    """An in-memory platform behind the early-answering app, its start left to the test (the gates shut)."""
    platform = Platform.in_memory(settings, clock=clock)
    app = create_app(platform, apis=ALL_APIS, answer_while_starting=True)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield platform, client
    await platform.aclose()


async def test_a_request_waits_for_the_start_then_answers_as_always(starting):
    platform, client = starting
    login = asyncio.ensure_future(client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}))
    health = await client.get("/healthz")  # at once, while the sign-in waits
    assert health.status_code == 503 and health.json()["status"] == "starting"
    await asyncio.sleep(0.05)
    assert not login.done()
    await platform.start()
    answer = await login
    assert answer.status_code == 200, answer.text
    assert (await client.get("/healthz")).json()["status"] == "ok"


async def test_a_request_that_waits_too_long_is_refused_retryable(starting, monkeypatch):
    _, client = starting
    monkeypatch.setattr(app_module, "START_WAIT_SECONDS", 0.05)
    answer = await client.get("/v1/auth/me")
    assert answer.status_code == 503
    assert answer.json()["error"] == STARTING_MESSAGE
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


async def test_a_failed_start_refuses_what_waits(starting):
    platform, client = starting
    waiting = asyncio.ensure_future(client.get("/v1/auth/me"))
    await asyncio.sleep(0.05)
    platform.gates.fail(RuntimeError("OpenBao did not start"))
    answer = await waiting
    assert answer.status_code == 503 and answer.json()["error"] == START_FAILED_MESSAGE


async def test_long_term_memory_waits_for_the_vector_engine_while_the_platform_starts(settings, clock):
    platform = Platform.in_memory(settings, clock=clock)
    await platform._vector_open()  # not starting: nothing to wait for
    platform._started = True  # as while `start()` runs, before the vector engine is open
    waiting = asyncio.ensure_future(platform._vector_open())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    platform.gates.open("vector")
    await waiting
    platform._started = False
    await platform.aclose()
