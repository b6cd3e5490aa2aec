"""Agents and functions: the record, its stored source, per-agent secrets, builds and revisions.

The record holds what the management routes read and write (env, compute config, embed config) and the
build claim (`build_id`, `build_claimed_at`) that keeps one build per agent across server replicas.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    # Indexed on its own: the owner gate and the invoke target look an agent up by name across projects.
    name: Mapped[str] = mapped_column(String(63), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # agent | function
    framework: Mapped[str] = mapped_column(String(32))
    runtime: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Who deployed it: "user:<id>" or "sa:<id>"; None for tokenless deploys (no recorded owner).
    owner_ref: Mapped[str | None] = mapped_column(String(64), nullable=True)
    owner_email: Mapped[str] = mapped_column(String(320), default="")
    state: Mapped[str] = mapped_column(String(16), default="building")
    message: Mapped[str] = mapped_column(Text, default="")
    image: Mapped[str] = mapped_column(Text, default="")
    latest_revision: Mapped[str] = mapped_column(String(80), default="")
    generation: Mapped[int] = mapped_column(Integer, default=0)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    embed: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    embed_key: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)
    external_url: Mapped[str] = mapped_column(Text, default="")
    # The workload key the agent's instances use to mint secret read tokens (CAI_PROJECT_KEY).
    workload_key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    workload_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The build claim: one build per agent; a claim older than 30 minutes may be taken over.
    build_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    build_claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_agents_project_name"),)


class AgentSecret(Base):
    """One key of an agent's write-only secret (set through the secrets route or by bindings)."""

    __tablename__ = "agent_secrets"
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class AgentFile(Base):
    """The stored, editable source: latest version only."""

    __tablename__ = "agent_files"
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AgentBuild(Base):
    __tablename__ = "agent_builds"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="building")  # building | succeeded | failed
    message: Mapped[str] = mapped_column(Text, default="")
    image: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The build's log lines so far (newline-ended, server paths cut), written in batches while it runs:
    # what `GET /v1/agents/{name}/logs/build` answers from any replica.
    log: Mapped[str] = mapped_column(Text, default="", server_default="")


class AgentRevision(Base):
    """A revision as the agents area rolled it; live readiness and traffic come from the runtime."""

    __tablename__ = "agent_revisions"
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer)
    image: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Set when the platform refused to run it (e.g. ExposureRefused); such a revision never serves.
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
