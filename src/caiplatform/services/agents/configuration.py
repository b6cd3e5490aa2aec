"""An agent's env, secrets, compute config, logs and stored source files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from caiplatform.clock import rfc3339
from caiplatform.db.models.agents import Agent, AgentBuild, AgentFile, AgentSecret
from caiplatform.domain import agent_source
from caiplatform.domain import agents as rules
from caiplatform.errors import BadRequest, NotFound
from caiplatform.models.agents import (
    AgentConfig,
    AgentEnv,
    ComputeConfig,
    ConfigPatch,
    ConfigUpdated,
    EnvPatch,
    EnvUpdated,
    LogHistory,
    LogLine,
    SecretKeys,
    SecretsPatch,
    SecretsReplace,
    SecretsUpdated,
    SourceFile,
    SourceFileDeleted,
    SourceFileEntry,
    SourceFiles,
    SourceFileWrite,
    SourceFileWritten,
)
from caiplatform.principal import Principal
from caiplatform.services.agents.builds import AgentBuilds
from caiplatform.services.agents.records import (
    FILE_NOTE,
    FILES_NOTE,
    HISTORY_NOTE,
    LOG_HISTORY_DEFAULT,
)

log = logging.getLogger(__name__)
#: how often a follower of a build's log reads it again, and for how long at most
BUILD_LOG_POLL_SECONDS = 0.25
BUILD_LOG_FOLLOW_LIMIT = 3600.0


class AgentConfiguration(AgentBuilds):
    """What an owner edits and reads besides the code: env, secrets, compute config, logs, stored files."""

    # == env and secrets =============================================================================

    async def get_env(self, principal: Principal, name: str, project: str | None) -> AgentEnv:
        record = await self._locate(principal, name, project)
        return AgentEnv(agent=record.name, env=record.env)

    async def patch_env(self, principal: Principal, name: str, project: str | None, patch: EnvPatch) -> EnvUpdated:
        record = await self._locate(principal, name, project)
        values, remove = patch.values(), patch.remove

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
        return EnvUpdated(agent=record.name, env_updated=True, env=env)

    async def secret_keys(self, principal: Principal, name: str, project: str | None) -> SecretKeys:
        record = await self._locate(principal, name, project)
        keys = await self.db.run(lambda s: sorted(s.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id))))
        return SecretKeys(agent=record.name, keys=keys)

    async def put_secrets(self, principal: Principal, name: str, project: str | None,
                          secrets: SecretsReplace) -> SecretsUpdated:
        record = await self._locate(principal, name, project)
        values = secrets.values()

        def run(session: Session) -> None:
            session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id))
            for key, value in values.items():
                session.add(AgentSecret(agent_id=record.id, key=key, value=self.db.seal_secret(value)))
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"secrets_replaced": sorted(values)})

        await self.db.run(run)
        await self._roll(record.id, "secrets")
        return SecretsUpdated(agent=record.name, secrets_updated=True)

    async def patch_secrets(self, principal: Principal, name: str, project: str | None,
                            patch: SecretsPatch) -> SecretsUpdated:
        record = await self._locate(principal, name, project)
        values, remove = patch.values(), patch.remove

        def run(session: Session) -> list[str]:
            drop = set(remove) | {k for k, v in values.items() if v == ""}
            if drop:
                session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id, AgentSecret.key.in_(drop)))
            for key, value in values.items():
                if value != "":
                    session.merge(AgentSecret(agent_id=record.id, key=key, value=self.db.seal_secret(value)))
            session.flush()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name,
                              {"secrets_set": sorted(k for k, v in values.items() if v), "secrets_remove": sorted(drop)})
            return sorted(session.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id)))

        keys = await self.db.run(run)
        await self._roll(record.id, "secrets")
        return SecretsUpdated(agent=record.name, secrets_updated=True, keys=keys)

    # == config ======================================================================================

    async def get_config(self, principal: Principal, name: str, project: str | None) -> AgentConfig:
        record = await self._locate(principal, name, project)
        return AgentConfig(agent=record.name, config=ComputeConfig.of(record.config) if record.config else None)

    async def patch_config(self, principal: Principal, name: str, project: str | None, patch: ConfigPatch) -> ConfigUpdated:
        record = await self._locate(principal, name, project)
        merged = rules.merge_config(record.config, patch.changes())

        def run(session: Session) -> None:
            agent = self._agent_sync(session, record)
            agent.config, agent.updated_at = merged, self.clock.now()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"config": merged})

        await self.db.run(run)
        await self._roll(record.id, "config")
        return ConfigUpdated(agent=record.name, config_updated=True, config=ComputeConfig.of(merged) if merged else None)

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

    async def build_log(self, principal: Principal, name: str, project: str | None, *,
                        follow: bool = False) -> AsyncIterator[str]:
        """The lines of the agent's latest build so far; with `follow`, then each line as it is stored,
        until the build ends (or `BUILD_LOG_FOLLOW_LIMIT`)."""
        record = await self._locate(principal, name, project)

        def latest(session: Session) -> tuple[str, str, bool] | None:
            agent = session.get(Agent, record.id)
            build = session.get(AgentBuild, agent.build_id) if agent is not None and agent.build_id else None
            if build is None:
                return None
            return build.id, build.log or "", build.state != "building"

        first = await self.db.read_session(latest)
        if first is None:
            return _single(f"agent {record.name} has no build yet\n")
        build_id, text, done = first

        async def lines() -> AsyncIterator[str]:
            nonlocal text, done
            offset = len(text)
            if text:
                yield text
            deadline = asyncio.get_running_loop().time() + BUILD_LOG_FOLLOW_LIMIT
            while follow and not done and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(BUILD_LOG_POLL_SECONDS)

                def more(session: Session, start: int = offset) -> tuple[str, bool]:
                    build = session.get(AgentBuild, build_id)
                    if build is None:  # the agent was deleted
                        return "", True
                    return (build.log or "")[start:], build.state != "building"

                text, done = await self.db.read_session(more)
                offset += len(text)
                if text:
                    yield text

        return lines()

    def _retention(self) -> timedelta:
        text = (self.settings.log_retention or "336h").strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        except (KeyError, ValueError, IndexError):
            return timedelta(days=14)

    async def log_history(self, principal: Principal, name: str, project: str | None, limit: int | str | None = None,
                          since: str | datetime | None = None) -> LogHistory:
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
            LogLine(ts=rfc3339(line.ts), revision=line.revision, pod=line.pod, stream=line.stream, message=line.message)
            for line in lines if line.ts >= floor
        ]
        return LogHistory(agent=record.name, lines=body, count=len(body),
                          note=HISTORY_NOTE.format(retention=self.settings.log_retention))

    # == stored source files =========================================================================

    async def list_files(self, principal: Principal, name: str, project: str | None) -> SourceFiles:
        record = await self._locate(principal, name, project)
        rows = await self.db.run(lambda s: [
            SourceFileEntry(path=f.path, size=f.size, updated_at=rfc3339(f.updated_at))
            for f in s.scalars(select(AgentFile).where(AgentFile.agent_id == record.id).order_by(AgentFile.path))
        ])
        return SourceFiles(agent=record.name, agent_id=record.id, files=rows, editable=True, note=FILES_NOTE)

    async def read_file(self, principal: Principal, name: str, project: str | None, path: str) -> SourceFile:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        row = await self.db.run(lambda s: (lambda f: None if f is None else (f.content, f.updated_at))(s.get(AgentFile, (record.id, clean))))
        if row is None:
            raise NotFound(f"file {clean} not found")
        content, updated_at = row
        return SourceFile(path=clean, content=content.decode("utf-8", errors="replace"), updated_at=rfc3339(updated_at))

    async def write_file(self, principal: Principal, name: str, project: str | None, path: str,
                         file: SourceFileWrite) -> SourceFileWritten:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        data = file.content.encode()
        now = self.clock.now()

        def run(session: Session) -> None:
            files = {f.path: f.content for f in session.scalars(select(AgentFile).where(AgentFile.agent_id == record.id))}
            files[clean] = data
            agent_source.check_limits(files)
            session.merge(AgentFile(agent_id=record.id, path=clean, content=data, size=len(data), updated_at=now))
            self.audit.record(session, record.project.id, principal, "agent.file.write", f"{record.name}/{clean}", {"bytes": len(data)})

        await self.db.run(run)
        return SourceFileWritten(path=clean, bytes=len(data), note=FILE_NOTE.format(name=record.name))

    async def delete_file(self, principal: Principal, name: str, project: str | None, path: str) -> SourceFileDeleted:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)

        def run(session: Session) -> None:
            row = session.get(AgentFile, (record.id, clean))
            if row is None:
                raise NotFound(f"file {clean} not found")
            session.delete(row)
            self.audit.record(session, record.project.id, principal, "agent.file.delete", f"{record.name}/{clean}")

        await self.db.run(run)
        return SourceFileDeleted(deleted=clean)


async def _single(text: str) -> AsyncIterator[str]:
    yield text


async def _with_newlines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line if line.endswith("\n") else line + "\n"
