# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""`Client`: the platform over HTTP, with the models the services themselves take and return.

The sync `Client` in `caiplatform/client/_sync/client.py` is generated from this file
(`python -m caiplatform.client.generate`); edit this one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from caiplatform.client import _base
from caiplatform.client._sync.resources import Resources
from caiplatform.client._base import NOT_GIVEN, NotGiven
from caiplatform.client._errors import APIConnectionError, APITimeoutError, error_from_response
from caiplatform.models.base import ListPage

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P", bound=ListPage)


class Client(Resources):
    """`Client(base_url=..., token=... | api_key=...)`; defaults from `CAI_BASE_URL`, `CAI_TOKEN`,
    `CAI_API_KEY`, then the login stored by `caiplatform login`. `transport` replaces the network (an
    `httpx.MockTransport`, a recorded cassette); `Client.in_process(platform)` serves an in-process
    platform's app."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        api_key: str | None = None,
        timeout: float | None = _base.DEFAULT_TIMEOUT,
        max_retries: int = _base.DEFAULT_MAX_RETRIES,
        retry_budget: float = _base.DEFAULT_RETRY_BUDGET,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url, credential = _base.resolve(base_url, token, api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_budget = retry_budget
        auth = {"Authorization": f"Bearer {credential}"} if credential else {}
        self._http = httpx.Client(base_url=self.base_url, transport=transport, timeout=timeout,
                                       headers={**auth, **(headers or {})})
        self._attach_resources()

    @classmethod
    def in_process(cls, platform: Any, *, token: str | None = None, **kwargs: Any) -> Client:
        """A client of an in-process platform (`Platform.in_memory()`): the same calls, no server."""
        from caiplatform.client.in_process import sync_transport

        return cls(_base.IN_PROCESS_URL, token=token, transport=sync_transport(platform), **kwargs)

    def with_token(self, token: str) -> None:
        """Use `token` from now on (what `auth.login` does with the session it gets)."""
        self._http.headers["Authorization"] = f"Bearer {token}"

    # -- the one place that sends ------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        data: dict[str, Any] | None = None,
        files: dict[str, Any] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None | NotGiven = NOT_GIVEN,
        stream: bool = False,
    ) -> httpx.Response:
        request = self._http.build_request(
            method, path, params=_base.query(params), json=json, data=data, files=files, content=content,
            headers=headers, timeout=_base.timeout_of(timeout, self.timeout))
        waited = 0.0
        attempt = 0
        while True:
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                raise APITimeoutError(f"no answer from {self.base_url} in time: {exc}") from exc
            except httpx.TransportError as exc:
                raise APIConnectionError(f"could not reach {self.base_url}: {exc}") from exc
            if response.is_success:
                return response
            delay = _base.retry_delay(response, attempt)
            if (not _base.should_retry(response) or attempt >= self.max_retries
                    or waited + delay > self.retry_budget):
                response.read()
                raise error_from_response(response)
            response.close()
            time.sleep(delay)
            waited += delay
            attempt += 1

    def request(self, method: str, path: str, cast_to: type[M], **kwargs: Any) -> M:
        response = self._send(method, path, **kwargs)
        return cast_to.model_validate_json(response.content)

    def request_by_status(self, method: str, path: str, cast_to: dict[int, type[BaseModel]],
                                **kwargs: Any) -> Any:
        """An operation whose successes differ by status (a 207 partial answer): the status's model."""
        response = self._send(method, path, **kwargs)
        model = cast_to.get(response.status_code) or next(iter(cast_to.values()))
        return model.model_validate_json(response.content)

    def request_none(self, method: str, path: str, **kwargs: Any) -> None:
        self._send(method, path, **kwargs)

    def request_text(self, method: str, path: str, **kwargs: Any) -> str:
        """A text answer (a YAML spec, a log, a script)."""
        return (self._send(method, path, **kwargs)).text

    def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """An answer whose shape is the caller's own data (a config map, a file, an agent's reply)."""
        return (self._send(method, path, **kwargs)).json()

    def stream_lines(self, method: str, path: str, **kwargs: Any) -> Iterator[str]:
        """The lines of a streamed answer, as they arrive (a streamed invoke, a followed log)."""
        response = self._send(method, path, stream=True, **kwargs)
        try:
            for line in response.iter_lines():
                if line:
                    yield line
        finally:
            response.close()

    def paginate(self, path: str, page: type[P], params: dict[str, Any] | None = None,
                       *, page_size: int | None = None) -> Iterator[Any]:
        """Every item of a list, page after page, following `next_page_token`."""
        params = dict(params or {})
        if page_size is not None:
            params["page_size"] = page_size
        while True:
            current = self.request("GET", path, page, params=params)
            for item in current.page_items():
                yield item
            if not current.next_page_token:
                return
            params["page_token"] = current.next_page_token

    def poll(self, fetch: Callable[[], Any], done: Callable[[Any], bool], *, timeout: float,
                   interval: float = 0.5) -> Any:
        """Fetch until `done(value)`; `APITimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = fetch()
            if done(value):
                return value
            if time.monotonic() >= deadline:
                raise APITimeoutError(f"not done after {timeout:g} s")
            time.sleep(interval)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
