"""Read project secrets from inside a deployed workload.

A workload receives `CAI_API_URL`, `CAI_PROJECT_ID`, `CAI_PROJECT_KEY` (its workload key) and
`PLATFORM_REQUEST_TIMEOUT_SECONDS` (the read-token TTL it asks for; default 300, clamped to 3600). The
helper mints a project-scoped read token with `POST /v1/projects/{id}/secrets:issue-token` and reads
the value directly from the secret store the token names (`read.addr`, `read.path`); the platform
never returns the value itself.

One token is cached per invocation: open a scope per invocation with `invocation()` (the harness does),
or hold a `SecretReader` yourself. Outside a scope, `get_secret` mints a token for that one read.
Any missing variable raises `WorkloadConfigError` naming it; nothing ever silently returns empty.

    from caiplatform import workload
    with workload.invocation():
        key = workload.get_secret("openai-key")
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

ENV_API_URL = "CAI_API_URL"
ENV_PROJECT_ID = "CAI_PROJECT_ID"
ENV_PROJECT_KEY = "CAI_PROJECT_KEY"
ENV_TTL = "PLATFORM_REQUEST_TIMEOUT_SECONDS"
REQUIRED = (ENV_API_URL, ENV_PROJECT_ID, ENV_PROJECT_KEY)

DEFAULT_TTL = 300
MAX_TTL = 3600
# A cached token is replaced this long before the store would expire it.
EXPIRY_MARGIN_SECONDS = 5.0
HTTP_TIMEOUT_SECONDS = 30.0


class WorkloadError(RuntimeError):
    """A project secret could not be read from inside the workload."""


class WorkloadConfigError(WorkloadError):
    """The workload lacks a variable the helper needs."""


@dataclass(frozen=True)
class WorkloadConfig:
    api_url: str
    project_id: str
    project_key: str = field(repr=False)
    ttl_seconds: int = DEFAULT_TTL

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkloadConfig:
        env = os.environ if environ is None else environ
        missing = [name for name in REQUIRED if not env.get(name, "").strip()]
        if missing:
            raise WorkloadConfigError(
                "cannot read project secrets: missing environment variable(s) "
                + ", ".join(missing)
                + " (the platform sets them on deployed workloads)"
            )
        raw_ttl = env.get(ENV_TTL, "").strip()
        if raw_ttl:
            try:
                ttl = int(float(raw_ttl))
            except ValueError:
                raise WorkloadConfigError(f"{ENV_TTL} must be a number of seconds, got {raw_ttl!r}") from None
            if ttl <= 0:
                ttl = DEFAULT_TTL
        else:
            ttl = DEFAULT_TTL
        return cls(
            api_url=env[ENV_API_URL].strip().rstrip("/"),
            project_id=env[ENV_PROJECT_ID].strip(),
            project_key=env[ENV_PROJECT_KEY].strip(),
            ttl_seconds=min(ttl, MAX_TTL),
        )


@dataclass
class _Token:
    token: str = field(repr=False)
    addr: str
    path: str
    expires: float  # monotonic

    def secret_path(self, name: str) -> str:
        if self.path.endswith("/"):
            return self.path + name
        if self.path.rsplit("/", 1)[-1] == name:
            return self.path
        raise WorkloadError(f"the read token only covers {self.path}, not secret {name}")


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            return body["error"]
        if isinstance(body.get("errors"), list):
            return "; ".join(str(e) for e in body["errors"])[:200]
    return str(body)[:200]


def _issue_request(config: WorkloadConfig) -> dict[str, Any]:
    return {
        "url": f"{config.api_url}/v1/projects/{config.project_id}/secrets:issue-token",
        "json": {"ttl_seconds": config.ttl_seconds},
        "headers": {"Authorization": f"Bearer {config.project_key}"},
    }


def _parse_issue(resp: httpx.Response, now: float) -> _Token:
    if resp.status_code != 200:
        raise WorkloadError(f"minting a secret read token failed ({resp.status_code}): {_error_text(resp)}")
    body = resp.json()
    read = body.get("read") or {}
    if not body.get("token") or not read.get("addr") or "path" not in read:
        raise WorkloadError("minting a secret read token failed: the platform answered without a token")
    ttl = float(body.get("ttl_seconds") or DEFAULT_TTL)
    return _Token(
        token=body["token"],
        addr=str(read["addr"]).rstrip("/"),
        path=str(read["path"]).lstrip("/"),
        expires=now + max(1.0, ttl - EXPIRY_MARGIN_SECONDS),
    )


def _read_memory(token: _Token, name: str, version: int | None) -> str | None:
    """A `memory://` store lives in this process (tests): read through its own token check."""
    if not token.addr.startswith("memory://"):
        return None
    from caiplatform.errors import PlatformError
    from caiplatform.ports.secrets import in_process_store

    backend: Any = in_process_store(token.addr)
    if backend is None:
        raise WorkloadError(f"secret store {token.addr} is not reachable from this process")
    try:
        return backend.read_with_token_sync(token.token, token.secret_path(name), version).value
    except PlatformError as exc:
        raise WorkloadError(f"reading secret {name} failed ({exc.status}): {exc.message}") from None


def _store_request(token: _Token, name: str, version: int | None) -> dict[str, Any]:
    return {
        "url": f"{token.addr}/v1/{token.secret_path(name)}",
        "params": {"version": version} if version else None,
        "headers": {"X-Vault-Token": token.token},
    }


def _parse_store(resp: httpx.Response, name: str) -> str:
    if resp.status_code == 404:
        raise WorkloadError(f"secret {name} not found in this project (or that version is destroyed)")
    if resp.status_code in (401, 403):
        raise WorkloadError(f"the secret store refused the read token for {name} ({resp.status_code})")
    if resp.status_code != 200:
        raise WorkloadError(f"reading secret {name} failed ({resp.status_code}): {_error_text(resp)}")
    data = (resp.json().get("data") or {}).get("data")
    if not isinstance(data, dict) or "value" not in data:
        raise WorkloadError(f"secret {name} has no readable value")
    return str(data["value"])


class SecretReader:
    """Reads project secrets for one invocation, minting one read token and reusing it."""

    def __init__(
        self,
        config: WorkloadConfig | None = None,
        *,
        client: httpx.Client | None = None,
        monotonic: Any = time.monotonic,
    ):
        self.config = config or WorkloadConfig.from_env()
        self._client = client
        self._own_client = client is None
        self._monotonic = monotonic
        self._token: _Token | None = None
        self.tokens_minted = 0

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(timeout=HTTP_TIMEOUT_SECONDS)
        return self._client

    def _current_token(self) -> _Token:
        if self._token is None or self._monotonic() >= self._token.expires:
            resp = self._http().post(**_issue_request(self.config))
            self._token = _parse_issue(resp, self._monotonic())
            self.tokens_minted += 1
        return self._token

    def get(self, name: str, version: int | None = None) -> str:
        token = self._current_token()
        value = _read_memory(token, name, version)
        if value is not None:
            return value
        return _parse_store(self._http().get(**_store_request(token, name, version)), name)

    def close(self) -> None:
        if self._own_client and self._client is not None:
            self._client.close()
        self._client = None


class AsyncSecretReader:
    """The asynchronous twin of `SecretReader`."""

    def __init__(
        self,
        config: WorkloadConfig | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        monotonic: Any = time.monotonic,
    ):
        self.config = config or WorkloadConfig.from_env()
        self._client = client
        self._own_client = client is None
        self._monotonic = monotonic
        self._token: _Token | None = None
        self.tokens_minted = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS)
        return self._client

    async def _current_token(self) -> _Token:
        if self._token is None or self._monotonic() >= self._token.expires:
            resp = await self._http().post(**_issue_request(self.config))
            self._token = _parse_issue(resp, self._monotonic())
            self.tokens_minted += 1
        return self._token

    async def get(self, name: str, version: int | None = None) -> str:
        token = await self._current_token()
        value = _read_memory(token, name, version)
        if value is not None:
            return value
        return _parse_store(await self._http().get(**_store_request(token, name, version)), name)

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
        self._client = None


_current: contextvars.ContextVar[SecretReader | None] = contextvars.ContextVar("cai_secret_reader", default=None)
_current_async: contextvars.ContextVar[AsyncSecretReader | None] = contextvars.ContextVar(
    "cai_async_secret_reader", default=None
)


@contextlib.contextmanager
def invocation(config: WorkloadConfig | None = None, **kwargs: Any) -> Iterator[SecretReader]:
    """Scope of one invocation: `get_secret` calls inside it share one read token."""
    reader = SecretReader(config, **kwargs)
    reset = _current.set(reader)
    try:
        yield reader
    finally:
        _current.reset(reset)
        reader.close()


@contextlib.asynccontextmanager
async def ainvocation(config: WorkloadConfig | None = None, **kwargs: Any) -> AsyncIterator[AsyncSecretReader]:
    reader = AsyncSecretReader(config, **kwargs)
    reset = _current_async.set(reader)
    try:
        yield reader
    finally:
        _current_async.reset(reset)
        await reader.aclose()


def get_secret(name: str, version: int | None = None) -> str:
    """The value of project secret `name` (current version unless `version`)."""
    reader = _current.get()
    if reader is not None:
        return reader.get(name, version)
    one_shot = SecretReader()
    try:
        return one_shot.get(name, version)
    finally:
        one_shot.close()


async def aget_secret(name: str, version: int | None = None) -> str:
    reader = _current_async.get()
    if reader is not None:
        return await reader.get(name, version)
    one_shot = AsyncSecretReader()
    try:
        return await one_shot.get(name, version)
    finally:
        await one_shot.aclose()
