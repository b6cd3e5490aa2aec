"""An httpx transport to the workload runtime: requests for the private hostnames of serverless services
(`<service>.<namespace>[.svc[.cluster.local]]`) reach their instances on one machine, anything else the
network. The messaging area's push deliverer uses it, so that Pub/Sub triggers reach services
(`ServerlessService.internal_transport` makes one)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import httpx

from caiplatform.ports.runtime import WorkloadRef, WorkloadRuntime
from caiplatform.redaction import one_line

log = logging.getLogger(__name__)


class InternalTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends requests for the private hostnames of serverless services
    (`<service>.<namespace>[.svc[.cluster.local]]`) to the workload runtime, and everything else to
    the network. The messaging area's push deliverer uses it so that pubsub triggers reach services
    on one machine."""

    def __init__(self, resolve: Callable[[str], Awaitable[tuple[WorkloadRef, float, str | None] | None]],
                 runtime: WorkloadRuntime, fallback: httpx.AsyncBaseTransport | None = None,
                 on_delivery: Callable[[WorkloadRef, httpx.Headers, int | None, str], Awaitable[None]] | None = None):
        self._resolve = resolve
        self._runtime = runtime
        # Made on first use: a transport to the network loads the machine's certificates (~40 ms of CPU),
        # and one is made for every platform that serves a service, most of which never push elsewhere.
        self._fallback = fallback
        self._on_delivery = on_delivery

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        found = await self._resolve(request.url.host)
        if found is None:
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        ref, timeout, tag = found
        try:
            endpoint = await self._runtime.acquire(ref, timeout=timeout, tag=tag)
            try:
                async with endpoint.client(timeout=timeout) as client:
                    target = endpoint.base_url.rstrip("/") + request.url.raw_path.decode("ascii")
                    headers = [(k, v) for k, v in request.headers.raw
                               if k.lower() not in (b"host", b"content-length")]
                    body = await request.aread()
                    response = await client.request(request.method, target, headers=headers, content=body)
                    content = await response.aread()
            finally:
                await endpoint.release()
        except Exception as exc:
            await self._record(ref, request.headers, None, one_line(str(exc)) or type(exc).__name__)
            raise
        error = "" if 200 <= response.status_code < 300 else f"the target answered {response.status_code}"
        await self._record(ref, request.headers, response.status_code, error)
        # A stream, not `content=`: the caller may read the answer as a stream (push delivery does), and
        # a response built from content counts as already streamed. The content is decoded already.
        headers = [(k, v) for k, v in response.headers.raw
                   if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(content)).encode()))
        return httpx.Response(response.status_code, headers=headers, stream=httpx.ByteStream(content))

    async def _record(self, ref: WorkloadRef, headers: httpx.Headers, status: int | None, error: str) -> None:
        if self._on_delivery is None:
            return
        try:
            await self._on_delivery(ref, headers, status, error)
        except Exception:  # noqa: BLE001 - the runs record never fails a delivery
            log.warning("serverless: could not record a push delivery", exc_info=True)

    async def aclose(self) -> None:
        if self._fallback is not None:
            await self._fallback.aclose()
