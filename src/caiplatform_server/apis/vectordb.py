"""Vector index API (document 3): per-project indexes, their four data verbs, the direct credential.

Routes decode, make one `IndexService` call and encode; the rules live in the service. Data verbs are
POSTs to the index path with a verb suffix (`.../indexes/docs:query`), so the POST route takes the
whole last segment and the service splits the verb off.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from caiplatform import json_input
from caiplatform.domain.vector import VERBS
from caiplatform.errors import BadRequest, MethodNotAllowed
from caiplatform.models.vector import (
    Index,
    IndexCreate,
    IndexCredential,
    IndexDeletePoints,
    IndexDeletePointsResult,
    IndexList,
    IndexPatch,
    IndexQuery,
    IndexQueryResult,
    IndexScroll,
    IndexScrollResult,
    IndexUpsert,
    IndexUpsertResult,
    data_request,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import json_body, read_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import operation, reply

router = APIRouter(tags=["vectordb"])

COLLECTION = "/v1/projects/{project_id}/indexes"
INDEX = COLLECTION + "/{name}"


def _body_limit(platform: Platform) -> int:
    return platform.settings.vector_max_body_bytes


async def _data_body(request: Request, limit: int) -> dict[str, Any]:
    """`json_body(..., optional=True)` through `json_input.decode_fast`: a 1,000-point upsert is mostly
    floats, which the standard decoder's per-float hook made the slowest step of the request. Same
    answers and the same refusals in the same words (`decode_fast` falls back to `decode` to word them)."""
    raw = await read_body(request, limit)
    if not raw.strip():
        return {}
    try:
        value = json_input.decode_fast(raw)
    except json_input.JSONInputError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("invalid JSON body: expected a JSON object")
    return value


def _refuse_verb_path(name: str) -> None:
    """`GET .../indexes/docs:query` names a data verb, which only answers POST."""
    _, sep, verb = name.partition(":")
    if sep and verb in VERBS:
        raise MethodNotAllowed("method not allowed")


@router.get(COLLECTION, summary="List the project's vector indexes",
            **operation(response=IndexList, paginated=True, errors=(403, 404)))
async def list_indexes(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    query = request.query_params
    page_size = query.get("page_size", query.get("limit"))
    return reply(await platform.indexes.list(principal, project_id, page_size=page_size,
                                             page_token=query.get("page_token")))


@router.post(COLLECTION, summary="Create a vector index (201, state pending)",
             **operation(body=IndexCreate, response=Index, status=201, errors=(403, 404, 409, 413)))
async def create_index(
    project_id: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    async def body() -> IndexCreate:  # read once the service's gate has passed
        return IndexCreate.parse(await json_body(request, _body_limit(platform)))

    return reply(await platform.indexes.create(principal, project_id, body), status=201)


@router.get(INDEX, summary="Read a vector index with its live counts", **operation(response=Index, errors=(403, 404, 405)))
async def get_index(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    _refuse_verb_path(name)
    return reply(await platform.indexes.get(principal, project_id, name))


@router.patch(INDEX, summary="Edit replicas and payload_on_disk (admin)",
              **operation(body=IndexPatch, response=Index, errors=(403, 404, 405, 413, 503)))
async def update_index(
    project_id: str,
    name: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    _refuse_verb_path(name)
    await platform.indexes.require_member(principal, project_id)
    body = IndexPatch.parse(await json_body(request, _body_limit(platform), optional=True))
    return reply(await platform.indexes.update(principal, project_id, name, body))


@router.delete(INDEX, summary="Destroy an index and every vector in it (admin)",
               **operation(status=204, errors=(403, 404, 405, 503)))
async def delete_index(
    project_id: str,
    name: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> Response:
    _refuse_verb_path(name)
    await platform.indexes.delete(principal, project_id, name)
    return Response(status_code=204)


@router.post(INDEX, summary="A data verb: :upsert, :query, :scroll or :delete-points",
             **operation(body=(IndexUpsert, IndexQuery, IndexScroll, IndexDeletePoints), body_required=False,
                         response=(IndexUpsertResult, IndexQueryResult, IndexScrollResult, IndexDeletePointsResult),
                         errors=(403, 404, 409, 413)))
async def index_data_verb(
    project_id: str,
    name: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    index_name, _, verb = name.partition(":")
    member_of = await platform.indexes.require_member(principal, project_id)
    body = data_request(verb or None, await _data_body(request, _body_limit(platform)))
    return reply(await platform.indexes.data(principal, project_id, index_name, body, member_of=member_of))


@router.get("/v1/projects/{project_id}/vectordb/credentials", summary="The direct engine credential (admin)",
            **operation(response=IndexCredential, errors=(403, 404)))
async def vectordb_credentials(
    project_id: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.indexes.credentials(principal, project_id))


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """`{status, dependencies: {vector_store, kubernetes, database}}`, each `{ok, latency_ms, error?}`."""
    status, body = await platform.indexes.health()
    return status, body.to_json()
