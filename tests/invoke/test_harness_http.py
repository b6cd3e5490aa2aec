"""The platform's HTTP/1.1 client to harnesses (`caiplatform.web.harness_http`) against a raw
loopback server that answers with exactly the bytes each test gives it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from caiplatform.web.harness_http import HarnessClient, RemoteProtocolError

Answer = Callable[[bytes], bytes | None]  # request head + body -> the bytes to send (None: close at once)


class RawServer:
    def __init__(self, answers: list[Answer]):
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.answers.pop(0)(request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def fixed(data: bytes) -> Answer:
    return lambda _request: data


async def _get(client: HarnessClient, url: str, **kwargs: object) -> tuple[int, dict[str, str], list[bytes]]:
    response = await client.request("POST", url, **kwargs)  # type: ignore[arg-type]
    try:
        return response.status_code, dict(response.headers), [piece async for piece in response.chunks()]
    finally:
        await response.aclose()


async def test_length_chunked_and_close_framed_bodies_and_the_request_sent() -> None:
    answers = [
        fixed(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": true}"),
        fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"6\r\nline1\n\r\n6;ext=1\r\nline2\n\r\n0\r\nTrailer: x\r\n\r\n"),
        fixed(b"HTTP/1.0 502 Bad Gateway\r\n\r\nno framing"),
    ]
    async with RawServer(answers) as server:
        client = HarnessClient()
        status, headers, body = await _get(client, server.url + "/invoke", content=b'{"m":1}',
                                           headers={"X-CAI-Session-Id": "s1"}, params={"page_size": 5})
        assert (status, headers["content-type"], b"".join(body)) == (200, "application/json", b'{"a": true}')
        first = server.requests[0]
        assert first.startswith(b"POST /invoke?page_size=5 HTTP/1.1\r\n")
        assert b"\r\nX-CAI-Session-Id: s1\r\n" in first and b"\r\nContent-Length: 7\r\n" in first
        assert first.endswith(b'\r\n\r\n{"m":1}')

        status, _, body = await _get(client, server.url + "/invoke/stream")
        assert status == 200 and body == [b"line1\n", b"line2\n"]  # each chunk handed on as it came
        assert server.connections == 1  # both on one kept-alive connection

        status, _, body = await _get(client, server.url + "/x")
        assert (status, b"".join(body)) == (502, b"no framing")
        await client.aclose()


async def test_a_kept_alive_connection_closed_unanswered_is_replaced_and_the_request_sent_again() -> None:
    ok = fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with RawServer([ok, lambda _r: None, ok]) as server:
        client = HarnessClient()
        assert (await _get(client, server.url + "/a"))[2] == [b"ok"]
        # the server reads the next request on the kept-alive connection and closes without a byte
        assert (await _get(client, server.url + "/b"))[2] == [b"ok"]
        assert server.connections == 2
        assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/b"]
        await client.aclose()


async def test_a_fresh_connection_closed_without_an_answer_or_mid_body_is_an_error() -> None:
    async with RawServer([lambda _r: None]) as server:
        client = HarnessClient()
        with pytest.raises(RemoteProtocolError):
            await client.request("POST", server.url + "/a")
    truncated = fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc")
    async with RawServer([truncated]) as server:
        client = HarnessClient()
        response = await client.request("POST", server.url + "/a")
        with pytest.raises(RemoteProtocolError):
            await response.aread()
        await response.aclose()
        await client.aclose()


async def test_a_body_left_unread_does_not_go_back_to_the_pool() -> None:
    big = fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd")
    async with RawServer([big, big]) as server:
        client = HarnessClient()
        response = await client.request("POST", server.url + "/a")
        await response.aclose()  # unread: the connection is closed, not reused
        assert (await _get(client, server.url + "/b"))[2] == [b"abcd"]
        assert server.connections == 2
        await client.aclose()


async def test_header_values_cannot_add_lines_to_the_request() -> None:
    with pytest.raises(ValueError):
        await HarnessClient().request("POST", "http://127.0.0.1:9/a", headers={"X-A": "1\r\nX-B: 2"})
