"""`INFO everything` of one Redis-compatible server, as the memory store provisioners read it for stats."""

from __future__ import annotations


async def read_info(host: str, port: int, password: str, *, retry: bool = True) -> str:
    """The raw INFO text. Raises `OSError`/`ConnectionError` when the server does not answer; with
    `retry=False` a first failure is final (a snapshot that must fit the stats budget)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    options = {} if retry else {"retry": Retry(NoBackoff(), 0)}
    client = aioredis.Redis(host=host, port=port, password=password, protocol=2, socket_connect_timeout=2,
                            socket_timeout=2, **options)  # type: ignore[arg-type]
    client.set_response_callback("INFO", lambda response, **_: response)
    try:
        raw = await client.execute_command("INFO", "everything")
    finally:
        await client.aclose()
    return raw.decode() if isinstance(raw, bytes) else str(raw)
