"""Memory store API (document 3): provisioned Redis-compatible instances.

Routes decode, make one `MemoryStoreService` call and encode; the rules live in the service.
`/livez` is registered by the app factory whenever this API is served.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.domain.memorystore import MAX_CREATE_BODY_BYTES
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import read_body

router = APIRouter(tags=["memorystore"])

COLLECTION = "/v1/projects/{project_id}/memorystores"
INSTANCE = COLLECTION + "/{name}"


@router.get(COLLECTION, summary="List the project's memory stores")
async def list_memorystores(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    query = request.query_params
    page_size = query.get("page_size", query.get("limit"))
    return await platform.memorystores.list(
        principal, project_id, page_size=page_size, page_token=query.get("page_token")
    )


@router.post(COLLECTION, status_code=201, summary="Create a memory store (the password is shown once)")
async def create_memorystore(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    raw = await read_body(request, MAX_CREATE_BODY_BYTES)
    body = await platform.memorystores.create(principal, project_id, raw)
    return JSONResponse(body, status_code=201)


@router.get(INSTANCE, summary="Read a memory store (never its password)")
async def get_memorystore(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.memorystores.get(principal, project_id, name)


@router.get(INSTANCE + "/stats", summary="A live INFO snapshot")
async def memorystore_stats(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.memorystores.stats(principal, project_id, name)


@router.delete(INSTANCE, status_code=202, summary="Delete a memory store and its data (admin)")
async def delete_memorystore(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    body = await platform.memorystores.delete(principal, project_id, name)
    return JSONResponse(body, status_code=202)


@router.post(INSTANCE + "/rotate-credential", summary="Issue a new password; it takes effect at restart (admin)")
async def rotate_memorystore_credential(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.memorystores.rotate_credential(principal, project_id, name)


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """`{status, checks: {kubernetes, memorystore_crd, database, session_key}}`, 200 or 503."""
    return await platform.memorystores.health()
