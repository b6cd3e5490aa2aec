"""Secret bindings: stored secret X arrives as environment variable Y on agent Z.

Secret values and versions live in the secret store (`ports.secrets`); only the bindings are relational.
The 19 platform-reserved environment names are refused here too, by a CHECK constraint, so that no
path around the API can bind one.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id

#: Environment names the platform sets itself; a binding may never target one (document 2).
RESERVED_ENV_NAMES: tuple[str, ...] = (
    "MODEL_API_KEY",
    "MODEL_BASE_URL",
    "EMBED_BASE_URL",
    "SANDBOX_URL",
    "VALKEY_ADDR",
    "QDRANT_URL",
    "AGENT_NAME",
    "AGENT_IMAGE",
    "TOOL_SANDBOX",
    "BAO_ADDR",
    "BAO_TOKEN",
    "NATS_URL",
    "NATS_PASSWORD",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "PYTHONPATH",
)

RESERVED_ENV_CHECK = "env_name NOT IN (" + ", ".join(f"'{n}'" for n in RESERVED_ENV_NAMES) + ")"


class SecretBinding(Base):
    __tablename__ = "secret_bindings"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    # The agent lives in the agents area; its id and name are copied here (no foreign key across areas).
    agent_id: Mapped[str] = mapped_column(String(36))
    agent_slug: Mapped[str] = mapped_column(String(63))
    env_name: Mapped[str] = mapped_column(String(255))
    secret_name: Mapped[str] = mapped_column(String(63))
    # None tracks the newest version; otherwise the pinned version.
    version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (
        UniqueConstraint("agent_id", "env_name", name="uq_secret_bindings_agent_env"),
        CheckConstraint(RESERVED_ENV_CHECK, name="env_not_reserved"),
        CheckConstraint("version IS NULL OR version >= 1", name="version_positive"),
        Index("ix_secret_bindings_project_secret", "project_id", "secret_name"),
    )
