"""In-process secret backend: versioned values in a dict, read tokens it honours itself.

Its address is `memory://<id>`; `caiplatform.workload` resolves that address to the live backend in the
same process (`ports.secrets.in_process_store`), so the workload helper works in unit tests exactly as against OpenBao.
For tests it can pretend to be sealed, unreachable or unconfigured (`set_health`).
"""

from __future__ import annotations

import builtins
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime

from caiplatform.clock import Clock
from caiplatform.ports.secrets import (
    MAX_TOKEN_TTL_SECONDS,
    ReadToken,
    SecretBackend,
    SecretMetadata,
    SecretMissing,
    SecretValue,
    SecretVersion,
    StoreHealth,
    StoreUnavailable,
    StoreUnconfigured,
    TokenRejected,
    VersionDestroyed,
    VersionMissing,
    in_process_store,
    register_in_process,
)

_PREFIX = "mem/data/projects/"


def lookup(addr: str) -> InMemorySecretBackend | None:
    """The live in-memory backend behind a `memory://<id>` address, if any."""
    backend = in_process_store(addr)
    return backend if isinstance(backend, InMemorySecretBackend) else None


@dataclass
class _Version:
    value: str | None  # None once destroyed
    created_at: datetime

    @property
    def destroyed(self) -> bool:
        return self.value is None


@dataclass
class _Secret:
    created_at: datetime
    versions: list[_Version] = field(default_factory=list)


@dataclass(frozen=True)
class _Token:
    path: str  # one secret's path, or a prefix ending in "/"
    expires_at: float


class InMemorySecretBackend(SecretBackend):
    name = "memory"

    def __init__(self, *, clock: Clock | None = None, max_token_ttl: int = MAX_TOKEN_TTL_SECONDS):
        self.clock = clock or Clock()
        self.max_token_ttl = min(max_token_ttl, MAX_TOKEN_TTL_SECONDS)
        self.id = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, _Secret]] = {}
        self._tokens: dict[str, _Token] = {}
        self._health = StoreHealth.OK
        self.addr = register_in_process(self.id, self)

    # -- test controls ------------------------------------------------------------------------------------

    def set_health(self, health: StoreHealth) -> None:
        """Pretend to be sealed, unreachable or unconfigured (or OK again)."""
        self._health = health

    def _check(self) -> None:
        if self._health is StoreHealth.UNCONFIGURED:
            raise StoreUnconfigured()
        if self._health is not StoreHealth.OK:
            raise StoreUnavailable(health=self._health)

    # -- port ---------------------------------------------------------------------------------------------

    async def health(self) -> StoreHealth:
        return self._health

    def path_prefix(self, project_id: str) -> str:
        return f"{_PREFIX}{project_id}/"

    async def write(self, project_id: str, name: str, value: str) -> int:
        self._check()
        now = self.clock.now()
        with self._lock:
            secret = self._data.setdefault(project_id, {}).get(name)
            if secret is None:
                secret = self._data[project_id][name] = _Secret(created_at=now)
            secret.versions.append(_Version(value=value, created_at=now))
            return len(secret.versions)

    def _read_locked(self, project_id: str, name: str, version: int | None) -> SecretValue:
        secret = self._data.get(project_id, {}).get(name)
        if secret is None:
            raise SecretMissing(name)
        current = len(secret.versions)
        number = current if not version else version
        if number < 1 or number > current:
            raise VersionMissing(name, number, current)
        stored = secret.versions[number - 1]
        if stored.value is None:
            raise VersionDestroyed(name, number)
        return SecretValue(name=name, version=number, value=stored.value)

    async def read(self, project_id: str, name: str, version: int | None = None) -> SecretValue:
        self._check()
        with self._lock:
            return self._read_locked(project_id, name, version)

    def _metadata_locked(self, name: str, secret: _Secret) -> SecretMetadata:
        versions = tuple(
            SecretVersion(version=i, created_at=v.created_at, destroyed=v.destroyed)
            for i, v in enumerate(secret.versions, start=1)
        )
        return SecretMetadata(
            name=name,
            current_version=len(secret.versions),
            created_at=secret.created_at,
            updated_at=secret.versions[-1].created_at,
            versions=versions,
        )

    async def metadata(self, project_id: str, name: str) -> SecretMetadata | None:
        self._check()
        with self._lock:
            secret = self._data.get(project_id, {}).get(name)
            return None if secret is None else self._metadata_locked(name, secret)

    async def list(self, project_id: str) -> list[SecretMetadata]:
        self._check()
        with self._lock:
            project = self._data.get(project_id, {})
            return [self._metadata_locked(name, project[name]) for name in sorted(project)]

    async def destroy(self, project_id: str, name: str) -> bool:
        self._check()
        with self._lock:
            return self._data.get(project_id, {}).pop(name, None) is not None

    async def destroy_versions(self, project_id: str, name: str, versions: builtins.list[int]) -> None:
        self._check()
        with self._lock:
            secret = self._data.get(project_id, {}).get(name)
            if secret is None:
                raise SecretMissing(name)
            for number in versions:
                if 1 <= number <= len(secret.versions):
                    secret.versions[number - 1].value = None

    async def mint_read_token(self, project_id: str, name: str | None, ttl_seconds: int) -> ReadToken:
        self._check()
        ttl = max(1, min(int(ttl_seconds), self.max_token_ttl))
        path = self.path_prefix(project_id) + (name or "")
        token = "mem." + secrets.token_urlsafe(24)
        with self._lock:
            now = self.clock.time()
            # forget expired tokens so the table does not grow without bound
            for key in [k for k, t in self._tokens.items() if t.expires_at <= now]:
                del self._tokens[key]
            self._tokens[token] = _Token(path=path, expires_at=now + ttl)
        return ReadToken(token=token, ttl_seconds=ttl, addr=self.addr, path=path)

    def read_with_token_sync(self, token: str, path: str, version: int | None = None) -> SecretValue:
        """The store's own read path (synchronous, for the workload helper's blocking API)."""
        self._check()
        with self._lock:
            grant = self._tokens.get(token)
            if grant is None or grant.expires_at <= self.clock.time():
                raise TokenRejected()
            allowed = path.startswith(grant.path) if grant.path.endswith("/") else path == grant.path
            if not allowed or not path.startswith(_PREFIX):
                raise TokenRejected()
            project_id, _, name = path.removeprefix(_PREFIX).partition("/")
            if not name or "/" in name:
                raise SecretMissing(name)
            return self._read_locked(project_id, name, version)

    async def read_with_token(self, token: str, path: str, version: int | None = None) -> SecretValue:
        return self.read_with_token_sync(token, path, version)
