"""Vector indexes: the platform's record of each index; the points live in the vector engine."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class VectorIndex(Base):
    __tablename__ = "vector_indexes"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(48))
    # `p_<short>_<name>`: the engine's collection, derived at create and never changed.
    collection: Mapped[str] = mapped_column(String(120), unique=True)
    dimensions: Mapped[int] = mapped_column(Integer)
    distance: Mapped[str] = mapped_column(String(8))
    on_disk: Mapped[bool] = mapped_column(Boolean, default=False)
    payload_on_disk: Mapped[bool] = mapped_column(Boolean, default=False)
    # `{kind, quantile?, always_ram}`
    quantization: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    shards: Mapped[int] = mapped_column(Integer, default=1)
    replicas: Mapped[int] = mapped_column(Integer, default=1)
    # Qdrant's knobs create set (an extension of document 3): `{hnsw_config?: {...}, indexing_threshold?}`
    engine_settings: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_vector_indexes_project_name"),)
