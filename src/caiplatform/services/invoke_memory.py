"""Agents' long-term memory over the vector-engine port: `memorize` commits a session, later turns recall.

- One collection per agent, `mem_<project-short>_<agent>`, created on the first commit with the
  embedding width. Deleting the agent drops it (`forget`).
- A session is committed as one memory per exchange (the user's text and the agent's answer, thinking
  and tool traffic left out). Point ids are UUIDv5 of (project, agent, session, exchange number), so
  memorizing a session again replaces its memories instead of duplicating them.
- Memory is shared: no per-caller partition (document 1), so recall searches the whole collection. The
  payload keeps `user_id` and `session_id` so a per-user erase finds them (`forget_user`, issue 37).
- Embeddings come from `EMBED_BASE_URL` (OpenAI-compatible `/embeddings`) when the platform has one,
  otherwise from the deterministic local embedder (`caiplatform.embeddings`).
- Recall never fails a turn: an unreachable embedder or a missing collection recalls nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from caiplatform.domain.erasure import memory_filter
from caiplatform.embeddings import DEFAULT_DIMS, local_embed
from caiplatform.errors import Unavailable
from caiplatform.ports.vector import CollectionConfig, Point, VectorEngine, VectorEngineRejected
from caiplatform.services.agent_directory import InvokeTarget

log = logging.getLogger(__name__)

MEMORY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://caiplatform.dev/agent-memory")
RECALL_TOP_K = 3
RECALL_MIN_SCORE = 0.15
MEMORY_TEXT_CHARS = 4000
SCROLL_PAGE = 256


def collection_for(target: InvokeTarget) -> str:
    return f"mem_{target.project_short}_{target.agent}"


def _texts(event: dict[str, Any]) -> str:
    parts = (event.get("content") or {}).get("parts") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought"))


def exchanges(events: Sequence[dict[str, Any]]) -> list[str]:
    """The session as memories: `User: ...` plus the agent's answer, one text per exchange."""
    found: list[list[str]] = []
    for event in events:
        text = _texts(event).strip()
        if not text:
            continue  # thinking, tool calls and tool results are not remembered
        if event.get("author") == "user":
            found.append([f"User: {text}"])
        elif found:
            found[-1].append(f"Assistant: {text}")
    return ["\n".join(lines)[:MEMORY_TEXT_CHARS] for lines in found]


class Embedder:
    """Texts to vectors: an OpenAI-compatible endpoint, or the local embedder."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, model: str = "default",
                 dims: int = DEFAULT_DIMS):
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api_key = api_key
        self.model = model
        self.dims = dims

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not self.base_url:
            return local_embed(texts, self.dims)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{self.base_url}/embeddings", json={"model": self.model, "input": texts},
                                         headers=headers)
            response.raise_for_status()
            data = sorted(response.json()["data"], key=lambda d: d.get("index", 0))
        return [list(map(float, item["embedding"])) for item in data]


class VectorMemory:
    """`AgentMemory` (see `caiplatform.services.invoke`) on the vector-engine port."""

    def __init__(self, engine: Callable[[], VectorEngine], embedder: Embedder | None = None, *,
                 top_k: int = RECALL_TOP_K, min_score: float = RECALL_MIN_SCORE,
                 ready: Callable[[], Awaitable[None]] | None = None):
        self._engine = engine
        self._ready = ready  # until the engine is open (a server answers invokes before it has opened it)
        self.embedder = embedder or Embedder()
        self.top_k = top_k
        self.min_score = min_score

    @property
    def engine(self) -> VectorEngine:
        return self._engine()

    async def _open_engine(self) -> VectorEngine:
        if self._ready is not None:
            await self._ready()
        return self.engine

    async def commit(self, target: InvokeTarget, session: dict[str, Any]) -> None:
        texts = exchanges(session.get("events") or [])
        if not texts:
            return
        try:
            vectors = await self.embedder.embed(texts)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise Unavailable(f"the embedding service failed: {exc}") from None
        name = collection_for(target)
        engine = await self._open_engine()
        if await engine.collection_info(name) is None:
            try:
                await engine.create_collection(name, CollectionConfig(dimensions=len(vectors[0])))
            except VectorEngineRejected:
                if await engine.collection_info(name) is None:  # not a lost race: a real refusal
                    raise
        session_id = str(session.get("session_id", ""))
        points = [
            Point(id=str(uuid.uuid5(MEMORY_NAMESPACE, f"{target.project_id}/{target.agent}/{session_id}/{n}")),
                  vector=vector,
                  payload={"text": text, "session_id": session_id, "user_id": str(session.get("user_id", "")),
                           "agent": target.agent})
            for n, (text, vector) in enumerate(zip(texts, vectors, strict=True))
        ]
        await engine.upsert(name, points)

    async def recall(self, target: InvokeTarget, text: str) -> list[str]:
        name = collection_for(target)
        try:
            engine = await self._open_engine()
            if await engine.collection_info(name) is None:
                return []
            (vector,) = await self.embedder.embed([text])
            hits = await engine.query(name, vector, top_k=self.top_k, score_threshold=self.min_score)
        except Exception as exc:  # noqa: BLE001 - a turn goes on without memories rather than fail
            log.warning("memory recall for %s failed: %s", target.agent, exc)
            return []
        return [str(hit.payload.get("text", "")) for hit in hits if hit.payload and hit.payload.get("text")]

    async def forget(self, target: InvokeTarget) -> None:
        await (await self._open_engine()).drop_collection(collection_for(target))

    async def forget_user(self, target: InvokeTarget, user_id: str) -> int:
        """Delete the memories the user's sessions contributed (their payload's `user_id`); how many."""
        name = collection_for(target)
        engine = await self._open_engine()
        if await engine.collection_info(name) is None:
            return 0
        ids: list[Any] = []
        offset = None
        while True:
            page, offset = await engine.scroll(name, limit=SCROLL_PAGE, offset=offset,
                                                    filter=memory_filter(user_id))
            ids += [record.id for record in page]
            if offset is None:
                break
        if ids:
            await engine.delete_points(name, ids=ids)  # one call: all or nothing
        return len(ids)
