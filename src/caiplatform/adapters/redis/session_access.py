"""Each agent's own Valkey user for its session store, when sessions live on the platform's Valkey.

In server mode (`CAI_REDIS_URL`) every agent's harness keeps its sessions in the platform's Valkey, under
`<prefix>:<project id>:<agent>:` (`RedisSessionStore`). That Valkey also holds the other projects' sessions and
the platform's own state (request limits, sign-in throttles), and a workload reaches its port. So a harness is
never handed the platform's URL: it gets a user of its own, created here with Valkey's ACL, that may touch only
its agent's keys, with only the commands the session store sends (`RedisSessionStore`: its Lua scripts and
reads), and no key-less command that would list or change anything else (`SCAN`, `KEYS`, `FLUSHALL`, `CONFIG`,
`ACL`, `PUBLISH`, ...). Valkey checks the commands a script runs and the keys it touches against the same user.

The password is derived from the platform's session key (HMAC), so every replica computes the same one and
`ensure` is idempotent (`ACL SETUSER ... reset`).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote, urlsplit, urlunsplit

from redis import asyncio as aioredis

# What `RedisSessionStore` sends: its scripts (EVALSHA, and SCRIPT LOAD when Valkey does not know them yet)
# and what they call, its pipelined reads, and what a client sends on connecting (redis-py ignores a refused
# CLIENT SETINFO, which Redis 7.0 does not know as a command to grant).
SESSION_COMMANDS = (
    "evalsha", "eval", "script|load", "script|exists",
    "hget", "hgetall", "hmget", "hset", "hdel", "hincrby", "lrange", "rpush", "zadd", "zrange", "zrem", "zcard", "del",
    "multi", "exec", "discard", "ping", "hello", "select",
)
USER_PREFIX = "cai-sessions-"


class SessionAccess:
    """Valkey users confined to one agent's session keys on the platform's Valkey at `url`."""

    def __init__(self, url: str, secret: bytes, *, prefix: str = "cai:sessions"):
        self.url = url
        self.secret = secret
        self.prefix = prefix
        self._ensured: set[str] = set()

    def username(self, project_id: str, agent: str) -> str:
        return f"{USER_PREFIX}{project_id}-{agent}"

    def key_pattern(self, project_id: str, agent: str) -> str:
        return f"{self.prefix}:{project_id}:{agent}:*"

    def _password(self, username: str) -> str:
        return hmac.new(self.secret, f"valkey-session-user/{username}".encode(), hashlib.sha256).hexdigest()

    def store_url(self, project_id: str, agent: str) -> str:
        """The platform's Valkey URL with the agent's own user in place of the platform's credentials."""
        parts = urlsplit(self.url)
        username = self.username(project_id, agent)
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{quote(username, safe='')}:{self._password(username)}@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    async def ensure(self, project_id: str, agent: str) -> None:
        """Create (or reset to exactly these rights) the agent's user; once per process and agent."""
        username = self.username(project_id, agent)
        if username in self._ensured:
            return
        client = aioredis.from_url(self.url)
        try:
            await client.execute_command(
                "ACL", "SETUSER", username, "reset", "on", f">{self._password(username)}",
                f"~{self.key_pattern(project_id, agent)}", "resetchannels", "-@all",
                *(f"+{command}" for command in SESSION_COMMANDS))
        finally:
            await client.aclose()
        self._ensured.add(username)

    async def remove(self, project_id: str, agent: str) -> None:
        """Delete the agent's user (its agent was deleted)."""
        username = self.username(project_id, agent)
        client = aioredis.from_url(self.url)
        try:
            await client.execute_command("ACL", "DELUSER", username)
        finally:
            await client.aclose()
        self._ensured.discard(username)
