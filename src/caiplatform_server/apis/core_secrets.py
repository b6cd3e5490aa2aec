"""Core API, project secrets and bindings (document 2, "Project secrets")."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.errors import MethodNotAllowed, NotFound
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.secrets import (
    BINDING_BODY_LIMIT,
    CREATE_BODY_LIMIT,
    PROJECT_SECRET_VERBS,
    SECRET_MAP_VERBS,
    SECRET_VERBS,
    unknown_verb_message,
)
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["secrets"])

P = "/v1/projects/{project_id}"


def _page_args(request: Request) -> tuple[Any, str | None]:
    q = request.query_params
    return q.get("page_size", q.get("limit")), q.get("page_token")


def _split(segment: str, supported: tuple[str, ...]) -> tuple[str, str | None]:
    """`name:verb` → (name, verb); an unknown verb is 404 naming the supported ones."""
    name, sep, verb = segment.partition(":")
    if not sep:
        return name, None
    if verb not in supported:
        raise NotFound(unknown_verb_message(verb, supported))
    return name, verb


def _plain_name(segment: str) -> str:
    """A GET or DELETE on `name:verb`: the verb exists only as POST."""
    name, verb = _split(segment, SECRET_VERBS)
    if verb is not None:
        raise MethodNotAllowed(f"use POST for :{verb}")
    return name


@router.get(P + "/secrets", summary="List the project's secrets (metadata only)")
async def list_secrets(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    size, token = _page_args(request)
    return await platform.secrets.list(principal, project_id, size, token)


@router.post(P + "/secrets", summary="Create a secret or store a new version")
async def put_secret(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    body = await json_body(request, CREATE_BODY_LIMIT)
    result = await platform.secrets.put(principal, project_id, body)
    return JSONResponse(result.body, status_code=result.status)


@router.post(P + "/secrets:{verb}", summary="Mint a read token for every secret of the project")
async def project_secrets_verb(
    project_id: str, verb: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    if verb not in PROJECT_SECRET_VERBS:
        raise NotFound(unknown_verb_message(verb, PROJECT_SECRET_VERBS))
    body = await json_body(request, optional=True, lenient=True)
    return await platform.secrets.issue_project_token(principal, project_id, body)


@router.get(P + "/secrets/{segment}", summary="A secret's metadata, versions and bindings")
async def get_secret(
    project_id: str, segment: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.secrets.get(principal, project_id, _plain_name(segment))


@router.get(P + "/secrets/{name}/versions", summary="A secret's versions")
async def secret_versions(
    project_id: str, name: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.secrets.versions(principal, project_id, name)


@router.delete(P + "/secrets/{segment}", summary="Destroy every version of a secret (project admin)")
async def delete_secret(
    project_id: str, segment: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.secrets.delete(principal, project_id, _plain_name(segment))


@router.post(P + "/secrets/{segment}", summary="`:reveal` (project admin) or `:issue-token` on one secret")
async def secret_verb(
    project_id: str, segment: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    name, verb = _split(segment, SECRET_VERBS)
    if verb is None:
        raise MethodNotAllowed("method not allowed")
    # Both bodies are optional; a malformed reveal body reveals the current version.
    body = await json_body(request, optional=True, lenient=True)
    if verb == "reveal":
        return await platform.secrets.reveal(principal, project_id, name, body)
    return await platform.secrets.issue_token(principal, project_id, name, body)


@router.get(P + "/secret-maps", summary="Every binding of the project")
async def list_bindings(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    size, token = _page_args(request)
    return await platform.secrets.list_bindings(principal, project_id, size, token)


@router.get(P + "/agents/{agent}/secret-maps", summary="The bindings of one agent")
async def agent_bindings(
    project_id: str, agent: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.secrets.agent_bindings(principal, project_id, agent)


@router.post(P + "/agents/{agent}/secret-maps:{verb}", summary="`:apply`: write every bound value into the agent")
async def agent_bindings_verb(
    project_id: str, agent: str, verb: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    if verb not in SECRET_MAP_VERBS:
        raise NotFound(unknown_verb_message(verb, SECRET_MAP_VERBS))
    return await platform.secrets.apply(principal, project_id, agent)


@router.put(P + "/agents/{agent}/secret-maps/{env_name}", summary="Bind a secret to an agent's environment name")
async def bind(
    project_id: str, agent: str, env_name: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    body = await json_body(request, BINDING_BODY_LIMIT)
    return await platform.secrets.bind(principal, project_id, agent, env_name, body)


@router.delete(P + "/agents/{agent}/secret-maps/{env_name}", summary="Unbind and revoke immediately")
async def unbind(
    project_id: str, agent: str, env_name: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    return await platform.secrets.unbind(principal, project_id, agent, env_name)
