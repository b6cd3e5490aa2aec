"""MemoryStoreService: the memory store API's rules, over a provisioner port.

Members list, read, read stats and create; project admins also delete and rotate credentials. The
password is generated here, handed to the provisioner, and returned exactly twice: by create and by
rotate. Reads return the credential secret's name only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.domain.memorystore import (
    MAX_CREATE_BODY_BYTES,
    NAME_MAX,
    NAME_PATTERN,
    STATS_BUDGET_SECONDS,
    USERNAME,
    Instance,
    InstanceSpec,
    State,
    connection_uri,
    stats_from_info,
)
from caiplatform.errors import (
    BadGateway,
    BadRequest,
    Conflict,
    NotFound,
    PlatformError,
    Unauthenticated,
    Unavailable,
)
from caiplatform.models import memorystore as views
from caiplatform.models.base import BodyOrReader, body_after_gate
from caiplatform.models.memorystore import NAME_RULE as NAME_RULE
from caiplatform.models.memorystore import POLICY_RULE as POLICY_RULE
from caiplatform.models.memorystore import SIZE_CLASS_RULE as SIZE_CLASS_RULE
from caiplatform.models.memorystore import MemoryStoreCreate
from caiplatform.pagination import Pager, page_body
from caiplatform.ports.memorystore import MemoryStoreProvisioner, ProvisionerHealth
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each

AUTH_REQUIRED = (
    "authentication required: sign in through the core API (POST /v1/auth/login) and send the token "
    "in the header Authorization: Bearer <token>"
)
NOT_FOUND = "memorystore not found"
NAME_TAKEN = "a memorystore with that name already exists in this project"
NOT_PROVISIONED = "the memorystore is not provisioned yet; poll it until ready is true, then retry"
BODY_TOO_LARGE = f"request body too large (limit {MAX_CREATE_BODY_BYTES} bytes)"
STATS_UNREACHABLE = "could not reach this memorystore to read its stats; "

CREATE_NOTE = (
    "store this password now: it is returned only by create and rotate-credential; later reads name the "
    "credential secret only. The instance is Provisioning; poll it until ready is true before connecting."
)
ROTATE_NOTE = (
    "the new password takes effect when the platform restarts the instance, which it does within a few "
    "seconds; until then the previous password stays in force. Store the new one now: it is not shown again."
)
# How long after a rotation the platform restarts the instance to apply the new password.
ROTATION_RESTART_DELAY_SECONDS = 5.0
DELETE_NOTE = "the instance and its volume are being destroyed; this cannot be undone"


HealthCheck = Callable[[], Awaitable[ProvisionerHealth]]


def new_password() -> str:
    """24 random bytes, base64url without padding."""
    return secrets.token_urlsafe(24)


log = logging.getLogger(__name__)


class MemoryStoreService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        provisioner: MemoryStoreProvisioner,
        *,
        checks: Mapping[str, HealthCheck] | None = None,
        stats_budget: float = STATS_BUDGET_SECONDS,
        rotation_restart_delay: float | None = ROTATION_RESTART_DELAY_SECONDS,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.provisioner = provisioner
        self._checks = dict(checks or {})
        self._stats_budget = stats_budget
        # The platform restarts an instance after a rotation so that the new password takes effect;
        # None leaves it to the next restart of the platform (or `restart()`).
        self._rotation_restart_delay = rotation_restart_delay
        self._restarts: set[asyncio.Task[None]] = set()
        # Told of each project whose stores came, went or moved (their workloads' network follows:
        # services/memorystore_reach.py, whose hook never raises); None where workloads need no telling.
        self.on_change: Callable[[str], Awaitable[None]] | None = None

    # ------------------------------------------------------------------------------------ helpers

    async def _changed(self, project_id: str) -> None:
        if self.on_change is not None:
            await self.on_change(project_id)

    async def _project(self, principal: Principal, project_id: str, *, admin: bool = False) -> ProjectRef:
        """The project gate (a malformed project id is 400); document 3's memory stores word their 401
        their own way (`AUTH_REQUIRED`: how to sign in and send the token)."""
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        return await self.access.project_ref(principal, project_id, Role.ADMIN if admin else Role.MEMBER,
                                             bad_id=BadRequest)

    async def _instance(self, principal: Principal, project_id: str, name: str, *, admin: bool = False):
        project = await self._project(principal, project_id, admin=admin)
        if not isinstance(name, str) or len(name) > NAME_MAX or not NAME_PATTERN.match(name):
            raise NotFound(NOT_FOUND)
        instance = await self.provisioner.get(project.id, name)
        if instance is None:
            raise NotFound(NOT_FOUND)
        return project, instance

    async def _audit(self, project_id: str, principal: Principal | None, action: str, name: str, detail: Any = None) -> None:
        await self.db.run(lambda session: self.audit.record(session, project_id, principal, action, name, detail))

    @staticmethod
    def _credential(instance: Instance, password: str) -> dict[str, Any]:
        credential: dict[str, Any] = {
            "username": USERNAME,
            "password": password,
            "uri": connection_uri(instance.host, instance.port, password),
        }
        if instance.spec.external_exposure and instance.externally_reachable and instance.external_endpoint:
            credential["external_uri"] = f"rediss://{USERNAME}:{password}@{instance.external_endpoint}/0"
        return credential

    @staticmethod
    def _summary(instance: Instance) -> dict[str, Any]:
        return {"name": instance.spec.name, "state": instance.state.value, "ready": instance.ready}

    # ------------------------------------------------------------------------------------ create

    def parse_create(self, project: ProjectRef, body: MemoryStoreCreate) -> InstanceSpec:
        """The instance spec of a create; the version must be one the provisioner runs."""
        version = body.version
        if version:
            supported = self.provisioner.versions()
            if not any(v == version or v.startswith(version + ".") for v in supported):
                raise BadRequest(
                    f"version {version!r} is not available; leave it blank for the platform default "
                    f"or choose one of: {', '.join(supported)}"
                )
        return InstanceSpec(
            project_id=project.id,
            project_short=project.short,
            name=body.name,
            size_class=body.size_class,
            version=version,
            maxmemory_policy=body.maxmemory_policy,
            external_exposure=body.external_exposure,
            persistence_enabled=body.persistence_enabled,
            persistence_size=body.persistence_size,
            storage_class_name=body.storage_class_name,
        )

    async def create(self, principal: Principal, project_id: str,
                     body: BodyOrReader[MemoryStoreCreate]) -> views.MemoryStoreCreated:
        """201 body: `{memorystore: {name, state, ready}, credential, note}`; the password is shown here once."""
        project = await self._project(principal, project_id)
        body = await body_after_gate(body)
        spec = self.parse_create(project, body)
        if await self.provisioner.get(project.id, spec.name) is not None:
            raise Conflict(NAME_TAKEN)
        password = new_password()
        try:
            instance = await self.provisioner.create(spec, password)
        except PlatformError:
            raise
        except Exception as exc:  # an engine or cluster failure
            raise BadGateway(f"could not create the memorystore: {exc}") from exc
        await self._changed(project.id)
        await self._audit(project.id, principal, "memorystore.create", spec.name,
                          {"size_class": spec.size_class, "persistence": spec.persistence_enabled})
        return views.MemoryStoreCreated.of({
            "memorystore": self._summary(instance),
            "credential": self._credential(instance, password),
            "note": CREATE_NOTE,
        })

    # ------------------------------------------------------------------------------------ reads

    async def list(
        self, principal: Principal, project_id: str, *, page_size: Any = None, page_token: str | None = None
    ) -> views.MemoryStoreList:
        """200 `{memorystores, next_page_token}`; the token is always present, empty on the last page."""
        project = await self._project(principal, project_id)
        request = self.pager.request(f"memorystores:{project.id}", page_size, page_token)
        instances = await self.provisioner.list(project.id)
        page = self.pager.page([i.to_json() for i in instances], request)
        return views.MemoryStoreList.of(page_body("memorystores", page))

    async def get(self, principal: Principal, project_id: str, name: str) -> views.MemoryStore:
        _, instance = await self._instance(principal, project_id, name)
        return views.MemoryStore.of(instance.to_json())

    async def stats(self, principal: Principal, project_id: str, name: str) -> views.MemoryStoreStats:
        project, instance = await self._instance(principal, project_id, name)
        if instance.state is State.PROVISIONING:
            raise Conflict(NOT_PROVISIONED)
        try:
            with anyio.fail_after(self._stats_budget):
                raw = await self.provisioner.info(project.id, name)
        except TimeoutError:
            raise Unavailable(
                STATS_UNREACHABLE + f"it did not answer within {self._stats_budget:g} s; retry shortly"
            ) from None
        except (OSError, ConnectionError) as exc:
            raise Unavailable(STATS_UNREACHABLE + f"{exc or type(exc).__name__}; retry shortly") from exc
        except PlatformError:
            raise
        except Exception as exc:
            if _is_connection_error(exc):
                raise Unavailable(STATS_UNREACHABLE + f"{exc}; retry shortly") from exc
            raise BadGateway(f"could not read the memorystore stats: {exc}") from exc
        return views.MemoryStoreStats.of(stats_from_info(instance.spec, raw))

    # ------------------------------------------------------------------------------------ admin

    async def delete(self, principal: Principal, project_id: str, name: str) -> views.MemoryStoreDeletion:
        project, instance = await self._instance(principal, project_id, name, admin=True)
        await self._remove(project.id, name, principal)
        return views.MemoryStoreDeletion(name=instance.spec.name, resource_path=instance.spec.resource_path,
                                         state="Deleting", note=DELETE_NOTE)

    async def _remove(self, project_id: str, name: str, principal: Principal | None) -> None:
        """Stop the instance and destroy its data. `principal` None: the platform acts (a project delete)."""
        try:
            deleted = await self.provisioner.delete(project_id, name)
        except PlatformError:
            raise
        except Exception as exc:
            raise BadGateway(f"could not delete the memorystore: {exc}") from exc
        await self._changed(project_id)
        if deleted is None:
            raise NotFound(NOT_FOUND)
        await self._audit(project_id, principal, "memorystore.delete", name)

    async def purge_project(self, project_id: str) -> int:
        """Remove every memory store of a project being deleted (for the projects area): each instance
        stopped, its data destroyed. Returns how many were removed."""
        instances = await self.provisioner.list(project_id)
        return await remove_each("memorystore", [i.spec.name for i in instances], str,
                                 lambda name: self._remove(project_id, name, None))

    async def rotate_credential(self, principal: Principal, project_id: str, name: str) -> views.MemoryStoreRotated:
        """200: the new credential (top level and under `credential`) and a note; applies at restart."""
        project, instance = await self._instance(principal, project_id, name, admin=True)
        if instance.state is State.PROVISIONING:
            raise Conflict(NOT_PROVISIONED)
        password = new_password()
        try:
            instance = await self.provisioner.rotate_password(project.id, name, password)
        except PlatformError:
            raise
        except Exception as exc:
            raise BadGateway(f"could not rotate the credential: {exc}") from exc
        await self._audit(project.id, principal, "memorystore.rotate_credential", name)
        if self._rotation_restart_delay is not None:
            task = asyncio.get_running_loop().create_task(self._restart_after_rotation(project.id, name))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)
        credential = self._credential(instance, password)
        return views.MemoryStoreRotated.of({
            "memorystore": self._summary(instance),
            **credential,
            "credential": credential,
            "note": ROTATE_NOTE,
        })

    async def _restart_after_rotation(self, project_id: str, name: str) -> None:
        await asyncio.sleep(self._rotation_restart_delay or 0)
        try:
            await self.provisioner.restart(project_id, name)
        except Exception:  # noqa: BLE001 - the instance may be gone; the next restart applies it anyway
            log.warning("restart after credential rotation of %s failed", name, exc_info=True)
        await self._changed(project_id)

    async def wait_restarts(self) -> None:
        """Wait for restarts scheduled by rotations (tests, shutdown)."""
        while self._restarts:
            await asyncio.gather(*list(self._restarts), return_exceptions=True)

    async def restart(self, principal: Principal, project_id: str, name: str) -> views.MemoryStore:
        """Library-only admin action: restart the instance now, applying a rotated password."""
        project, _ = await self._instance(principal, project_id, name, admin=True)
        try:
            instance = await self.provisioner.restart(project.id, name)
        except PlatformError:
            raise
        except Exception as exc:
            raise BadGateway(f"could not restart the memorystore: {exc}") from exc
        await self._changed(project.id)
        await self._audit(project.id, principal, "memorystore.restart", name)
        return views.MemoryStore.of(instance.to_json())

    # ------------------------------------------------------------------------------------ health

    async def health(self) -> tuple[int, views.MemoryStoreHealth]:
        """`/healthz`: (200 or 503, `{status, checks}`); a failing check carries `detail`."""
        results: dict[str, ProvisionerHealth] = {}
        try:
            results.update(await self.provisioner.health())
        except Exception as exc:
            results["kubernetes"] = ProvisionerHealth("unreachable", str(exc))
        for key, check in self._checks.items():
            try:
                results[key] = await check()
            except Exception as exc:
                results[key] = ProvisionerHealth("unreachable", str(exc))
        checks: dict[str, Any] = {}
        for key in ("kubernetes", "memorystore_crd", "database", "session_key"):
            result = results.get(key, ProvisionerHealth("unconfigured", f"no {key} check is wired"))
            checks[key] = {"status": result.status}
            if not result.ok or result.detail:
                checks[key]["detail"] = result.detail
        healthy = all(c["status"] == "ok" for c in checks.values())
        return (200 if healthy else 503), views.MemoryStoreHealth.of({"status": "ok" if healthy else "degraded",
                                                                     "checks": checks})


def _is_connection_error(exc: BaseException) -> bool:
    try:
        import redis.exceptions as rexc
    except ImportError:  # pragma: no cover - redis is in the memorystore extra
        return False
    return isinstance(exc, rexc.ConnectionError | rexc.TimeoutError)
