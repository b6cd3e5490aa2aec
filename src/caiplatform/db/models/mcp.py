"""Hosted MCP servers, their current tool set and their immutable versions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class McpServer(Base):
    __tablename__ = "mcp_servers"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(40))
    expose: Mapped[str] = mapped_column(String(8), default="")
    status: Mapped[str] = mapped_column(String(16), default="pending")
    message: Mapped[str] = mapped_column(Text, default="")
    # The version that serves now (null until the first successful publish).
    current_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The version the `current` flag names (document 2: "`current` moves on publish or rollback"), set at
    # the publish itself; it differs from `current_version` while its build runs or once that build failed.
    selected_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    url: Mapped[str] = mapped_column(String(500), default="")
    # `cai_mcp_` + 64 hex: minted once at creation and kept across redeploys.
    token: Mapped[str] = mapped_column(String(80))
    # The `cai_wl_` key its processes present as CAI_PROJECT_KEY: minted once, kept across rollouts,
    # restarts and replicas (like an agent's); revoked with the server.
    workload_key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    workload_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The replica that runs its process now ("" while nobody does): `services/mcp_replicas.py`.
    owner: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_mcp_servers_project_name"),)


class McpTool(Base):
    __tablename__ = "mcp_tools"
    server_id: Mapped[str] = mapped_column(ForeignKey("mcp_servers.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    handler: Mapped[str] = mapped_column(Text)
    schema: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    credential_keys: Mapped[list[str]] = mapped_column(JSON, default=list)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class McpVersion(Base):
    __tablename__ = "mcp_versions"
    server_id: Mapped[str] = mapped_column(ForeignKey("mcp_servers.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[str] = mapped_column(String(36))
    # The whole tool set at publish time; a rollback serves exactly this.
    tools: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    credential_keys: Mapped[list[str]] = mapped_column(JSON, default=list)
    image: Mapped[str] = mapped_column(String(500), default="")
    image_digest: Mapped[str] = mapped_column(String(100), default="")
    yanked: Mapped[bool] = mapped_column(Boolean, default=False)
    yanked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
