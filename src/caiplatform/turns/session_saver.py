"""LangGraph's checkpointer for the harness: the live state of a bounded number of sessions.

The stored transcript is the durable record of a conversation; the checkpointer only has to carry a
session's graph state from one turn to the next inside one instance. LangGraph's `InMemorySaver` keeps
every checkpoint of every thread forever, serialized: a turn deserializes the whole message list (one
pydantic message built per stored message) and serializes it again at each step, and the memory held by
a session grows with the square of its length. `SessionSaver` keeps:

- only the latest checkpoint of a thread and its parent (older checkpoints, their blobs and writes are
  dropped when a newer one is saved), so a session holds one copy of its state;
- the values by reference (a shallow copy of lists and dicts, no serialization), so loading a
  checkpoint costs the same at turn 1 and turn 1,000;
- at most `max_threads` threads (least recently used first out). An evicted session, like any session on
  a new instance, is rebuilt from its transcript on its next turn (`caiplatform.turns.conversation`).

State history (`graph.get_state_history`) therefore only reaches back one step. A node that mutates a
message of its input state in place (instead of returning an update) now changes the kept state, as it
would within one run of the graph.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

DEFAULT_MAX_THREADS = 256


def max_live_sessions() -> int:
    """`CAI_LIVE_SESSIONS` (sessions whose state an instance keeps), default 256."""
    try:
        return max(1, int(os.environ.get("CAI_LIVE_SESSIONS") or DEFAULT_MAX_THREADS))
    except ValueError:
        return DEFAULT_MAX_THREADS


class _ByReference:
    """A serializer that does not serialize: values are kept as objects (shallow copies)."""

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        return ("ref", _copy(obj))

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        return _copy(data[1])

    # LangGraph calls the untyped pair in a few places of older versions.
    def dumps(self, obj: Any) -> Any:
        return _copy(obj)

    def loads(self, data: Any) -> Any:
        return _copy(data)


def _copy(obj: Any) -> Any:
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, dict):
        # checkpoints and metadata: small nested dicts of versions (the channel values are kept apart)
        return {k: _copy(v) if isinstance(v, (dict, list)) else v for k, v in obj.items()}
    return obj


class SessionSaver(InMemorySaver):
    def __init__(self, max_threads: int = DEFAULT_MAX_THREADS):
        super().__init__(serde=_ByReference())  # type: ignore[arg-type]
        self.max_threads = max(1, int(max_threads))
        self._threads: OrderedDict[str, None] = OrderedDict()
        self._blob_keys: dict[str, set[tuple[Any, ...]]] = {}

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> SessionSaver:
        return self  # nothing is deserialized, so there is nothing to allow

    def holds(self, thread_id: str) -> bool:
        return thread_id in self._threads

    def thread_count(self) -> int:
        return len(self._threads)

    def _touch(self, thread_id: str) -> None:
        self._threads[thread_id] = None
        self._threads.move_to_end(thread_id)
        while len(self._threads) > self.max_threads:
            oldest, _ = self._threads.popitem(last=False)
            self.delete_thread(oldest)

    def put(self, config, checkpoint, metadata, new_versions):  # type: ignore[no-untyped-def]
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"]["checkpoint_ns"]
        saved = super().put(config, checkpoint, metadata, new_versions)
        keys = self._blob_keys.setdefault(thread_id, set())
        keys.update((thread_id, checkpoint_ns, k, v) for k, v in new_versions.items())
        self._prune(thread_id, checkpoint_ns, checkpoint["id"], config["configurable"].get("checkpoint_id"), keys)
        self._touch(thread_id)
        return saved

    def _prune(self, thread_id: str, checkpoint_ns: str, latest: str, parent: str | None,
               keys: set[tuple[Any, ...]]) -> None:
        checkpoints = self.storage[thread_id][checkpoint_ns]
        keep = {latest, parent} if parent else {latest}
        for old in [c for c in checkpoints if c not in keep]:
            del checkpoints[old]
            self.writes.pop((thread_id, checkpoint_ns, old), None)
        live: set[tuple[Any, ...]] = set()
        for kept in keep:
            entry = checkpoints.get(kept)
            if entry is not None:
                versions = entry[0][1].get("channel_versions", {})
                live.update((thread_id, checkpoint_ns, k, v) for k, v in versions.items())
        for key in [k for k in keys if k[1] == checkpoint_ns and k not in live]:
            keys.discard(key)
            self.blobs.pop(key, None)

    def delete_thread(self, thread_id: str) -> None:
        self.storage.pop(thread_id, None)
        for key in self._blob_keys.pop(thread_id, set()):
            self.blobs.pop(key, None)
        for key in [k for k in self.writes if k[0] == thread_id]:
            del self.writes[key]
        self._threads.pop(thread_id, None)

