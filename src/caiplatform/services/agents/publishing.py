"""Agents on their public host, and the embed config with its public key (document 1, Embed).
"""

from __future__ import annotations

import logging
import math
import secrets as pysecrets
from typing import Any

import anyio.to_thread
from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.clock import rfc3339
from caiplatform.db.models import Project
from caiplatform.db.models.agents import Agent
from caiplatform.domain import agents as rules
from caiplatform.models.agents import EmbedConfig, EmbedDeleted, EmbedUpdate
from caiplatform.principal import Principal
from caiplatform.ratelimit import TokenBucketLimiter
from caiplatform.routing import HostGuard, Refusal, Upstream
from caiplatform.services.agent_directory import EmbedTarget
from caiplatform.services.agents.base import AgentBase
from caiplatform.services.agents.records import (
    AgentRecord,
)

log = logging.getLogger(__name__)


class AgentPublishing(AgentBase):
    """Publishing an agent on its own host (auth modes: API key, JWT against a JWKS, none; a rate
    budget) and the chat widget's embed config and key."""

    # == publishing ==================================================================================

    def _external_url(self, record: AgentRecord) -> str:
        host = self.hosts.host_for(record.name, record.project.short)
        port = ""
        if self.settings.base_url:
            from urllib.parse import urlsplit

            parsed = urlsplit(self.settings.base_url)
            if parsed.port:
                port = f":{parsed.port}"
        return f"http://{host}{port}"

    async def _publish(self, record: AgentRecord) -> None:
        mode, refusal = rules.exposure(record.env)
        host = self.hosts.host_for(record.name, record.project.short)
        if mode is None or refusal:
            self._unpublish(record)
            return
        ref, timeout = record.workload, float(record.config.get("timeout_seconds") or self.settings.invoke_timeout_seconds)
        target, hook = self._target_of(record), self.public_upstream

        async def upstream() -> Upstream:
            if hook is not None:
                return await hook(target)
            endpoint = await self.runtime.acquire(ref, timeout=timeout)
            return Upstream(endpoint.base_url, endpoint.release, timeout)

        self.hosts.register(host, upstream, self._host_guard(record, mode))
        url = self._external_url(record)
        if record.external_url != url:
            await self._store_external_url(record.id, url)

    def _host_guard(self, record: AgentRecord, mode: str) -> HostGuard:
        """The published address's gate: the auth mode (`apikey`: a platform key with access to the
        project; `jwt`: a token signed by the configured issuer's JWKS; `none`), then the rate budget.
        `GET /healthz` answers without a credential."""
        count, seconds = rules.rate_budget(record.env[rules.EXPOSE_RATE_LIMIT])
        limiter = TokenBucketLimiter(count / seconds, count, self.clock)
        budget = record.env[rules.EXPOSE_RATE_LIMIT].strip()
        jwks: list[Any] = []
        project_id = record.project.id

        def bearer(headers: dict[str, str]) -> str:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""

        async def check_apikey(headers: dict[str, str]) -> Refusal | None:
            key = bearer(headers) or headers.get("x-api-key", "").strip()
            if not key:
                return 401, "this agent's public address requires an API key: send Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"}
            principal = await self.authenticate(key) if self.authenticate else None
            if principal is None or not principal.authenticated:
                return 401, "invalid or expired API key", {"WWW-Authenticate": "Bearer"}

            def visible(session: Session) -> bool:
                project = session.get(Project, project_id)
                return project is not None and self.access.grant_sync(session, principal, project).visible

            if not await self.db.run(visible):
                return 403, "this API key has no access to the agent's project", {}
            return None

        def verify_jwt(token: str) -> None:
            import jwt

            if not jwks:
                jwks.append(jwt.PyJWKClient(record.env[rules.EXPOSE_JWT_JWKS_URI].strip()))
            key = jwks[0].get_signing_key_from_jwt(token).key
            audiences = [a.strip() for a in record.env.get("CAI_EXPOSE_JWT_AUDIENCES", "").split(",") if a.strip()]
            jwt.decode(token, key, algorithms=["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"],
                       issuer=record.env[rules.EXPOSE_JWT_ISSUER].strip(), audience=audiences or None,
                       options={"verify_aud": bool(audiences)})

        async def check_jwt(headers: dict[str, str]) -> Refusal | None:
            token = bearer(headers)
            if not token:
                return 401, "this agent's public address requires a bearer JWT", {"WWW-Authenticate": "Bearer"}
            try:
                await anyio.to_thread.run_sync(verify_jwt, token)
            except Exception as exc:  # noqa: BLE001 - any verification failure is the caller's 401
                return 401, f"invalid token: {exc}", {"WWW-Authenticate": "Bearer"}
            return None

        async def guard(method: str, path: str, headers: dict[str, str]) -> Refusal | None:
            if not (method == "GET" and path == "/healthz"):
                if mode == "apikey":
                    refusal = await check_apikey(headers)
                elif mode == "jwt":
                    refusal = await check_jwt(headers)
                else:
                    refusal = None
                if refusal is not None:
                    return refusal
            wait = limiter.try_acquire("host")
            if wait is not None:
                return 429, f"this agent's public rate budget ({budget}) is used up; retry later", {
                    "Retry-After": str(max(1, math.ceil(wait)))}
            return None

        return guard

    async def _store_external_url(self, agent_id: str, url: str) -> None:
        def run(session: Session) -> None:
            agent = session.get(Agent, agent_id)
            if agent is not None:
                agent.external_url = url

        await self.db.run(run)

    def _unpublish(self, record: AgentRecord) -> None:
        self.hosts.unregister(self.hosts.host_for(record.name, record.project.short))
        if record.external_url:
            self._spawn(record.id, self._store_external_url(record.id, ""))

    # == embed config ================================================================================

    @staticmethod
    def _embed_view(embed: dict[str, Any] | None) -> dict[str, Any]:
        return {**rules.embed_defaults(), **(embed or {})}

    async def get_embed(self, principal: Principal, name: str, project: str | None) -> EmbedConfig:
        record = await self._locate(principal, name, project)
        return EmbedConfig.of({"agent": record.name, **self._embed_view(record.embed)})

    async def put_embed(self, principal: Principal, name: str, project: str | None, update: EmbedUpdate) -> EmbedConfig:
        record = await self._locate(principal, name, project)
        merged = rules.merge_embed(record.embed, update.changes())
        now = self.clock.now()

        def run(session: Session) -> dict[str, Any]:
            agent = self._agent_sync(session, record)
            if not merged.get("embed_key"):
                merged["embed_key"] = _embed_key()
            merged["updated_at"] = rfc3339(now)
            agent.embed, agent.embed_key = merged, merged["embed_key"]
            self.audit.record(session, record.project.id, principal, "agent.embed.update", record.name,
                              {k: v for k, v in merged.items() if k != "embed_key"})
            return merged

        embed = await self.db.run(run)
        return EmbedConfig.of({"agent": record.name, **self._embed_view(embed)})

    async def delete_embed(self, principal: Principal, name: str, project: str | None) -> EmbedDeleted:
        record = await self._locate(principal, name, project)

        def run(session: Session) -> None:
            agent = self._agent_sync(session, record)
            agent.embed, agent.embed_key = None, None
            self.audit.record(session, record.project.id, principal, "agent.embed.delete", record.name)

        await self.db.run(run)
        return EmbedDeleted(agent=record.name, deleted=True)

    async def rotate_embed_key(self, principal: Principal, name: str, project: str | None) -> EmbedConfig:
        record = await self._locate(principal, name, project)
        now = self.clock.now()

        def run(session: Session) -> dict[str, Any]:
            agent = self._agent_sync(session, record)
            embed = {**rules.embed_defaults(), **(agent.embed or {})}
            embed["embed_key"], embed["updated_at"] = _embed_key(), rfc3339(now)
            agent.embed, agent.embed_key = embed, embed["embed_key"]
            self.audit.record(session, record.project.id, principal, "agent.embed.rotate-key", record.name)
            return embed

        embed = await self.db.run(run)
        return EmbedConfig.of({"agent": record.name, **self._embed_view(embed)})

    async def embed_target(self, key: str) -> EmbedTarget | None:
        def run(session: Session) -> EmbedTarget | None:
            if not key:
                return None
            agent = session.scalar(select(Agent).where(Agent.embed_key == key))
            if agent is None or not (agent.embed or {}).get("enabled"):
                return None
            config = self._embed_view(agent.embed)
            project = session.get(Project, agent.project_id)
            if project is None:
                return None
            return EmbedTarget(self._target(agent, project), config,
                               list(config.get("allowed_origins") or []))

        return await self.db.run(run)


def _embed_key() -> str:
    return "emb_" + pysecrets.token_urlsafe(24)
