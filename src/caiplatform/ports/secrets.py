"""The secret-backend port: where project secret values live.

A backend keeps named, versioned string values per project under a per-project path prefix. Every write
adds a version; nothing is overwritten. It mints short-lived read tokens scoped to one secret or to the
whole project prefix, and honours them on its own read path (`read_with_token`), which is what a
deployed workload reaches directly.

Backends never decide who may do what (the `SecretStore` service does); they report what the store
holds and why an operation could not happen, with the errors below. Values are never logged.
"""

from __future__ import annotations

import abc
import builtins
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from caiplatform.errors import Forbidden, NotFound, NotSupported, Unavailable

# Stores that live in this process, by their `memory://<id>` address (the in-memory backend registers
# itself): `caiplatform.workload` reads through one in tests exactly as it reads OpenBao over HTTP.
_IN_PROCESS: weakref.WeakValueDictionary[str, SecretBackend] = weakref.WeakValueDictionary()


def register_in_process(store_id: str, backend: SecretBackend) -> str:
    """Make `backend` reachable at `memory://<store_id>` from this process; returns that address."""
    _IN_PROCESS[store_id] = backend
    return f"memory://{store_id}"


def in_process_store(addr: str) -> SecretBackend | None:
    """The live in-process backend behind a `memory://<id>` address, if any."""
    if not addr.startswith("memory://"):
        return None
    return _IN_PROCESS.get(addr.removeprefix("memory://").rstrip("/"))


#: The store never hands out a read token living longer than this (spec: max 3600 s).
MAX_TOKEN_TTL_SECONDS = 3600
DEFAULT_TOKEN_TTL_SECONDS = 300

STORE_UNCONFIGURED_MESSAGE = (
    "the project secret store is not configured: point the platform at an OpenBao or Vault server "
    "(CAI_BAO_ADDR and CAI_BAO_TOKEN) or run caiplatform serve with its embedded OpenBao"
)
STORE_UNAVAILABLE_MESSAGE = (
    "the project secret store is sealed or unreachable; try again once it is unsealed and reachable"
)
MINTING_UNSUPPORTED_MESSAGE = "the configured secret store cannot mint scoped read tokens"


class StoreHealth(StrEnum):
    OK = "ok"
    UNCONFIGURED = "unconfigured"
    SEALED = "sealed"
    UNREACHABLE = "unreachable"


# ---- errors -------------------------------------------------------------------------------------------


class StoreUnconfigured(Unavailable):
    """No secret store is configured (503, its own message)."""

    def __init__(self, message: str = STORE_UNCONFIGURED_MESSAGE):
        super().__init__(message)


class StoreUnavailable(Unavailable):
    """The store is sealed or cannot be reached (503, its own message)."""

    def __init__(self, message: str = STORE_UNAVAILABLE_MESSAGE, *, health: StoreHealth = StoreHealth.UNREACHABLE):
        super().__init__(message)
        self.health = health


class SecretMissing(NotFound):
    def __init__(self, name: str):
        super().__init__(f"secret {name} not found")
        self.name = name


class VersionMissing(NotFound):
    def __init__(self, name: str, version: int, current: int):
        super().__init__(f"{name} has no version {version} (current is {current})")
        self.name, self.version, self.current = name, version, current


class VersionDestroyed(NotFound):
    def __init__(self, name: str, version: int):
        super().__init__(f"version {version} of {name} is destroyed and cannot be read")
        self.name, self.version = name, version


class TokenRejected(Forbidden):
    """A read token is unknown, expired, or not scoped to the path it was presented for."""

    def __init__(self, message: str = "the read token is invalid, expired, or not scoped to this path"):
        super().__init__(message)


class MintingUnsupported(NotSupported):
    def __init__(self, message: str = MINTING_UNSUPPORTED_MESSAGE):
        super().__init__(message)


# ---- values ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretVersion:
    version: int
    created_at: datetime | None
    destroyed: bool


@dataclass(frozen=True)
class SecretMetadata:
    name: str
    current_version: int
    created_at: datetime
    updated_at: datetime
    versions: tuple[SecretVersion, ...] = field(default=())

    def version(self, number: int) -> SecretVersion | None:
        for v in self.versions:
            if v.version == number:
                return v
        return None


@dataclass(frozen=True)
class SecretValue:
    name: str
    version: int
    value: str = field(repr=False)


