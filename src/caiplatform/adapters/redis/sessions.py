"""Redis session store (`redis.asyncio`), shared by every instance of an agent.

Keys under `<prefix>:<agent>:`:

- `s:<session>`  hash: user_id, created, last_update (µs since epoch), event_count, preview
- `e:<session>`  list: transcript events as JSON, in order
- `st:<session>` hash: session state, one JSON value per key
- `u`            sorted set: user id scored by first_seen
- `ls`           hash: user id to last_seen
- `us:<user>`    sorted set: the user's session ids scored by created

Every write is one Lua script, so an append and its indexes change together and the owner check is
atomic with the write. Sorted sets order equal scores by member, which matches the port's
(time, id) ordering.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from caiplatform.clock import Clock
from caiplatform.errors import Conflict, NotFound
from caiplatform.ports.sessions import (
    Forgotten,
    Listing,
    Session,
    SessionHead,
    SessionStore,
    SessionSummary,
    UserSummary,
    check_limit,
    check_offset,
    other_user_message,
    preview_of,
)

# KEYS: s, e, u, us, ls, st   ARGV: user, now, preview, must_create, n_events, events..., state k/v...
_APPEND = """
local owner = redis.call('HGET', KEYS[1], 'user_id')
local now = ARGV[2]
if owner then
  if ARGV[4] == '1' then return redis.error_reply('CAI_EXISTS') end
  if owner ~= ARGV[1] then return redis.error_reply('CAI_OTHER_USER') end
else
  redis.call('HSET', KEYS[1], 'user_id', ARGV[1], 'created', now, 'last_update', now, 'event_count', 0, 'preview', '')
  redis.call('ZADD', KEYS[4], now, ARGV[7])
  redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
end
local n = tonumber(ARGV[5])
for i = 1, n do redis.call('RPUSH', KEYS[2], ARGV[7 + i]) end
redis.call('HINCRBY', KEYS[1], 'event_count', n)
redis.call('HSET', KEYS[1], 'last_update', now)
if redis.call('HGET', KEYS[1], 'preview') == '' and ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'preview', ARGV[3])
end
local seen = redis.call('HGET', KEYS[5], ARGV[1])
if (not seen) or tonumber(seen) < tonumber(now) then redis.call('HSET', KEYS[5], ARGV[1], now) end
local k = tonumber(ARGV[6])
for i = 1, k do
  redis.call('HSET', KEYS[6], ARGV[7 + n + 2 * i - 1], ARGV[7 + n + 2 * i])
end
return {redis.call('HGET', KEYS[1], 'event_count'), redis.call('HGET', KEYS[1], 'created')}
"""

# KEYS: s, e, st, u, ls   ARGV: base ("<prefix>:<agent>:"), session id
_DELETE = """
local owner = redis.call('HGET', KEYS[1], 'user_id')
if not owner then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
local us = ARGV[1] .. 'us:' .. owner
redis.call('ZREM', us, ARGV[2])
local first = redis.call('ZRANGE', us, 0, 0, 'WITHSCORES')
if #first == 0 then
  redis.call('ZREM', KEYS[4], owner)
  redis.call('HDEL', KEYS[5], owner)
  return 1
end
redis.call('ZADD', KEYS[4], first[2], owner)
local best = 0
for _, sid in ipairs(redis.call('ZRANGE', us, 0, -1)) do
  local lu = tonumber(redis.call('HGET', ARGV[1] .. 's:' .. sid, 'last_update') or '0')
  if lu > best then best = lu end
