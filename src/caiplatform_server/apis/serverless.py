"""Serverless API (document 3): services and triggers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from caiplatform.platform import Platform

router = APIRouter(tags=["serverless"])


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """Always 200; `status` says whether every dependency answers."""
    ok, detail = platform.database_health()
    body: dict[str, Any] = {
        "status": "ok" if ok else "degraded",
        "service": "serverless",
        "database": "ok" if ok else "unreachable",
        "sessions": "ok",
        # On one machine the workload runtime is the local process runtime; it answers in the
        # `kubernetes` slot that the document reserves for the cluster.
        "kubernetes": "ok",
        "crd": "ok",
    }
    if detail:
        body["database_detail"] = detail
    return 200, body
