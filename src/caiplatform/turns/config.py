"""What a harness server needs around the runners: its session store and its `/debug/config` body."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from caiplatform.clock import Clock
from caiplatform.domain.spec_document import SENSITIVE_NAME
from caiplatform.ports.sessions import SessionStore
from caiplatform.turns.models import model_settings

# The spec's rule for values that must never be shown (the same one the live spec redacts with).


def open_session_store(kind: str = "sqlite", *, data_dir: str | Path | None = None, redis_url: str | None = None,
                       prefix: str = "cai:sessions", clock: Clock | None = None) -> SessionStore:
    """`memory`, `sqlite` (`<data_dir>/sessions.sqlite3`, the embedded default) or `redis`."""
    if kind == "memory":
        from caiplatform.adapters.memory.sessions import InMemorySessionStore

        return InMemorySessionStore(clock=clock)
    if kind == "sqlite":
        from caiplatform.adapters.sqlite.sessions import SQLiteSessionStore

        return SQLiteSessionStore.in_data_dir(data_dir or ".caiplatform", clock=clock)
    if kind == "redis":
        if not redis_url:
            raise ValueError("the redis session store needs a redis_url")
        from caiplatform.adapters.redis.sessions import RedisSessionStore

        return RedisSessionStore(redis_url, prefix=prefix, clock=clock)
    raise ValueError(f"unknown session store {kind!r} (memory, sqlite, redis)")


def debug_config(agent: str, framework: str, env: Mapping[str, str] | None = None,
                 config_keys: list[str] | None = None) -> dict[str, Any]:
    """The narrow `/debug/config` body: never a value, only names, and never a secret-looking name.

    `config_keys` are the agent's own configuration names (its env settings); secret-looking names
    (the spec's redaction pattern) are left out.
    """
    env = os.environ if env is None else env
    settings = model_settings(dict(env))
    keys = sorted(k for k in (config_keys or []) if not SENSITIVE_NAME.search(k))
    return {
        "agent": agent,
        "framework": framework,
        "model": settings.model,
        "model_base_url_set": bool(settings.base_url),
        "model_key_present": settings.key_present,
        "config_keys": keys,
    }
