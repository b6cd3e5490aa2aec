"""The workload helper against a fake issue-token route and real stores (in-memory and OpenBao)."""

from __future__ import annotations

import json
import secrets
import uuid

import anyio
import httpx
import pytest

from caiplatform import workload
from caiplatform.adapters.memory.secrets import InMemorySecretBackend
from caiplatform.adapters.openbao.secrets import OpenBaoSecretBackend
from caiplatform.ports.secrets import SecretBackend, clamp_ttl
from caiplatform.testing import engines

KEY = "cai_wl_testkey"


def _config(project_id: str, ttl: int = 300) -> workload.WorkloadConfig:
    return workload.WorkloadConfig(
        api_url="http://platform.test", project_id=project_id, project_key=KEY, ttl_seconds=ttl
    )


class FakeApi:
    """Answers `POST /v1/projects/{id}/secrets:issue-token` by minting from `backend`."""

    def __init__(self, backend: SecretBackend, project_id: str):
        self.backend, self.project_id = backend, project_id
        self.issued: list[dict] = []
        self.passthrough = httpx.HTTPTransport()

    def _issue(self, request: httpx.Request):
        assert request.url.path == f"/v1/projects/{self.project_id}/secrets:issue-token"
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return httpx.Response(401, json={"error": "unauthenticated", "request_id": "r"})
        body = json.loads(request.content or b"{}")
        self.issued.append(body)
        return clamp_ttl(body.get("ttl_seconds"))

    def _answer(self, token) -> httpx.Response:
        return httpx.Response(
            200,
            json={"token": token.token, "ttl_seconds": token.ttl_seconds,
                  "read": {"addr": token.addr, "path": token.path}, "note": "n"},
        )

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "platform.test":
            return self.passthrough.handle_request(request)  # the real store
        ttl = self._issue(request)
        if isinstance(ttl, httpx.Response):
            return ttl
        token = anyio.run(self.backend.mint_read_token, self.project_id, None, ttl)
        return self._answer(token)

    async def ahandler(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "platform.test":
            async with httpx.AsyncClient() as c:
                resp = await c.send(request)
                await resp.aread()
                return httpx.Response(resp.status_code, content=resp.content, headers=resp.headers)
        ttl = self._issue(request)
        if isinstance(ttl, httpx.Response):
            return ttl
        return self._answer(await self.backend.mint_read_token(self.project_id, None, ttl))


def test_missing_variables_raise_naming_them() -> None:
    with pytest.raises(workload.WorkloadConfigError) as info:
        workload.WorkloadConfig.from_env({"CAI_API_URL": "http://x", "CAI_PROJECT_KEY": " "})
    assert "CAI_PROJECT_ID" in str(info.value) and "CAI_PROJECT_KEY" in str(info.value)
    assert "CAI_API_URL" not in str(info.value)
    with pytest.raises(workload.WorkloadConfigError):
        workload.WorkloadConfig.from_env({})


def test_get_secret_without_environment_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in workload.REQUIRED:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(workload.WorkloadConfigError):
        workload.get_secret("anything")


def test_ttl_variable() -> None:
    base = {"CAI_API_URL": "http://x/", "CAI_PROJECT_ID": "p", "CAI_PROJECT_KEY": "k"}
    assert workload.WorkloadConfig.from_env(base).ttl_seconds == 300
    assert workload.WorkloadConfig.from_env({**base, "PLATFORM_REQUEST_TIMEOUT_SECONDS": "90"}).ttl_seconds == 90
    assert workload.WorkloadConfig.from_env({**base, "PLATFORM_REQUEST_TIMEOUT_SECONDS": "99999"}).ttl_seconds == 3600
    assert workload.WorkloadConfig.from_env(base).api_url == "http://x"
    with pytest.raises(workload.WorkloadConfigError):
        workload.WorkloadConfig.from_env({**base, "PLATFORM_REQUEST_TIMEOUT_SECONDS": "soon"})


def test_reads_through_the_memory_store_with_one_token_per_invocation() -> None:
    backend = InMemorySecretBackend()
    p = str(uuid.uuid4())
    anyio.run(backend.write, p, "alpha", "A")
    anyio.run(backend.write, p, "beta", "B1")
    anyio.run(backend.write, p, "beta", "B2")
    api = FakeApi(backend, p)
    client = httpx.Client(transport=httpx.MockTransport(api.handler))
    with workload.invocation(_config(p, ttl=120), client=client) as reader:
        assert workload.get_secret("alpha") == "A"
        assert workload.get_secret("beta") == "B2"
        assert workload.get_secret("beta", 1) == "B1"
        assert reader.tokens_minted == 1
    assert api.issued == [{"ttl_seconds": 120}]
    with workload.invocation(_config(p), client=client):
        assert workload.get_secret("alpha") == "A"
    assert len(api.issued) == 2  # a new invocation mints its own token


def test_expired_token_is_replaced() -> None:
    backend = InMemorySecretBackend()
    p = str(uuid.uuid4())
    anyio.run(backend.write, p, "s", "v")
    api = FakeApi(backend, p)
    now = [0.0]
    reader = workload.SecretReader(
        _config(p, ttl=60), client=httpx.Client(transport=httpx.MockTransport(api.handler)), monotonic=lambda: now[0]
    )
    assert reader.get("s") == "v"
    now[0] += 30
    assert reader.get("s") == "v" and reader.tokens_minted == 1
    now[0] += 60
    assert reader.get("s") == "v" and reader.tokens_minted == 2


def test_errors_are_clear_and_never_empty() -> None:
    backend = InMemorySecretBackend()
    p = str(uuid.uuid4())
    api = FakeApi(backend, p)
    client = httpx.Client(transport=httpx.MockTransport(api.handler))
    reader = workload.SecretReader(_config(p), client=client)
    with pytest.raises(workload.WorkloadError, match="missing"):
        reader.get("missing")
    bad = workload.SecretReader(
        workload.WorkloadConfig(api_url="http://platform.test", project_id=p, project_key="wrong"), client=client
    )
    with pytest.raises(workload.WorkloadError, match="401"):
        bad.get("anything")


def test_reads_directly_from_openbao(openbao: engines.OpenBaoDev) -> None:
    backend = OpenBaoSecretBackend(openbao.addr, openbao.root_token, prefix=f"wl-{secrets.token_hex(5)}/projects")
    p = str(uuid.uuid4())
    anyio.run(backend.write, p, "db-password", "hunter2-but-longer")
    anyio.run(backend.write, p, "db-password", "rotated")
    api = FakeApi(backend, p)
    client = httpx.Client(transport=httpx.MockTransport(api.handler))
    with workload.invocation(_config(p), client=client) as reader:
        assert workload.get_secret("db-password") == "rotated"
        assert workload.get_secret("db-password", 1) == "hunter2-but-longer"
        with pytest.raises(workload.WorkloadError, match="not found"):
            workload.get_secret("absent")
        assert reader.tokens_minted == 1


@pytest.mark.anyio
async def test_async_reader(openbao: engines.OpenBaoDev) -> None:
    backend = OpenBaoSecretBackend(openbao.addr, openbao.root_token, prefix=f"wl-{secrets.token_hex(5)}/projects")
    p = str(uuid.uuid4())
    await backend.write(p, "k", "async-value")
    api = FakeApi(backend, p)
    client = httpx.AsyncClient(transport=httpx.MockTransport(api.ahandler))
    async with workload.ainvocation(_config(p), client=client) as reader:
        assert await workload.aget_secret("k") == "async-value"
        assert await workload.aget_secret("k") == "async-value"
        assert reader.tokens_minted == 1
