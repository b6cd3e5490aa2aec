"""Pagination shared by every list of every API.

`page_size` is 1 to 200 (default 50, `limit` is an alias) and is never clamped. `page_token` is opaque
and tamper-evident: an HMAC over its content and the identity of the list that issued it, so a token is
refused by any other list.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from caiplatform.errors import BadRequest

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
PAGE_SIZE_MESSAGE = f"page_size must be between 1 and {MAX_PAGE_SIZE}"
PAGE_TOKEN_MESSAGE = "page_token is invalid or was issued for a different list; start from the first page"


@dataclass(frozen=True)
class PageRequest:
    list_key: str
    size: int = DEFAULT_PAGE_SIZE
    offset: int = 0


@dataclass
class Page(Generic[T]):
    items: list[T]
    next_page_token: str = ""  # empty on the last page
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> bool:
        return not self.next_page_token


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_page_size(raw: Any) -> int:
    if raw is None or raw == "":
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except (TypeError, ValueError):
        raise BadRequest(PAGE_SIZE_MESSAGE) from None
    if isinstance(raw, float) and raw != size:
        raise BadRequest(PAGE_SIZE_MESSAGE)
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise BadRequest(PAGE_SIZE_MESSAGE)
    return size


class Pager:
    """Issues and checks page tokens with the platform's signing key."""

    def __init__(self, key: bytes):
        self._key = key

    def _sign(self, list_key: str, body: str) -> str:
        mac = hmac.new(self._key, f"{list_key}\x00{body}".encode(), hashlib.sha256).digest()
        return _b64(mac[:18])

    def token(self, list_key: str, offset: int) -> str:
        body = _b64(json.dumps({"o": offset}, separators=(",", ":")).encode())
        return f"{body}.{self._sign(list_key, body)}"

    def request(self, list_key: str, page_size: Any = None, page_token: str | None = None) -> PageRequest:
        size = parse_page_size(page_size)
        if not page_token:
            return PageRequest(list_key, size, 0)
        body, _, sig = page_token.partition(".")
        if not body or not sig or not hmac.compare_digest(sig, self._sign(list_key, body)):
            raise BadRequest(PAGE_TOKEN_MESSAGE)
        try:
            offset = int(json.loads(_unb64(body))["o"])
        except (ValueError, KeyError, TypeError):
            raise BadRequest(PAGE_TOKEN_MESSAGE) from None
        if offset < 0:
            raise BadRequest(PAGE_TOKEN_MESSAGE)
        return PageRequest(list_key, size, offset)

    def page(self, items: Sequence[T], request: PageRequest) -> Page[T]:
        """Cut one page out of the whole, already ordered, list."""
        chunk = list(items[request.offset : request.offset + request.size])
        more = request.offset + request.size < len(items)
        return Page(chunk, self.token(request.list_key, request.offset + request.size) if more else "")

    def page_from_probe(self, fetched: list[T], request: PageRequest) -> Page[T]:
        """For queries that fetched `size + 1` rows from `offset` to learn whether more exist."""
        more = len(fetched) > request.size
        items = fetched[: request.size]
        return Page(items, self.token(request.list_key, request.offset + request.size) if more else "")


def page_body(key: str, page: Page[Any], *, omit_empty_token: bool = False, **extra: Any) -> dict[str, Any]:
    """The JSON shape of a list response. Document-3 APIs omit the token on the last page."""
    body: dict[str, Any] = {key: page.items, **extra}
    if page.next_page_token or not omit_empty_token:
        body["next_page_token"] = page.next_page_token
    return body
