"""A read that rides along with the credential's read: one worker-thread round trip for both.

Every request reads its credential in a worker thread (`AuthService.authenticate`); a route whose service
then makes one read of its own (the agents owner gate) paid a second round trip, which on a loaded machine
costs more than the read. A service can hand the credential resolution a `Then`: a read that runs in the
same thread, on the same connection, right after the credential resolved to a principal. The service
later takes the outcome instead of reading again, provided it was made for the same principal and the
same question; otherwise it reads as it always did. Nothing is kept past the request: both reads are made
for this request, so a deletion or a revoked grant counts on the next one as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from caiplatform.principal import Principal


class Then:
    """A read to make right after the credential's: `read(connection, principal)`, for the question `key`."""

    __slots__ = ("key", "read")

    def __init__(self, key: Hashable, read: Callable[[Connection, Principal], Any]):
        self.key = key
        self.read = read

    def run(self, connection: Connection, principal: Principal) -> Prefetched:
        try:
            return Prefetched(self.key, principal, self.read(connection, principal), None)
        except Exception as exc:  # noqa: BLE001 - raised where the service would have read
            return Prefetched(self.key, principal, None, exc)


class Prefetched:
    """What a `Then` read: its value, or the error its read raised (raised again by `result`)."""

    __slots__ = ("error", "key", "principal", "value")

    def __init__(self, key: Hashable, principal: Principal, value: Any, error: Exception | None):
        self.key = key
        self.principal = principal
        self.value = value
        self.error = error

    def answers(self, key: Hashable, principal: Principal) -> bool:
        return self.principal is principal and self.key == key

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value
