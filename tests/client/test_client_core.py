"""The client's machinery (issue 20): in process and over a mock transport, sync and async twins."""

from __future__ import annotations

import httpx
import pytest

from caiplatform import BadRequest, Conflict, NotFound, RateLimited, Unavailable
from caiplatform.client import APITimeoutError, AsyncClient, Client, generate
from caiplatform.models.vector import Index, IndexCreate

AUTOMATION = "automation-token-for-tests"


async def _default_project(platform) -> str:
    from sqlalchemy import select

    from caiplatform.db.models import Project

    return await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))


def test_the_sync_client_is_generated_from_the_async_one():
    assert generate.main(["--check"]) == 0, "run `python -m caiplatform.client.generate`"


async def test_the_async_client_in_process_returns_the_services_models(platform):
    project_id = await _default_project(platform)
    async with AsyncClient.in_process(platform, token=AUTOMATION) as client:
        created = await client.indexes.create(project_id, name="docs", dimensions=3)
        assert isinstance(created, Index) and created.state == "pending" and created.dimensions == 3
        same = await client.indexes.create(project_id, IndexCreate(name="other", distance="l2"))
        assert same.distance == "euclid"
        with pytest.raises(Conflict, match="^an index with that name already exists$") as caught:
            await client.indexes.create(project_id, name="docs")
        assert caught.value.request_id and caught.value.status_code == 409
        with pytest.raises(NotFound):
            await client.indexes.get(project_id, "absent")
        assert [i.name async for i in client.indexes.list(project_id, page_size=1)] == ["docs", "other"]
        await client.indexes.delete(project_id, "other")
        assert [i.name async for i in client.indexes.list(project_id)] == ["docs"]


async def test_a_bad_body_is_refused_before_it_is_sent_with_the_spec_message(platform):
    async with AsyncClient.in_process(platform, token=AUTOMATION) as client:
        with pytest.raises(BadRequest, match='^unknown field "dimension"$'):
            await client.indexes.create("p", name="docs", dimension=3)


def test_the_sync_client_in_process_runs_the_platform_on_its_own_loop(settings):
    from caiplatform.platform import Platform

    platform = Platform.in_memory(settings)
    with Client.in_process(platform, token=AUTOMATION) as client:
        portal = client._http._transport._portal  # type: ignore[attr-defined]  # the platform's own loop
        project_id = portal.call(_default_project, platform)
        index = client.indexes.create(project_id, name="docs", dimensions=2)
        assert index.name == "docs" and client.indexes.get(project_id, "docs").dimensions == 2
        assert [i.name for i in client.indexes.list(project_id)] == ["docs"]


def _mock(statuses: list[int], headers: dict[str, str] | None = None) -> tuple[httpx.MockTransport, list[int]]:
    seen: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(len(seen))
        status = statuses[min(len(seen) - 1, len(statuses) - 1)]
        if status >= 400:
            return httpx.Response(status, headers=headers, json={"error": f"status {status}", "request_id": "req_1"})
        return httpx.Response(200, json={"service_url": "u", "token": "", "collection_prefix": "p_",
                                          "collections": [], "truncated": False, "note": "n"})

    return httpx.MockTransport(answer), seen


def test_429_and_503_are_retried_honoring_retry_after_then_succeed(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    transport, seen = _mock([429, 503, 200], {"Retry-After": "2"})
    with Client("http://x", token="t", transport=transport) as client:
        assert client.indexes.credentials("p").service_url == "u"
    assert len(seen) == 3 and slept == [2.0, 2.0]


def test_the_retry_budget_bounds_the_waiting(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    transport, seen = _mock([503], {"Retry-After": "20"})
    with Client("http://x", token="t", transport=transport, retry_budget=30) as client:
        with pytest.raises(Unavailable) as caught:
            client.indexes.credentials("p")
    assert len(seen) == 2 and caught.value.request_id == "req_1"  # 20 s waited; 20 more would pass 30


def test_a_429_past_the_retries_is_rate_limited_with_its_retry_after(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    transport, seen = _mock([429], {"Retry-After": "1"})
    with Client("http://x", token="t", transport=transport, max_retries=2) as client:
        with pytest.raises(RateLimited) as caught:
            client.indexes.credentials("p")
    assert len(seen) == 3 and caught.value.retry_after == 1.0


def test_other_errors_are_not_retried():
    transport, seen = _mock([400])
    with Client("http://x", token="t", transport=transport) as client:
        with pytest.raises(BadRequest, match="^status 400$"):
            client.indexes.credentials("p")
    assert len(seen) == 1


def test_a_timeout_is_its_own_error():
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with Client("http://x", token="t", transport=httpx.MockTransport(slow), timeout=0.1) as client:
        with pytest.raises(APITimeoutError):
            client.indexes.credentials("p")


def test_credentials_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CAI_BASE_URL", "http://from-env:9")
    monkeypatch.setenv("CAI_API_KEY", "cai_key")
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    with Client(transport=httpx.MockTransport(answer)) as client:
        client.indexes.delete("p", "i")
    assert str(seen[0].url) == "http://from-env:9/v1/projects/p/indexes/i"
    assert seen[0].headers["authorization"] == "Bearer cai_key"


def test_every_operation_of_the_document_is_reachable_through_both_clients():
    from caiplatform.client.operations import OPERATIONS

    document = generate.served_document()
    served = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert served == set(OPERATIONS), {"unnamed": served - set(OPERATIONS), "gone": set(OPERATIONS) - served}
    for names in OPERATIONS.values():
        for name in names:
            for client_class in (Client, AsyncClient):
                resource = client_class.__annotations__.get(name.resource) or next(
                    (c.__annotations__[name.resource] for c in client_class.__mro__
                     if name.resource in getattr(c, "__annotations__", {})), None)
                assert resource is not None, (client_class.__name__, name)
    sync_client = Client("http://x", token="t")
    async_client = AsyncClient("http://x", token="t")
    for names in OPERATIONS.values():
        for name in names:
            assert callable(getattr(getattr(sync_client, name.resource), name.method)), name
            assert callable(getattr(getattr(async_client, name.resource), name.method)), name
    sync_client.close()
