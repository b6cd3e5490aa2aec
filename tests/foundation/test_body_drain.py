"""A body refused for its size is read to its end first (up to a bound), so that a client still sending it
reads the 413 rather than a reset connection: a workload's request crosses pasta, whose buffers are smaller
than loopback's, and a 1 MiB tool call refused at once was seen as `RemoteDisconnected` by the caller."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from caiplatform.errors import PayloadTooLarge
from caiplatform_server.http import DRAIN_LIMIT, read_body


def request_of(declared: int, chunks: list[bytes]) -> tuple[Request, list[int]]:
    left = list(chunks)
    received: list[int] = []

    async def receive() -> dict:
        chunk = left.pop(0) if left else b""
        received.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": bool(left)}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", str(declared).encode())]}
    return Request(scope, receive), received


@pytest.mark.parametrize("honest", [True, False])
async def test_a_refused_body_is_read_to_its_end_before_the_answer(honest: bool):
    chunks = [b"y" * 65536] * 20  # 1.25 MiB against a 1 MiB limit
    request, received = request_of(sum(map(len, chunks)) if honest else 10, chunks)
    with pytest.raises(PayloadTooLarge):
        await read_body(request, 1024 * 1024)
    assert sum(received) == sum(map(len, chunks))  # all of it was read (and dropped)


async def test_a_body_larger_than_the_drain_bound_is_answered_at_once():
    request, received = request_of(DRAIN_LIMIT + 1, [b"y" * 65536] * 4)
    with pytest.raises(PayloadTooLarge):
        await read_body(request, 1024)
    assert received == []
