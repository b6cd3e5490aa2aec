"""Memory store API (document 3): provisioned Redis-compatible instances.

Routes decode, make one `MemoryStoreService` call and encode; the rules live in the service.
`/livez` is registered by the app factory whenever this API is served.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.domain.memorystore import MAX_CREATE_BODY_BYTES
from caiplatform.models import memorystore as views
from caiplatform.models.memorystore import MemoryStoreCreate
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import decode_object, read_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import operation, reply

router = APIRouter(tags=["memorystore"])

COLLECTION = "/v1/projects/{project_id}/memorystores"
INSTANCE = COLLECTION + "/{name}"


@router.get(COLLECTION, summary="List the project's memory stores",
            **operation(response=views.MemoryStoreList, paginated=True, errors=(403, 404)))
async def list_memorystores(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    query = request.query_params
    page_size = query.get("page_size", query.get("limit"))
    return reply(await platform.memorystores.list(principal, project_id, page_size=page_size,
                                                  page_token=query.get("page_token")))


@router.post(COLLECTION, summary="Create a memory store (the password is shown once)",
             **operation(body=MemoryStoreCreate, response=views.MemoryStoreCreated, status=201,
                         errors=(403, 404, 409, 413, 502)))
async def create_memorystore(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    raw = await read_body(request, MAX_CREATE_BODY_BYTES)  # a body over the limit is 413 before anything else
    # The body is decoded once the service's gate has passed (a stranger is refused first).
    created = await platform.memorystores.create(principal, project_id, lambda: MemoryStoreCreate.parse(decode_object(raw)))
    return reply(created, status=201)


@router.get(INSTANCE, summary="Read a memory store (never its password)",
            **operation(response=views.MemoryStore, errors=(403, 404)))
async def get_memorystore(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.memorystores.get(principal, project_id, name))


@router.get(INSTANCE + "/stats", summary="A live INFO snapshot",
            **operation(response=views.MemoryStoreStats, errors=(403, 404, 409, 502)))
async def memorystore_stats(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.memorystores.stats(principal, project_id, name))


@router.delete(INSTANCE, summary="Delete a memory store and its data (admin)",
               **operation(response=views.MemoryStoreDeletion, status=202, errors=(403, 404, 502)))
async def delete_memorystore(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.memorystores.delete(principal, project_id, name), status=202)


@router.post(INSTANCE + "/rotate-credential", summary="Issue a new password; it takes effect at restart (admin)",
             **operation(no_body=True, response=views.MemoryStoreRotated, errors=(403, 404, 409, 502)))
async def rotate_memorystore_credential(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.memorystores.rotate_credential(principal, project_id, name))


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """`{status, checks: {kubernetes, memorystore_crd, database, session_key}}`, 200 or 503."""
    status, body = await platform.memorystores.health()
    return status, body.to_json()
