"""OpenBao (or HashiCorp Vault) secret backend through `hvac`.

Layout: a KV version 2 engine mounted at `mount` (default `secret`); project P's secrets live at
`<prefix>/<P>/<name>` (default prefix `caiplatform/projects`), each value stored as `{"value": ...}`.
Every write is a new KV version; metadata keeps up to `KEEP_VERSIONS` versions per key so that nothing
is silently pruned (KV's own default keeps only 10).

Read tokens: the adapter writes an ACL policy granting `read` on exactly one secret's data path, or on
the project's data prefix (`<prefix>/<P>/*`), and creates a non-renewable token holding only that policy
with the requested TTL (clamped to 3600 s). The TTL reported back is the one the store granted.

hvac is blocking; every call runs in a worker thread (`anyio.to_thread`).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import hvac
import hvac.exceptions
import requests

from caiplatform.ports.secrets import (
    MAX_TOKEN_TTL_SECONDS,
    MintingUnsupported,
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
)

T = TypeVar("T")

KEEP_VERSIONS = 100_000


def parse_time(text: str | None) -> datetime | None:
    """KV timestamps carry nanoseconds (`2026-11-22T04:20:27.492909355Z`); Python takes microseconds."""
    if not text:
        return None
    body = text.rstrip("Z")
    if "." in body:
        head, frac = body.split(".", 1)
        body = f"{head}.{frac[:6]}"
    moment = datetime.fromisoformat(body)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class OpenBaoSecretBackend(SecretBackend):
    name = "openbao"

    def __init__(
        self,
        addr: str | None,
        token: str | None,
        *,
        mount: str = "secret",
        prefix: str = "caiplatform/projects",
        public_addr: str | None = None,
        namespace: str | None = None,
        timeout: float = 5.0,
        verify: bool | str = True,
        max_token_ttl: int = MAX_TOKEN_TTL_SECONDS,
    ):
        self.addr = addr.rstrip("/") if addr else None
        self._token = token
        self.mount = mount.strip("/")
        self.prefix = prefix.strip("/")
        # The address handed to workloads with a read token (may differ from how the platform reaches it).
        self.public_addr = (public_addr or self.addr or "").rstrip("/")
        self.namespace = namespace
        self.timeout = timeout
        self.verify = verify
        self.max_token_ttl = min(max_token_ttl, MAX_TOKEN_TTL_SECONDS)
        self._client: hvac.Client | None = None
        self._mount_checked = False

    @classmethod
    def from_handle(cls, handle: Any, **kwargs: Any) -> OpenBaoSecretBackend:
        """Build from anything with `.addr` and `.token` (the embedded server's `OpenBaoHandle`)."""
        return cls(handle.addr, handle.token, **kwargs)

    # -- plumbing -----------------------------------------------------------------------------------------

    @property
    def configured(self) -> bool:
        return bool(self.addr and self._token)

    def _new_client(self, token: str | None) -> hvac.Client:
        return hvac.Client(
            url=self.addr, token=token, namespace=self.namespace, timeout=self.timeout, verify=self.verify
        )

    def _platform_client(self) -> hvac.Client:
        if not self.configured:
            raise StoreUnconfigured()
        if self._client is None:
            self._client = self._new_client(self._token)
        return self._client

    async def _call(self, fn: Callable[[hvac.Client], T]) -> T:
        """Run `fn(client)` in a thread, translating transport and seal failures."""
        client = self._platform_client()

        def run() -> T:
            self._ensure_mount(client)
            return fn(client)

        return await anyio.to_thread.run_sync(_translate(run))

    def _ensure_mount(self, client: hvac.Client) -> None:
        """Enable the KV v2 engine at `mount` when it is missing (a fresh embedded server has none)."""
        if self._mount_checked:
            return
        try:
            mounts = client.sys.list_mounted_secrets_engines()
            table = mounts.get("data", mounts)
            if f"{self.mount}/" not in table:
                client.sys.enable_secrets_engine("kv", path=self.mount, options={"version": "2"})
        except hvac.exceptions.Forbidden:
            pass  # a narrowly-scoped platform token: the operator set the mount up
        self._mount_checked = True

    def _kv_path(self, project_id: str, name: str) -> str:
        return f"{self.prefix}/{project_id}/{name}"

    def _data_path(self, project_id: str, name: str = "") -> str:
        return f"{self.mount}/data/{self.prefix}/{project_id}/{name}"

    # -- port ---------------------------------------------------------------------------------------------

    async def health(self) -> StoreHealth:
        if not self.configured:
            return StoreHealth.UNCONFIGURED

        def probe() -> StoreHealth:
            client = self._new_client(None)
            try:
                resp = client.sys.read_health_status(method="GET")
            except (requests.exceptions.RequestException, hvac.exceptions.VaultError):
                return StoreHealth.UNREACHABLE
            if isinstance(resp, dict):
                return StoreHealth.SEALED if resp.get("sealed") else StoreHealth.OK
            status = getattr(resp, "status_code", 0)
            if status in (200, 429, 472, 473):
                return StoreHealth.OK
            if status in (501, 503):
                return StoreHealth.SEALED
            return StoreHealth.UNREACHABLE

        return await anyio.to_thread.run_sync(probe)

    def path_prefix(self, project_id: str) -> str:
        return self._data_path(project_id)

    async def write(self, project_id: str, name: str, value: str) -> int:
        path = self._kv_path(project_id, name)

        def op(client: hvac.Client) -> int:
            resp = client.secrets.kv.v2.create_or_update_secret(path, secret={"value": value}, mount_point=self.mount)
            version = int(resp["data"]["version"])
            if version == 1:
                client.secrets.kv.v2.update_metadata(path, max_versions=KEEP_VERSIONS, mount_point=self.mount)
            return version

        return await self._call(op)

    def _raw_metadata(self, client: hvac.Client, project_id: str, name: str) -> dict[str, Any] | None:
        try:
            resp = client.secrets.kv.v2.read_secret_metadata(self._kv_path(project_id, name), mount_point=self.mount)
        except hvac.exceptions.InvalidPath:
            return None
        return resp["data"]

    @staticmethod
    def _to_metadata(name: str, raw: dict[str, Any]) -> SecretMetadata:
        current = int(raw.get("current_version") or 0)
        table = raw.get("versions") or {}
        versions = []
        for number in range(1, current + 1):
            entry = table.get(str(number))
            if entry is None:  # pruned by the store: it cannot be read any more
                versions.append(SecretVersion(version=number, created_at=None, destroyed=True))
                continue
            destroyed = bool(entry.get("destroyed")) or bool(entry.get("deletion_time"))
            versions.append(
                SecretVersion(version=number, created_at=parse_time(entry.get("created_time")), destroyed=destroyed)
            )
        created = parse_time(raw.get("created_time")) or datetime.fromtimestamp(0, UTC)
        updated = parse_time(raw.get("updated_time")) or created
        last = table.get(str(current))
        if last is not None:
            updated = parse_time(last.get("created_time")) or updated
        return SecretMetadata(
            name=name, current_version=current, created_at=created, updated_at=updated, versions=tuple(versions)
        )

    async def metadata(self, project_id: str, name: str) -> SecretMetadata | None:
        raw = await self._call(lambda c: self._raw_metadata(c, project_id, name))
        if raw is None or not raw.get("current_version"):
            return None
        return self._to_metadata(name, raw)

    async def list(self, project_id: str) -> list[SecretMetadata]:
        def op(client: hvac.Client) -> builtins.list[SecretMetadata]:
            try:
                resp = client.secrets.kv.v2.list_secrets(f"{self.prefix}/{project_id}", mount_point=self.mount)
            except hvac.exceptions.InvalidPath:
                return []
            out = []
            for key in sorted(resp["data"].get("keys") or []):
                if key.endswith("/"):
                    continue  # a folder: not one of our names
                raw = self._raw_metadata(client, project_id, key)
                if raw is not None and raw.get("current_version"):
                    out.append(self._to_metadata(key, raw))
            return out

        return await self._call(op)

    async def read(self, project_id: str, name: str, version: int | None = None) -> SecretValue:
        path = self._kv_path(project_id, name)

        def op(client: hvac.Client) -> SecretValue:
            raw = self._raw_metadata(client, project_id, name)
            if raw is None or not raw.get("current_version"):
                raise SecretMissing(name)
            meta = self._to_metadata(name, raw)
            number = version or meta.current_version
            info = meta.version(number)
            if info is None:
                raise VersionMissing(name, number, meta.current_version)
            if info.destroyed:
                raise VersionDestroyed(name, number)
            try:
                resp = client.secrets.kv.v2.read_secret_version(
                    path, version=number, mount_point=self.mount, raise_on_deleted_version=True
                )
            except hvac.exceptions.InvalidPath:
                raise VersionDestroyed(name, number) from None
            return SecretValue(name=name, version=number, value=str(resp["data"]["data"].get("value", "")))

        return await self._call(op)

    async def destroy(self, project_id: str, name: str) -> bool:
        path = self._kv_path(project_id, name)

        def op(client: hvac.Client) -> bool:
            if self._raw_metadata(client, project_id, name) is None:
                return False
            client.secrets.kv.v2.delete_metadata_and_all_versions(path, mount_point=self.mount)
            return True

        return await self._call(op)

    async def destroy_versions(self, project_id: str, name: str, versions: builtins.list[int]) -> None:
        path = self._kv_path(project_id, name)

        def op(client: hvac.Client) -> None:
            if self._raw_metadata(client, project_id, name) is None:
                raise SecretMissing(name)
            client.secrets.kv.v2.destroy_secret_versions(path, versions=list(versions), mount_point=self.mount)

        await self._call(op)

    async def mint_read_token(self, project_id: str, name: str | None, ttl_seconds: int) -> ReadToken:
        ttl = max(1, min(int(ttl_seconds), self.max_token_ttl))
        if name is None:
            path = self._data_path(project_id)
            rule = f"{path}*"
            scope = "all"
        else:
            path = self._data_path(project_id, name)
            rule = path
            scope = hashlib.sha256(name.encode()).hexdigest()[:20]
        # Policy names are case-insensitive in the store, secret names are not: hash the name.
        policy = f"caiplatform-read-{project_id}-{scope}"
        body = f'path "{rule}" {{\n  capabilities = ["read"]\n}}\n'

        def op(client: hvac.Client) -> ReadToken:
            try:
                client.sys.create_or_update_acl_policy(name=policy, policy=body)
                resp = client.auth.token.create(
                    policies=[policy],
                    no_default_policy=True,
                    renewable=False,
                    ttl=f"{ttl}s",
                    explicit_max_ttl=f"{ttl}s",
                    display_name="caiplatform-read",
                    meta={"project": project_id, "secret": name or "*"},
                )
            except hvac.exceptions.Forbidden as exc:
                raise MintingUnsupported(
                    "the configured secret store cannot mint scoped read tokens: the platform's token may not "
                    "write ACL policies or create tokens"
                ) from exc
            auth = resp["auth"]
            granted = int(auth.get("lease_duration") or ttl)
            return ReadToken(token=auth["client_token"], ttl_seconds=granted, addr=self.public_addr, path=path)

        return await self._call(op)

    async def read_with_token(self, token: str, path: str, version: int | None = None) -> SecretValue:
        if not self.configured:
            raise StoreUnconfigured()

        def op() -> SecretValue:
            client = self._new_client(token)
            params = {"version": version} if version else None
            try:
                resp = client.adapter.get(f"/v1/{path.lstrip('/')}", params=params)
            except hvac.exceptions.Forbidden:
                raise TokenRejected() from None
            except hvac.exceptions.InvalidPath:
                raise SecretMissing(path.rsplit("/", 1)[-1]) from None
            data = resp.get("data") if isinstance(resp, dict) else None
            if not data or data.get("data") is None:
                raise SecretMissing(path.rsplit("/", 1)[-1])
            meta = data.get("metadata") or {}
            return SecretValue(
                name=path.rsplit("/", 1)[-1],
                version=int(meta.get("version") or 0),
                value=str(data["data"].get("value", "")),
            )

        return await anyio.to_thread.run_sync(_translate(op))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(lambda: client.adapter.close())


def _translate(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        try:
            return fn()
        except hvac.exceptions.VaultDown:
            raise StoreUnavailable(health=StoreHealth.SEALED) from None
        except requests.exceptions.RequestException:
            raise StoreUnavailable(health=StoreHealth.UNREACHABLE) from None
        except (hvac.exceptions.InternalServerError, hvac.exceptions.BadGateway):
            raise StoreUnavailable(health=StoreHealth.UNREACHABLE) from None
        except (hvac.exceptions.Unauthorized, hvac.exceptions.Forbidden):
            # The platform's own token was refused: the store is up but unusable for us.
            raise StoreUnavailable(health=StoreHealth.UNREACHABLE) from None

    return run