end
redis.call('HSET', KEYS[5], owner, string.format('%d', best))
return 1
"""

# KEYS: us (the user's sessions), u, ls   ARGV: base ("<prefix>:<agent>:"), user id
_FORGET_USER = """
local sessions, events = 0, 0
for _, sid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local count = redis.call('HGET', ARGV[1] .. 's:' .. sid, 'event_count')
  if count then
    sessions = sessions + 1
    events = events + tonumber(count)
  end
  redis.call('DEL', ARGV[1] .. 's:' .. sid, ARGV[1] .. 'e:' .. sid, ARGV[1] .. 'st:' .. sid)
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
return {sessions, events}
"""


def _us(moment: datetime) -> int:
    return int(round(moment.timestamp() * 1_000_000))


def _dt(raw: Any) -> datetime:
    return datetime.fromtimestamp(int(float(raw)) / 1_000_000, tz=UTC)


class RedisSessionStore(SessionStore):
    def __init__(self, url: str | None = None, *, client: aioredis.Redis | None = None, prefix: str = "cai:sessions",
                 clock: Clock | None = None):
        self._owns_client = client is None
        if client is None:
            if url is None:
                raise ValueError("give a Redis url or client")
            client = aioredis.from_url(url, decode_responses=True)
        self.client = client
        self.prefix = prefix
        self.clock = clock or Clock()
        self._append_script = self.client.register_script(_APPEND)
        self._delete_script = self.client.register_script(_DELETE)
        self._forget_script = self.client.register_script(_FORGET_USER)

    def _base(self, agent: str) -> str:
        return f"{self.prefix}:{agent}:"

    def _keys(self, agent: str, session_id: str, user_id: str) -> list[str]:
        b = self._base(agent)
        return [f"{b}s:{session_id}", f"{b}e:{session_id}", f"{b}u", f"{b}us:{user_id}", f"{b}ls", f"{b}st:{session_id}"]

    async def _write(self, agent, user_id, session_id, events, state, must_create: bool) -> SessionHead:
        now = _us(self.clock.now())
        encoded = [json.dumps(e) for e in events]
        pairs: list[str] = []
        for key, value in (state or {}).items():
            pairs += [key, json.dumps(value)]
        args = [user_id, now, preview_of(events), "1" if must_create else "0", len(encoded), len(pairs) // 2,
                session_id, *encoded, *pairs]
        try:
            count, created = await self._append_script(keys=self._keys(agent, session_id, user_id), args=args)
        except ResponseError as exc:
            if "CAI_EXISTS" in str(exc):
                raise Conflict(f"session {session_id} already exists") from None
            if "CAI_OTHER_USER" in str(exc):
                raise Conflict(other_user_message(session_id)) from None
            raise
        return SessionHead(user_id, _dt(created), int(count))

    async def create(self, agent: str, user_id: str, session_id: str, *, state: dict[str, Any] | None = None) -> Session:
        await self._write(agent, user_id, session_id, [], state, True)
        return await self._written(agent, session_id)

    async def get(self, agent: str, session_id: str) -> Session | None:
        b = self._base(agent)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(f"{b}s:{session_id}")
            pipe.lrange(f"{b}e:{session_id}", 0, -1)
            pipe.hgetall(f"{b}st:{session_id}")
            meta, events, state = await pipe.execute()
        if not meta:
            return None
        return Session(
            agent, meta["user_id"], session_id, _dt(meta["created"]), _dt(meta["last_update"]),
            [json.loads(e) for e in events], {k: json.loads(v) for k, v in state.items()},
        )

    async def append(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]], *,
                     state: dict[str, Any] | None = None) -> Session:
        await self._write(agent, user_id, session_id, list(events), state, False)
        return await self._written(agent, session_id)

    async def claim(self, agent: str, user_id: str, session_id: str) -> SessionHead:
        key = f"{self._base(agent)}s:{session_id}"
        for _ in range(2):
            owner, created, count = await self.client.hmget(key, "user_id", "created", "event_count")
            if owner is not None:
                if owner != user_id:
                    raise Conflict(other_user_message(session_id))
                return SessionHead(owner, _dt(created), int(count or 0))
            try:
                return await self._write(agent, user_id, session_id, [], None, True)
            except Conflict:
                continue  # created by someone else in between: read it again
        raise Conflict(other_user_message(session_id))

    async def extend(self, agent: str, user_id: str, session_id: str, events: Sequence[dict[str, Any]]) -> SessionHead:
        return await self._write(agent, user_id, session_id, list(events), None, False)

    async def _written(self, agent: str, session_id: str) -> Session:
        """The session just written; `NotFound` when a delete removed it in between."""
        session = await self.get(agent, session_id)
        if session is None:
            raise NotFound(f"session {session_id} not found")
        return session

    async def list_users(self, agent: str, *, offset: int = 0, limit: int = 50) -> Listing[UserSummary]:
        check_limit(limit)
        check_offset(offset)
        b = self._base(agent)
        # The client decodes responses (decode_responses=True), which the stubs cannot see: members are str.
        rows = cast(list[tuple[str, float]], await self.client.zrange(f"{b}u", offset, offset + limit, withscores=True))
        page = rows[:limit]
        if not page:
            return Listing([], False)
        async with self.client.pipeline(transaction=False) as pipe:
            for user_id, _ in page:
                pipe.hget(f"{b}ls", user_id)
                pipe.zcard(f"{b}us:{user_id}")
            extra = await pipe.execute()
        items = [
            UserSummary(user_id, _dt(score), _dt(extra[2 * i] or score), int(extra[2 * i + 1]))
            for i, (user_id, score) in enumerate(page)
        ]
        return Listing(items, len(rows) > limit)

    async def list_sessions(self, agent: str, user_id: str, *, offset: int = 0, limit: int = 50) -> Listing[SessionSummary]:
        check_limit(limit)
        check_offset(offset)
        b = self._base(agent)
        ids = cast(list[str], await self.client.zrange(f"{b}us:{user_id}", offset, offset + limit))  # decoded: str
        page = ids[:limit]
        if not page:
            return Listing([], False)
        async with self.client.pipeline(transaction=False) as pipe:
            for sid in page:
                pipe.hmget(f"{b}s:{sid}", "created", "last_update", "event_count", "preview")
            metas = await pipe.execute()
        items = [
            SessionSummary(sid, user_id, _dt(m[0]), _dt(m[1]), int(m[2]), m[3] or "")
            for sid, m in zip(page, metas, strict=True)
            if m[0] is not None
        ]
        return Listing(items, len(ids) > limit)

    async def delete(self, agent: str, session_id: str) -> bool:
        b = self._base(agent)
        keys = [f"{b}s:{session_id}", f"{b}e:{session_id}", f"{b}st:{session_id}", f"{b}u", f"{b}ls"]
        return bool(await self._delete_script(keys=keys, args=[b, session_id]))

    async def forget_user(self, agent: str, user_id: str) -> Forgotten:
        b = self._base(agent)
        sessions, events = await self._forget_script(keys=[f"{b}us:{user_id}", f"{b}u", f"{b}ls"], args=[b, user_id])
        return Forgotten(int(sessions), int(events))

    async def purge(self) -> None:
        """Delete every key under this store's prefix (tests)."""
        async for key in self.client.scan_iter(match=f"{self.prefix}:*", count=500):
            await self.client.delete(key)

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()
