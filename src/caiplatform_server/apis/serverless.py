"""Serverless API (document 3): services and triggers.

Routes decode, make one `ServerlessService` / `TriggerService` call and write its model; the rules live
in the services and the request models (`caiplatform.models.serverless`). Every body is capped at 256 KiB.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from caiplatform.domain.serverless import MAX_BODY_BYTES, SERVICE_VERBS, unknown_verb
from caiplatform.errors import MethodNotAllowed
from caiplatform.models.serverless import (
    Service,
    ServiceCreate,
    ServiceList,
    ServiceMetrics,
    ServicePatch,
    ServiceRevisionList,
    ServiceSpecDocument,
    TrafficUpdate,
    Trigger,
    TriggerCreate,
    TriggerList,
    TriggerPatch,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.validation import resource_segment
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import operation, reply

router = APIRouter(tags=["serverless"])

SERVICES = "/v1/projects/{project_id}/services"
SERVICE = SERVICES + "/{name}"
TRIGGERS = "/v1/projects/{project_id}/triggers"
TRIGGER = TRIGGERS + "/{name}"

#: a credential that may not manage, or a password change owed (403); not found or not yours (404)
ERRORS = (403, 404)
LOG_QUERY = [
    {"name": "tail", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 500},
     "description": "Lines from the end, 1 to 10000."},
    {"name": "follow", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
     "description": "Keep the stream open for new lines."},
]


def _page_args(request: Request) -> dict[str, Any]:
    query = request.query_params
    return {"page_size": query.get("page_size", query.get("limit")), "page_token": query.get("page_token")}


def _service_name(segment: str) -> str:
    return resource_segment(segment, SERVICE_VERBS, unknown_verb)


# ---------------------------------------------------------------------------------------- services


@router.get(SERVICES, summary="List the project's services",
            **operation(response=ServiceList, paginated=True, errors=ERRORS))
async def list_services(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.list(principal, project_id, **_page_args(request)))


@router.post(SERVICES, summary="Create a service (accepted, not yet serving)",
             **operation(body=ServiceCreate, response=Service, status=202, errors=(*ERRORS, 409, 413, 500)))
async def create_service(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> JSONResponse:
    async def body() -> ServiceCreate:  # read once the service's gate has passed
        return ServiceCreate.parse(await json_body(request, MAX_BODY_BYTES))

    return reply(await platform.serverless.create(principal, project_id, body), status=202)


@router.get(SERVICE, summary="Read a service", **operation(response=Service, errors=(*ERRORS, 405)))
async def get_service(project_id: str, name: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.get(principal, project_id, _service_name(name)))


@router.patch(SERVICE, summary="Sparse update; a change to the template makes a new revision",
              **operation(body=ServicePatch, response=Service, errors=(*ERRORS, 405, 409, 413)))
async def patch_service(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> JSONResponse:
    await platform.serverless.project(principal, project_id)  # access before the body is read
    body = ServicePatch.parse(await json_body(request, MAX_BODY_BYTES, optional=True))
    return reply(await platform.serverless.patch(principal, project_id, _service_name(name), body))


@router.delete(SERVICE, summary="Delete a service (project admin)", **operation(status=204, errors=(*ERRORS, 405)))
async def delete_service(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> Response:
    await platform.serverless.delete(principal, project_id, _service_name(name))
    return Response(status_code=204)


@router.post(SERVICE, summary="A verb on a service: `:set-traffic`",
             **operation(body=TrafficUpdate, response=Service, status=202, errors=(*ERRORS, 405, 409, 413)))
async def service_verb(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    service, colon, verb = name.partition(":")
    if not colon:
        raise MethodNotAllowed("method not allowed")
    platform.serverless.check_verb(principal, verb)
    async def body() -> TrafficUpdate:  # read once the service's gate has passed
        return TrafficUpdate.parse(await json_body(request, MAX_BODY_BYTES, optional=True))

    return reply(await platform.serverless.set_traffic(principal, project_id, service, body), status=202)


@router.get(SERVICE + "/revisions", summary="Every revision, newest first (never paged)",
            **operation(response=ServiceRevisionList, errors=ERRORS))
async def list_revisions(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.revisions(principal, project_id, name))


@router.get(SERVICE + "/logs", summary="Lines of the newest instance (text/plain)",
            **operation(content_type="text/plain", query=LOG_QUERY, errors=ERRORS))
async def service_logs(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> StreamingResponse:
    query = request.query_params
    follow = query.get("follow", "").lower() in ("true", "1", "yes")
    lines = await platform.serverless.logs(principal, project_id, name, tail=query.get("tail"), follow=follow)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")


@router.get(SERVICE + "/spec", summary="The sanitized live spec as YAML",
            **operation(response=ServiceSpecDocument, errors=ERRORS))
async def service_spec(project_id: str, name: str, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.spec(principal, project_id, name))


@router.get(SERVICE + "/metrics", summary="A live readout (no history)",
            **operation(response=ServiceMetrics, errors=ERRORS))
async def service_metrics(project_id: str, name: str, principal: Principal = Depends(principal_of),
                          platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.metrics(principal, project_id, name))


# ---------------------------------------------------------------------------------------- triggers


@router.get(TRIGGERS, summary="List the project's triggers",
            **operation(response=TriggerList, paginated=True, errors=ERRORS))
async def list_triggers(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.triggers.list(principal, project_id, **_page_args(request)))


@router.post(TRIGGERS, summary="Create a trigger (pending, then ready)",
             **operation(body=TriggerCreate, response=Trigger, status=202, errors=(*ERRORS, 409, 413)))
async def create_trigger(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> JSONResponse:
    await platform.serverless.project(principal, project_id)  # access before the body is read
    body = TriggerCreate.parse(await json_body(request, MAX_BODY_BYTES))
    return reply(await platform.serverless.triggers.create(principal, project_id, body), status=202)


@router.get(TRIGGER, summary="Read a trigger with its runs record", **operation(response=Trigger, errors=ERRORS))
async def get_trigger(project_id: str, name: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.serverless.triggers.get(principal, project_id, name))


@router.patch(TRIGGER, summary="Update a trigger's target or source",
              **operation(body=TriggerPatch, response=Trigger, errors=(*ERRORS, 413)))
async def patch_trigger(project_id: str, name: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> JSONResponse:
    await platform.serverless.project(principal, project_id)  # access before the body is read
    body = TriggerPatch.parse(await json_body(request, MAX_BODY_BYTES, optional=True))
    return reply(await platform.serverless.triggers.patch(principal, project_id, name, body))


@router.delete(TRIGGER, summary="Delete a trigger", **operation(status=204, errors=ERRORS))
async def delete_trigger(project_id: str, name: str, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> Response:
    await platform.serverless.triggers.delete(principal, project_id, name)
    return Response(status_code=204)


# ---------------------------------------------------------------------------------------- health


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """Always 200: `{status, service, database, sessions, kubernetes, crd, ...}` (`ServerlessHealth`)."""
    status, body = await platform.serverless.health()
    return status, body.to_json()
