"""Core API part: forget a user everywhere, with a receipt (issue 37, `docs/erasure.md`). Every route
decodes, calls one service method, encodes; the rules live in `caiplatform.services.erasures`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.models import erasures as api
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.apis.core_accounts import ADMINS, MANAGERS
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import operation, reply
from caiplatform_server.http import json_body

router = APIRouter(tags=["erasures"])

Caller = Depends(principal_of)
Plat = Depends(platform_of)
P = "/v1/projects/{projectID}"


@router.post(P + "/forget", summary="Erase a user id from every store of the project's agents (or the named ones)",
             **operation(body=api.ForgetRequest, response=api.Erasure, status=202, security=MANAGERS,
                         errors=(403, 404)))
async def forget(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ForgetRequest.parse(await json_body(request))
    return reply(await platform.erasures.forget(principal, projectID, body), 202)


@router.get(P + "/erasures/{erasureID}", summary="An erasure's progress and receipt",
            **operation(response=api.Erasure, security=MANAGERS, errors=(403, 404)))
async def get_erasure(projectID: str, erasureID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.erasures.get(principal, projectID, erasureID))


@router.post("/v1/forget", summary="Erase a user id from every agent of every project (platform admin)",
             **operation(body=api.ForgetEverywhere, response=api.ErasureList, status=202, security=ADMINS,
                         errors=(403,)))
async def forget_everywhere(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ForgetEverywhere.parse(await json_body(request))
    return reply(await platform.erasures.forget_everywhere(principal, body), 202)
