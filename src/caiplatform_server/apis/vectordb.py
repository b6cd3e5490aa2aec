"""vectordb API (document 3). Routes come with its issue; health is served from the start."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from caiplatform.platform import Platform

router = APIRouter(tags=["vectordb"])


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    ok, detail = platform.database_health()
    body: dict[str, Any] = {"status": "ok" if ok else "degraded", "database": "ok" if ok else "unreachable"}
    if detail:
        body["database_detail"] = detail
    return (200 if ok else 503), body
