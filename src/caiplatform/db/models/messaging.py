"""Messaging topics and subscriptions: the platform's record of what it created on the broker.

The broker (JetStream) holds the messages, the consumers' positions and the counters; these rows hold
the API's fields, the storage claim (`max_bytes_value`, summed against the project budget) and the phase.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from caiplatform.db.base import Base, UTCDateTime, new_id


class MessagingTopic(Base):
    __tablename__ = "messaging_topics"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    display_name: Mapped[str] = mapped_column(String(1024), default="")
    max_bytes: Mapped[str] = mapped_column(String(64))
    max_bytes_value: Mapped[int] = mapped_column(BigInteger)
    max_age_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    discard: Mapped[str] = mapped_column(String(8))
    phase: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (
        UniqueConstraint("project_id", "name", name="uq_messaging_topics_project_name"),
        CheckConstraint("discard IN ('old', 'new')", name="discard"),
        CheckConstraint("max_bytes_value > 0", name="max_bytes_positive"),
    )


class MessagingSubscription(Base):
    __tablename__ = "messaging_subscriptions"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    topic_id: Mapped[str] = mapped_column(ForeignKey("messaging_topics.id", ondelete="CASCADE"))
    topic_name: Mapped[str] = mapped_column(String(63))
    name: Mapped[str] = mapped_column(String(63))
    display_name: Mapped[str] = mapped_column(String(1024), default="")
    type: Mapped[str] = mapped_column(String(16))
    ack_deadline_seconds: Mapped[int] = mapped_column(Integer)
    max_deliver: Mapped[int] = mapped_column(Integer, default=0)
    start_from: Mapped[str] = mapped_column(String(8))
    max_ack_pending: Mapped[int] = mapped_column(Integer)
    deliver_mode: Mapped[str] = mapped_column(String(8))
    push_url: Mapped[str] = mapped_column(String(2048), default="")
    content_mode: Mapped[str] = mapped_column(String(32))
    dead_letter_topic: Mapped[str] = mapped_column(String(63), default="")
    dead_letter_after_attempts: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    __table_args__ = (
        UniqueConstraint("topic_id", "name", name="uq_messaging_subscriptions_topic_name"),
        CheckConstraint("type IN ('shared', 'key-shared', 'exclusive', 'failover')", name="type"),
        CheckConstraint("deliver_mode IN ('pull', 'push')", name="deliver_mode"),
        Index("ix_messaging_subscriptions_mode", "deliver_mode"),
    )
