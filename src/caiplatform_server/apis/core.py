"""Core API: the routes of documents 1 and 2 (identity here; other areas add their own modules)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.models.auth import CoreHealth, LoginRequest, Me, PasswordChange, SignIn
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import caller_of, platform_of, principal_of
from caiplatform_server.contract import (
    ANONYMOUS,
    AUTOMATION_TOKEN,
    CALLERS,
    PEOPLE,
    WORKLOAD_KEY,
    operation,
    reply,
)

router = APIRouter(tags=["auth"])


@router.post("/v1/auth/login", summary="Sign in with e-mail and password",
             **operation(body=LoginRequest, response=SignIn, security=ANONYMOUS, errors=(401,)))
async def login(request: Request, platform: Platform = Depends(platform_of)) -> JSONResponse:
    body = LoginRequest.parse(await json_body(request))
    ip = request.client.host if request.client else None
    return reply(await platform.auth.login(body.email, body.password, ip))


@router.get("/v1/auth/me", summary="The signed-in principal",
            **operation(response=Me, security=(*CALLERS, WORKLOAD_KEY, AUTOMATION_TOKEN)))
async def me(request: Request) -> JSONResponse:
    platform, principal = caller_of(request)
    return reply(await platform.auth.me(principal))


@router.post("/v1/auth/change-password", summary="Change the password and get a fresh token",
             **operation(body=PasswordChange, response=SignIn, security=PEOPLE))
async def change_password(
    request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    body = PasswordChange.parse(await json_body(request))
    return reply(await platform.auth.change_password(principal, body.current_password, body.new_password))


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    ok, detail = platform.database_health()
    body = CoreHealth(status="ok" if ok else "degraded", database="ok" if ok else "unreachable")
    if detail:
        body.database_detail = detail
    return (200 if ok else 503), body.to_json()
