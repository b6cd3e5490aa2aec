"""Core API: the routes of documents 1 and 2 (identity here; other areas add their own modules)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["auth"])


@router.post("/v1/auth/login", summary="Sign in with e-mail and password")
async def login(request: Request, platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    body = await json_body(request)
    ip = request.client.host if request.client else None
    result = await platform.auth.login(body.get("email"), body.get("password"), ip)
    return result.body()


@router.get("/v1/auth/me", summary="The signed-in principal")
async def me(principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.auth.me(principal)


@router.post("/v1/auth/change-password", summary="Change the password and get a fresh token")
async def change_password(
    request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    body = await json_body(request)
    result = await platform.auth.change_password(principal, body.get("current_password"), body.get("new_password"))
    return result.body()


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    ok, detail = platform.database_health()
    body: dict[str, Any] = {"status": "ok" if ok else "degraded", "database": "ok" if ok else "unreachable"}
    if detail:
        body["database_detail"] = detail
    return (200 if ok else 503), body
