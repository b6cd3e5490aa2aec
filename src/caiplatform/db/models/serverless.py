"""Serverless services, their immutable revisions, triggers and trigger runs.

The service row holds the accepted spec (`spec`, the create fields with defaults applied) and the
generation counters; the runtime holds what runs. Revisions are kept here too, so that a restart of
the platform can hand the runtime back exactly what was accepted.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class ServerlessService(Base):
    __tablename__ = "serverless_services"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(52))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Bumped by every accepted change (create = 1); `observed_generation` once the runtime has it.
    generation: Mapped[int] = mapped_column(Integer, default=1)
    observed_generation: Mapped[int] = mapped_column(Integer, default=0)
    # The number of the newest revision (`<name>-00003` → 3).
    latest_revision: Mapped[int] = mapped_column(Integer, default=0)
    # Set when the runtime refused the newest change (`Invalid` phase), cleared by the next success.
    apply_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_serverless_services_project_name"),)


class ServerlessRevision(Base):
    __tablename__ = "serverless_revisions"
    service_id: Mapped[str] = mapped_column(ForeignKey("serverless_services.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    image: Mapped[str] = mapped_column(String(500))
    # The revision template (ServiceSpec.template()) it was made from: immutable.
    template: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Why the platform could not hand it to the runtime (e.g. an image the local runtime cannot pull).
    reason: Mapped[str] = mapped_column(String(100), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ServerlessTrigger(Base):
    __tablename__ = "serverless_triggers"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    target: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    message: Mapped[str] = mapped_column(Text, default="")
    # Schedule triggers fire occurrences strictly after this instant (moved on by every claim).
    schedule_from: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_serverless_triggers_project_name"),)


class ServerlessTriggerRun(Base):
    __tablename__ = "serverless_trigger_runs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    trigger_id: Mapped[str] = mapped_column(ForeignKey("serverless_triggers.id", ondelete="CASCADE"))
    # What fired it: the schedule occurrence, or the event id; unique per trigger so that several
    # server replicas claim each occurrence exactly once.
    occurrence: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | succeeded | failed
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (UniqueConstraint("trigger_id", "occurrence", name="uq_serverless_trigger_runs_occurrence"),)
