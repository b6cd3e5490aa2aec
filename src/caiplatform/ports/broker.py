"""The broker port: streams of messages with durable consumers, the JetStream model.

A stream keeps messages on one subject within limits (`max_bytes`, `max_age`, `discard` old or new) for
as long as some consumer owes an acknowledgement (interest retention). A durable consumer hands each
message to one of its readers, redelivers what is not acknowledged within `ack_wait`, keeps at most
`max_ack_pending` unacknowledged, and counts deliveries. Acknowledgement tokens are strings that work
from any connection to the broker, so any API replica can acknowledge what another handed out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from caiplatform.domain.projects import ProjectRef


class BrokerError(Exception):
    """The broker refused or failed an operation."""


class BrokerUnavailable(BrokerError):
    """The broker did not answer (stopped, restarting, unreachable): nothing was done, try again later."""


class StreamFull(BrokerError):
    """A `discard: new` stream at its limit refused a message."""


class StreamNotFound(BrokerError):
    pass


@dataclass(frozen=True)
class BrokerCredential:
    """The direct broker credential of one project, minted by the platform (the credential route's body)."""

    token: str
    service_url: str
    external_endpoint: str | None = None
    note: str = ""


#: mints a project's broker credential (the embedded NATS server's users, an external server's, ...)
CredentialIssuer = Callable[[ProjectRef], Awaitable[BrokerCredential]]


#: Seconds a stream remembers a message's `msg_id`: a message published again with the same id within them
#: is not stored again (JetStream's `duplicate_window`, its default of two minutes).
DUPLICATE_WINDOW = 120.0


@dataclass(frozen=True)
class StreamConfig:
    name: str
    subject: str
    max_bytes: int
    max_age: float = 0.0  # seconds; 0 means no limit
    discard: str = "old"  # "old" | "new"
    duplicate_window: float = DUPLICATE_WINDOW

    @property
    def id_window(self) -> float:
        """The duplicate window a stream keeps: never longer than its `max_age` (JetStream refuses that)."""
        return min(self.duplicate_window, self.max_age) if self.max_age > 0 else self.duplicate_window


TAKEOVER_GRACE = 1.0


@dataclass(frozen=True)
class ConsumerConfig:
    stream: str
    name: str
    ack_wait: float = 30.0
    max_ack_pending: int = 1000
    deliver_new: bool = False  # start_from: new
    max_deliver: int = 0  # 0: unlimited (the pull API redelivers forever)
    # One active reader (exclusive, failover): the first process to pull is pinned and is the only one
    # served; another takes over once the pinned one has stopped pulling for `ack_wait` plus
    # `TAKEOVER_GRACE`. An adapter whose broker has no such notion (one process, or a server without
    # priority groups) relies on `max_ack_pending=1` alone, which still keeps the total order.
    single_reader: bool = False

    @property
    def takeover_after(self) -> float:
        """Seconds without a pull after which the pinned reader loses its pin: a live reader's longest
        silence is one delivery attempt (bounded by the ack deadline) between two pulls."""
        return self.ack_wait + TAKEOVER_GRACE


@dataclass(frozen=True)
class OutgoingMessage:
    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    #: De-duplication id: a message with the id of one the stream stored within its `duplicate_window` is
    #: not stored again, and its publish answers the sequence of the one stored (a retried publish).
    msg_id: str | None = None
    #: W3C trace context of the publish (`traceparent`, `tracestate`), only while tracing is on: the push
    #: delivery continues the publisher's trace (docs/observability.md "Traces").
    trace: dict[str, str] | None = None


@dataclass(frozen=True)
class Delivery:
    token: str  # acknowledges (or refuses) this delivery from any connection
    sequence: int  # stream sequence
    data: bytes
    attributes: dict[str, str]
    key: str | None
    published_at: datetime
    delivery_count: int
    trace: dict[str, str] | None = None  # the publish's W3C trace context, when it carried one


@dataclass(frozen=True)
class StreamStats:
    messages: int
    bytes: int
    consumers: int


@dataclass(frozen=True)
class ConsumerStats:
    pending: int  # not yet delivered
    ack_pending: int  # delivered, not yet acknowledged
    delivered: int  # deliveries so far (consumer sequence)
    redelivered: int  # messages delivered more than once, now unacknowledged
    waiting: int  # readers currently waiting for messages


class PublishFailed(BrokerError):
    """Some messages of a batch were stored (their sequences in `sequences`), then one failed."""

    def __init__(self, sequences: list[int], cause: BrokerError):
        super().__init__(str(cause))
        self.sequences = sequences
        self.cause = cause


class Broker(ABC):
    """Async port. Every method raises `BrokerError` (or a subclass) on refusal."""

    # streams
    @abstractmethod
    async def create_stream(self, config: StreamConfig) -> None:
        """Create, or update an existing stream to `config` (idempotent)."""

    @abstractmethod
    async def update_stream(self, config: StreamConfig) -> None: ...

    @abstractmethod
    async def delete_stream(self, name: str) -> bool: ...

    @abstractmethod
    async def stream_stats(self, name: str) -> StreamStats | None: ...

    @abstractmethod
    async def publish(self, stream: str, subject: str, messages: list[OutgoingMessage]) -> list[int]:
        """Store the messages in order; their stream sequences. `PublishFailed` after a partial write. A
        message whose `msg_id` the stream stored within its `duplicate_window` is not stored again: its
        sequence is the stored one's."""

    # consumers
    @abstractmethod
    async def create_consumer(self, config: ConsumerConfig) -> None: ...

    @abstractmethod
    async def update_consumer(self, config: ConsumerConfig) -> None: ...

    @abstractmethod
    async def delete_consumer(self, stream: str, name: str) -> bool: ...

    @abstractmethod
    async def consumer_stats(self, stream: str, name: str) -> ConsumerStats | None: ...

    @abstractmethod
    async def pull(self, stream: str, consumer: str, max_messages: int, timeout: float) -> list[Delivery]:
        """Wait up to `timeout` seconds for the first message, then return what is available (≤ max)."""

    @abstractmethod
    def token_belongs(self, token: str, stream: str, consumer: str) -> bool:
        """Whether `token` came from a delivery of this consumer (shape only; no broker round trip)."""

    @abstractmethod
    async def ack(self, tokens: list[str]) -> int:
        """Acknowledge deliveries; how many acknowledgements were sent."""

    @abstractmethod
    async def nak(self, token: str, delay: float = 0.0) -> None:
        """Refuse a delivery: redeliver it after `delay` seconds."""

    @abstractmethod
    async def term(self, token: str) -> None:
        """Give up on a delivery: never redeliver it to this consumer."""

    @abstractmethod
    async def in_progress(self, token: str) -> None:
        """Still working on a delivery: its ack deadline starts again now (JetStream's `+WPI`), so it is
        not redelivered to another reader while this one lives and works on it."""

    async def pins_single_reader(self) -> bool:
        """Whether `single_reader` consumers are pinned to one reader process by the broker (so that a
        second process gets nothing while the first keeps pulling). False: one process, or no support."""
        return False

    # lifecycle
    @abstractmethod
    async def ping(self) -> None:
        """Raise when the broker cannot be reached."""

    async def close(self) -> None:  # noqa: B027 - optional
        return None

    @property
    def address(self) -> str:
        return "memory://"


class UnavailableBroker(Broker):
    """Stands in when no broker can be used (its driver is not installed): every call says why."""

    def __init__(self, reason: str):
        self.reason = reason

    def _fail(self, *_: object, **__: object) -> None:
        raise BrokerError(self.reason)

    async def create_stream(self, config: StreamConfig) -> None:
        self._fail()

    async def update_stream(self, config: StreamConfig) -> None:
        self._fail()

    async def delete_stream(self, name: str) -> bool:
        self._fail()
        return False

    async def stream_stats(self, name: str) -> StreamStats | None:
        self._fail()
        return None

    async def publish(self, stream: str, subject: str, messages: list[OutgoingMessage]) -> list[int]:
        raise PublishFailed([], BrokerError(self.reason))

    async def create_consumer(self, config: ConsumerConfig) -> None:
        self._fail()

    async def update_consumer(self, config: ConsumerConfig) -> None:
        self._fail()

    async def delete_consumer(self, stream: str, name: str) -> bool:
        self._fail()
        return False

    async def consumer_stats(self, stream: str, name: str) -> ConsumerStats | None:
        self._fail()
        return None

    async def pull(self, stream: str, consumer: str, max_messages: int, timeout: float) -> list[Delivery]:
        self._fail()
        return []

    def token_belongs(self, token: str, stream: str, consumer: str) -> bool:
        return False

    async def ack(self, tokens: list[str]) -> int:
        self._fail()
        return 0

    async def nak(self, token: str, delay: float = 0.0) -> None:
        self._fail()

    async def term(self, token: str) -> None:
        self._fail()

    async def in_progress(self, token: str) -> None:
        self._fail()

    async def ping(self) -> None:
        self._fail()

    @property
    def address(self) -> str:
        return ""
