"""Memory store instances of a platform whose replicas share one PostgreSQL database.

The local provisioner of a single replica keeps each instance's record in its data dir; replicas keep
it here, so that every replica can read, rotate and delete an instance and one can run it
(`caiplatform.adapters.local.memorystore_cluster`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class MemoryStoreInstance(Base):
    __tablename__ = "memorystore_instances"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(40))
    # `InstanceSpec.to_json()`: what was asked for at create.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The instance's folder (config, data, log): in the data dir of the replica that created it; a replica
    # taking it over serves the same folder (the same machine, or a volume mounted at the same path).
    folder: Mapped[str] = mapped_column(Text)
    # The password in force and the one a rotation left pending until the next restart.
    password: Mapped[str] = mapped_column(Text)
    pending_password: Mapped[str | None] = mapped_column(Text, nullable=True)
    host: Mapped[str] = mapped_column(String(64))
    port: Mapped[int] = mapped_column(Integer)
    # The replica that runs it now ("" while nobody does) and what it observed last.
    owner: Mapped[str] = mapped_column(String(100), default="")
    state: Mapped[str] = mapped_column(String(16), default="Provisioning")
    message: Mapped[str] = mapped_column(Text, default="")
    transitions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Restarts asked for (a rotation's restart, an admin restart): the owner restarts when it has applied fewer.
    restart_seq: Mapped[int] = mapped_column(Integer, default=0)
    applied_restart_seq: Mapped[int] = mapped_column(Integer, default=0)
    # Deleted through a replica that does not run it: the owner destroys it and removes the row.
    deleting: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_memorystore_instances_project_name"),)
