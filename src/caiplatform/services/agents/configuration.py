"""An agent's env, secrets, compute config, logs and stored source files.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from caiplatform.clock import rfc3339
from caiplatform.db.models.agents import AgentFile, AgentSecret
from caiplatform.domain import agent_source
from caiplatform.domain import agents as rules
from caiplatform.errors import BadRequest, NotFound
from caiplatform.principal import Principal
from caiplatform.services.agents.builds import AgentBuilds
from caiplatform.services.agents.records import (
    FILE_NOTE,
    FILES_NOTE,
    HISTORY_NOTE,
    LOG_HISTORY_DEFAULT,
    NOTHING_TO_DO,
    invalid_key,
)
from caiplatform.validation import ENV_NAME

log = logging.getLogger(__name__)


class AgentConfiguration(AgentBuilds):
    """What an owner edits and reads besides the code: env, secrets, compute config, logs, stored files."""

    # == env and secrets =============================================================================

    @staticmethod
    def _set_remove(body: Any) -> tuple[dict[str, Any], builtins.list[Any]]:
        if not isinstance(body, dict):
            raise BadRequest(NOTHING_TO_DO)
        set_ = body.get("set")
        remove = body.get("remove")
        if set_ is not None and not isinstance(set_, dict):
            raise BadRequest("'set' must be an object mapping names to values")
        if remove is not None and not isinstance(remove, list):
            raise BadRequest("'remove' must be an array of names")
        if not set_ and not remove:
            raise BadRequest(NOTHING_TO_DO)
        return set_ or {}, remove or []

    @staticmethod
    def _value(key: str, value: Any, what: str) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str | int | float):
            return str(value)
        raise BadRequest(f"{what} values must be strings: {key}")

    async def get_env(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        return {"agent": record.name, "env": record.env}

    async def patch_env(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        set_, remove = self._set_remove(body)
        for key in [*set_, *remove]:
            if not isinstance(key, str) or not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))
        values = {k: self._value(k, v, "env") for k, v in set_.items()}

        def run(session: Session) -> dict[str, str]:
            agent = self._agent_sync(session, record)
            env = dict(agent.env or {})
            for key in remove:
                env.pop(key, None)
            for key, value in values.items():
                if value == "":
                    env.pop(key, None)
                else:
                    env[key] = value
            agent.env, agent.updated_at = env, self.clock.now()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name,
                              {"env_set": sorted(values), "env_remove": sorted(remove)})
            return env

        env = await self.db.run(run)
        await self._roll(record.id, "env")
        return {"agent": record.name, "env_updated": True, "env": env}

    async def secret_keys(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        keys = await self.db.run(lambda s: sorted(s.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id))))
        return {"agent": record.name, "keys": keys}

    def _check_secret_map(self, values: Any) -> dict[str, str]:
        if not isinstance(values, dict):
            raise BadRequest("the body must be a JSON object mapping secret keys to values")
        checked: dict[str, str] = {}
        for key, value in values.items():
            if not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))
            checked[key] = self._value(key, value, "secret")
        return checked

    async def put_secrets(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        values = {k: v for k, v in self._check_secret_map(body).items() if v != ""}

        def run(session: Session) -> None:
            session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id))
            for key, value in values.items():
                session.add(AgentSecret(agent_id=record.id, key=key, value=value))
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"secrets_replaced": sorted(values)})

        await self.db.run(run)
        await self._roll(record.id, "secrets")
        return {"agent": record.name, "secrets_updated": True}

    async def patch_secrets(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        set_, remove = self._set_remove(body)
        values = self._check_secret_map(set_)
        for key in remove:
            if not isinstance(key, str) or not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))

        def run(session: Session) -> list[str]:
            drop = set(remove) | {k for k, v in values.items() if v == ""}
            if drop:
                session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id, AgentSecret.key.in_(drop)))
            for key, value in values.items():
                if value != "":
                    session.merge(AgentSecret(agent_id=record.id, key=key, value=value))
            session.flush()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name,
                              {"secrets_set": sorted(k for k, v in values.items() if v), "secrets_remove": sorted(drop)})
            return sorted(session.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id)))

        keys = await self.db.run(run)
        await self._roll(record.id, "secrets")
        return {"agent": record.name, "secrets_updated": True, "keys": keys}

    # == config ======================================================================================

    async def get_config(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        return {"agent": record.name, "config": record.config or None}

    async def patch_config(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        merged = rules.merge_config(record.config, body)

        def run(session: Session) -> None:
            agent = self._agent_sync(session, record)
            agent.config, agent.updated_at = merged, self.clock.now()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"config": merged})

        await self.db.run(run)
        await self._roll(record.id, "config")
        return {"agent": record.name, "config_updated": True, "config": merged or None}

    # == logs ========================================================================================

    async def logs(self, principal: Principal, name: str, project: str | None, *, follow: bool = False, tail: int = 500) -> AsyncIterator[str]:
        record = await self._locate(principal, name, project)
        lines = self.runtime.logs(record.workload, tail=tail, follow=follow)
        if lines is None:
            return _single(
                f"agent {record.name} has no live pods right now (it scaled to zero or is not running); "
                f"read persisted logs at GET /v1/agents/{record.name}/logs/history\n"
            )
        return _with_newlines(lines)

    def _retention(self) -> timedelta:
        text = (self.settings.log_retention or "336h").strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        except (KeyError, ValueError, IndexError):
            return timedelta(days=14)

    async def log_history(self, principal: Principal, name: str, project: str | None, limit: Any, since: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        if limit in (None, ""):
            count = LOG_HISTORY_DEFAULT
        else:
            try:
                count = int(limit)
            except (TypeError, ValueError):
                raise BadRequest("limit must be a positive integer") from None
            if count < 1:
                raise BadRequest("limit must be a positive integer")
        floor = self.clock.now() - self._retention()
        if since not in (None, ""):
            try:
                parsed = datetime.fromisoformat(str(since).replace("Z", "+00:00").replace(" ", "+"))
            except ValueError:
                raise BadRequest("since must be an RFC 3339 timestamp, e.g. 2026-01-01T00:00:00Z") from None
            if parsed.tzinfo is None:
                raise BadRequest("since must be an RFC 3339 timestamp, e.g. 2026-01-01T00:00:00Z")
            floor = max(floor, parsed)
        lines = await self.runtime.log_history(record.workload, since=floor, limit=count)
        body = [
            {"ts": rfc3339(line.ts), "revision": line.revision, "pod": line.pod, "stream": line.stream, "message": line.message}
            for line in lines if line.ts >= floor
        ]
        return {"agent": record.name, "lines": body, "count": len(body),
                "note": HISTORY_NOTE.format(retention=self.settings.log_retention)}

    # == stored source files =========================================================================

    async def list_files(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        rows = await self.db.run(lambda s: [
            {"path": f.path, "size": f.size, "updated_at": rfc3339(f.updated_at)}
            for f in s.scalars(select(AgentFile).where(AgentFile.agent_id == record.id).order_by(AgentFile.path))
        ])
        return {"agent": record.name, "agent_id": record.id, "files": rows, "editable": True, "note": FILES_NOTE}

    async def read_file(self, principal: Principal, name: str, project: str | None, path: str) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        row = await self.db.run(lambda s: (lambda f: None if f is None else (f.content, f.updated_at))(s.get(AgentFile, (record.id, clean))))
        if row is None:
            raise NotFound(f"file {clean} not found")
        content, updated_at = row
        return {"path": clean, "content": content.decode("utf-8", errors="replace"), "updated_at": rfc3339(updated_at)}

    async def write_file(self, principal: Principal, name: str, project: str | None, path: str, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, str):
            raise BadRequest("'content' is required and must be a string")
        data = content.encode()
        now = self.clock.now()

        def run(session: Session) -> None:
            files = {f.path: f.content for f in session.scalars(select(AgentFile).where(AgentFile.agent_id == record.id))}
            files[clean] = data
            agent_source.check_limits(files)
            session.merge(AgentFile(agent_id=record.id, path=clean, content=data, size=len(data), updated_at=now))
            self.audit.record(session, record.project.id, principal, "agent.file.write", f"{record.name}/{clean}", {"bytes": len(data)})

        await self.db.run(run)
        return {"path": clean, "bytes": len(data), "note": FILE_NOTE.format(name=record.name)}

    async def delete_file(self, principal: Principal, name: str, project: str | None, path: str) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)

        def run(session: Session) -> None:
            row = session.get(AgentFile, (record.id, clean))
            if row is None:
                raise NotFound(f"file {clean} not found")
            session.delete(row)
            self.audit.record(session, record.project.id, principal, "agent.file.delete", f"{record.name}/{clean}")

        await self.db.run(run)
        return {"deleted": clean}


async def _single(text: str) -> AsyncIterator[str]:
    yield text


async def _with_newlines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line if line.endswith("\n") else line + "\n"
