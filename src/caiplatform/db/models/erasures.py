"""Erasures of a user (`caiplatform.services.erasures`): the request, its progress, its receipt and the
claim (`claimed_by`, `lease_until`) that keeps one replica running it at a time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class Erasure(Base):
    __tablename__ = "erasures"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[str] = mapped_column(String(128))
    # `*` (every agent of the project) or the named agents, sorted: one running erasure per user and scope.
    scope: Mapped[str] = mapped_column(Text)
    # The agents the erasure reaches, resolved when it was asked for.
    agents: Mapped[list[str]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    requested_by: Mapped[str] = mapped_column(String(320), default="")
    # One entry per finished step: {agent, store, removed: {<what>: count}, started_at, finished_at}.
    receipts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        Index("ix_erasures_state", "state"),
        Index("ix_erasures_user", "project_id", "user_id"),
        # One unfinished erasure per user and scope, even for two requests at the same moment.
        Index("uq_erasures_unfinished", "project_id", "user_id", "scope", unique=True,
              sqlite_where=text("state != 'done'"), postgresql_where=text("state != 'done'")),
    )