@dataclass(frozen=True)
class ReadToken:
    """A read-only token and where to present it.

    `path` is the store path the token reads: one secret's path, or the project prefix (ending in `/`)
    to which a secret's name is appended. `ttl_seconds` is what the store granted, which may be less
    than what was asked.
    """

    token: str = field(repr=False)
    ttl_seconds: int
    addr: str
    path: str


def clamp_ttl(ttl_seconds: int | None) -> int:
    """The spec's rule for a requested TTL: absent → 300, above 3600 → 3600 (silently)."""
    if ttl_seconds is None or ttl_seconds <= 0:
        return DEFAULT_TOKEN_TTL_SECONDS
    return min(int(ttl_seconds), MAX_TOKEN_TTL_SECONDS)


# ---- the port -------------------------------------------------------------------------------------------


class SecretBackend(abc.ABC):
    """Versioned secret values per project. All methods are async; errors are the classes above."""

    #: adapter name as registered (`memory`, `openbao`)
    name: str = "abstract"

    @abc.abstractmethod
    async def health(self) -> StoreHealth:
        """OK, or why the store cannot serve: UNCONFIGURED, SEALED or UNREACHABLE. Never raises."""

    @abc.abstractmethod
    def path_prefix(self, project_id: str) -> str:
        """The store path under which this project's secrets are read (ends with `/`)."""

    @abc.abstractmethod
    async def write(self, project_id: str, name: str, value: str) -> int:
        """Store `value` as the next version of `name` (1 when new); returns that version."""

    @abc.abstractmethod
    async def read(self, project_id: str, name: str, version: int | None = None) -> SecretValue:
        """The value of one version (None or 0: the current one).

        Raises SecretMissing, VersionMissing (no such version) or VersionDestroyed.
        """

    @abc.abstractmethod
    async def metadata(self, project_id: str, name: str) -> SecretMetadata | None:
        """Versions and timestamps of one secret, or None when it does not exist."""

    @abc.abstractmethod
    async def list(self, project_id: str) -> list[SecretMetadata]:
        """Every secret of the project, sorted by name."""

    @abc.abstractmethod
    async def destroy(self, project_id: str, name: str) -> bool:
        """Destroy every version and the metadata of `name`; False when it did not exist."""

    @abc.abstractmethod
    async def destroy_versions(self, project_id: str, name: str, versions: builtins.list[int]) -> None:
        """Permanently destroy the given versions (they stay listed, marked destroyed)."""

    @abc.abstractmethod
    async def mint_read_token(self, project_id: str, name: str | None, ttl_seconds: int) -> ReadToken:
        """A read-only token for one secret (`name`) or the whole project prefix (`name` None).

        The TTL asked for is clamped to MAX_TOKEN_TTL_SECONDS and possibly further by the store; the
        returned `ttl_seconds` is what the store granted. Raises MintingUnsupported when the store cannot.
        """

    @abc.abstractmethod
    async def read_with_token(self, token: str, path: str, version: int | None = None) -> SecretValue:
        """What a workload does: present `token` to the store to read the secret at `path`.

        `path` is a full secret path (`ReadToken.path`, or the prefix plus a name). Raises TokenRejected
        when the token does not allow it, SecretMissing/VersionDestroyed when there is nothing to read.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; the default has nothing to release."""


class UnconfiguredSecretBackend(SecretBackend):
    """Stands in when no store is configured: health says so and every operation raises the 503."""

    name = "unconfigured"

    async def health(self) -> StoreHealth:
        return StoreHealth.UNCONFIGURED

    def path_prefix(self, project_id: str) -> str:
        return f"unconfigured/projects/{project_id}/"

    async def write(self, project_id: str, name: str, value: str) -> int:
        raise StoreUnconfigured()

    async def read(self, project_id: str, name: str, version: int | None = None) -> SecretValue:
        raise StoreUnconfigured()

    async def metadata(self, project_id: str, name: str) -> SecretMetadata | None:
        raise StoreUnconfigured()

    async def list(self, project_id: str) -> list[SecretMetadata]:
        raise StoreUnconfigured()

    async def destroy(self, project_id: str, name: str) -> bool:
        raise StoreUnconfigured()

    async def destroy_versions(self, project_id: str, name: str, versions: builtins.list[int]) -> None:
        raise StoreUnconfigured()

    async def mint_read_token(self, project_id: str, name: str | None, ttl_seconds: int) -> ReadToken:
        raise StoreUnconfigured()

    async def read_with_token(self, token: str, path: str, version: int | None = None) -> SecretValue:
        raise StoreUnconfigured()
