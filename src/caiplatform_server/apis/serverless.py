"""Serverless API (document 3): services and triggers.

Routes decode, make one `ServerlessService` / `TriggerService` call and encode; the rules live in the
services. Every body is capped at 256 KiB.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from caiplatform.domain.serverless import MAX_BODY_BYTES, SERVICE_VERBS, unknown_verb
from caiplatform.errors import MethodNotAllowed
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.validation import resource_segment
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["serverless"])

SERVICES = "/v1/projects/{project_id}/services"
SERVICE = SERVICES + "/{name}"
TRIGGERS = "/v1/projects/{project_id}/triggers"
TRIGGER = TRIGGERS + "/{name}"


def _page_args(request: Request) -> dict[str, Any]:
    query = request.query_params
    return {"page_size": query.get("page_size", query.get("limit")), "page_token": query.get("page_token")}


def _service_name(segment: str) -> str:
    return resource_segment(segment, SERVICE_VERBS, unknown_verb)


# ---------------------------------------------------------------------------------------- services


@router.get(SERVICES, summary="List the project's services")
async def list_services(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.list(principal, project_id, **_page_args(request))


@router.post(SERVICES, status_code=202, summary="Create a service (accepted, not yet serving)")
async def create_service(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> JSONResponse:
    platform.serverless.require_caller(principal)
    body = await json_body(request, MAX_BODY_BYTES)
    return JSONResponse(await platform.serverless.create(principal, project_id, body), status_code=202)


@router.get(SERVICE, summary="Read a service")
async def get_service(project_id: str, name: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.get(principal, project_id, _service_name(name))


@router.patch(SERVICE, summary="Sparse update; a change to the template makes a new revision")
async def patch_service(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    platform.serverless.require_caller(principal)
    body = await json_body(request, MAX_BODY_BYTES, optional=True)
    return await platform.serverless.patch(principal, project_id, _service_name(name), body)


@router.delete(SERVICE, status_code=204, summary="Delete a service (project admin)")
async def delete_service(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> Response:
    await platform.serverless.delete(principal, project_id, _service_name(name))
    return Response(status_code=204)


@router.post(SERVICE, status_code=202, summary="A verb on a service: `:set-traffic`")
async def service_verb(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    service, colon, verb = name.partition(":")
    if not colon:
        raise MethodNotAllowed("method not allowed")
    platform.serverless.require_caller(principal)
    body = await json_body(request, MAX_BODY_BYTES, optional=True)
    return JSONResponse(await platform.serverless.verb(principal, project_id, service, verb, body), status_code=202)


@router.get(SERVICE + "/revisions", summary="Every revision, newest first (never paged)")
async def list_revisions(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.revisions(principal, project_id, name)


@router.get(SERVICE + "/logs", summary="Lines of the newest instance (text/plain)")
async def service_logs(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> StreamingResponse:
    query = request.query_params
    follow = query.get("follow", "").lower() in ("true", "1", "yes")
    lines = await platform.serverless.logs(principal, project_id, name, tail=query.get("tail"), follow=follow)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")


@router.get(SERVICE + "/spec", summary="The sanitized live spec as YAML")
async def service_spec(project_id: str, name: str, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.spec(principal, project_id, name)


@router.get(SERVICE + "/metrics", summary="A live readout (no history)")
async def service_metrics(project_id: str, name: str, principal: Principal = Depends(principal_of),
                          platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.metrics(principal, project_id, name)


# ---------------------------------------------------------------------------------------- triggers


@router.get(TRIGGERS, summary="List the project's triggers")
async def list_triggers(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.triggers.list(principal, project_id, **_page_args(request))


@router.post(TRIGGERS, status_code=202, summary="Create a trigger (pending, then ready)")
async def create_trigger(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> JSONResponse:
    platform.serverless.require_caller(principal)
    body = await json_body(request, MAX_BODY_BYTES)
    return JSONResponse(await platform.serverless.triggers.create(principal, project_id, body), status_code=202)


@router.get(TRIGGER, summary="Read a trigger with its runs record")
async def get_trigger(project_id: str, name: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.serverless.triggers.get(principal, project_id, name)


@router.patch(TRIGGER, summary="Update a trigger's target or source")
async def patch_trigger(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    platform.serverless.require_caller(principal)
    body = await json_body(request, MAX_BODY_BYTES, optional=True)
    return await platform.serverless.triggers.patch(principal, project_id, name, body)


@router.delete(TRIGGER, status_code=204, summary="Delete a trigger")
async def delete_trigger(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> Response:
    await platform.serverless.triggers.delete(principal, project_id, name)
    return Response(status_code=204)


# ---------------------------------------------------------------------------------------- health


NOT_CONFIGURED = "not configured"


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """Always 200; `status` says whether every dependency answers.

    Without a cluster the `kubernetes` and `crd` slots say `not configured` (with the local runtime's
    name in `kubernetes_detail` and `runtime`): what is true, never a bare `ok` for something unused."""
    ok, detail = platform.database_health()
    body: dict[str, Any] = {
        "status": "ok",
        "service": "serverless",
        "database": "ok" if ok else "unreachable",
        "sessions": "ok" if platform.session_key else "unavailable",
        "kubernetes": NOT_CONFIGURED,
        "crd": NOT_CONFIGURED,
    }
    if detail:
        body["database_detail"] = detail
    if not platform.session_key:
        body["sessions_detail"] = "no session signing key is loaded"
    try:
        runtime_name = platform.runtime.name
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        body["kubernetes"] = "unreachable"
        body["kubernetes_detail"] = f"the workload runtime is not available: {exc}"
    else:
        body["runtime"] = runtime_name
        if runtime_name == "kubernetes":
            body["kubernetes"] = body["crd"] = "ok"  # the runtime adapter answered for its cluster
        else:
            body["kubernetes_detail"] = f"no cluster is configured; services run on the {runtime_name} runtime"
            body["crd_detail"] = "no cluster is configured; service records live in the platform database"
        if runtime_name == "local":  # processes run deployed code: say how they are confined
            body["sandbox"] = platform.sandbox_status()
    if ok:
        try:
            await platform.db.run(lambda s: s.execute(_crd_probe()))
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            body["crd"] = "missing"
            body["crd_detail"] = f"the serverless tables are missing: {exc}"
    else:
        body["crd"] = "missing"
        body["crd_detail"] = "the database is unreachable"
    healthy = ("ok", NOT_CONFIGURED)
    if any(body[k] not in healthy for k in ("database", "sessions", "kubernetes", "crd")):
        body["status"] = "degraded"
    return 200, body


def _crd_probe() -> Any:
    from sqlalchemy import select

    from caiplatform.db.models.serverless import ServerlessService

    return select(ServerlessService.id).limit(1)
