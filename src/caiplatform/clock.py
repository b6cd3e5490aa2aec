"""Time as a dependency, so that expiry paths are tested by moving a clock instead of sleeping."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta


class Clock:
    """Wall-clock time. Every service reads time through one of these."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock(Clock):
    """A clock that moves only when told to; for tests."""

    def __init__(self, start: datetime | None = None):
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.now().timestamp()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float = 0, **kwargs: float) -> None:
        delta = timedelta(seconds=seconds, **kwargs)
        with self._lock:
            self._now += delta
            self._mono += delta.total_seconds()


def rfc3339(moment: datetime) -> str:
    """The one timestamp format of every API: RFC 3339 in UTC with a `Z`."""
    if moment.tzinfo is not UTC:  # already in UTC (every datetime the database gives back): as it is
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    text = moment.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
