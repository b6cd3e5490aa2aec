"""Core API, project secrets and bindings (document 2, "Project secrets").

Routes decode, make one `SecretStore` call and write its model; the rules live in the store and the
request models (`caiplatform.models.secrets`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from caiplatform.errors import MethodNotAllowed, NotFound
from caiplatform.models.secrets import (
    AgentBindings,
    BindingList,
    BindingPut,
    BindingRemoved,
    BindingsApplied,
    BindingSaved,
    Secret,
    SecretDeleted,
    SecretIssueToken,
    SecretIssueTokenResult,
    SecretList,
    SecretReveal,
    SecretRevealResult,
    SecretVersions,
    SecretWrite,
    SecretWritten,
)
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
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import API_KEY, SERVICE_ACCOUNT_KEY, SESSION, WORKLOAD_KEY, operation, reply

router = APIRouter(tags=["secrets"])

P = "/v1/projects/{project_id}"
#: every route: a role missing or a credential that may not manage (403), not found or not yours (404);
#: the store unconfigured, sealed or unreachable is the common 503
STORE_ERRORS = (403, 404)


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


def _verbs(*bodies: type[BaseModel], **contract: Any) -> dict[str, Any]:
    """One path, several verbs: the body is a `oneOf` of the verbs' request models (each optional)."""
    kwargs = operation(body=bodies[0], body_required=False, **contract)
    for model in bodies[1:]:
        operation(body=model)  # declares the model among the components
    refs = [{"$ref": f"#/components/schemas/{model.__name__}"} for model in bodies]
    kwargs["openapi_extra"]["requestBody"]["content"]["application/json"]["schema"] = {"oneOf": refs}
    return kwargs


def _create_or_rotate() -> dict[str, Any]:
    """201 for a first version, 200 for a rotation: both are declared."""
    kwargs = operation(body=SecretWrite, response=SecretWritten, status=201, errors=(*STORE_ERRORS, 413))
    kwargs["responses"][200] = {"model": SecretWritten, "description": "A new version of an existing secret"}
    return kwargs


@router.get(P + "/secrets", summary="List the project's secrets (metadata only)",
            **operation(response=SecretList, paginated=True, errors=STORE_ERRORS))
async def list_secrets(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    size, token = _page_args(request)
    return reply(await platform.secrets.list(principal, project_id, size, token))


@router.post(P + "/secrets", summary="Create a secret or store a new version", **_create_or_rotate())
async def put_secret(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    async def body() -> SecretWrite:  # read once the service's gate has passed
        return SecretWrite.parse(await json_body(request, CREATE_BODY_LIMIT))

    result = await platform.secrets.put(principal, project_id, body)
    return reply(result, 201 if result.created else 200)


@router.post(P + "/secrets:{verb}", summary="Mint a read token for every secret of the project",
             **operation(body=SecretIssueToken, body_required=False, response=SecretIssueTokenResult,
                         errors=(*STORE_ERRORS, 413, 501),
                         security=(SESSION, API_KEY, SERVICE_ACCOUNT_KEY, WORKLOAD_KEY)))
async def project_secrets_verb(
    project_id: str, verb: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    if verb not in PROJECT_SECRET_VERBS:
        raise NotFound(unknown_verb_message(verb, PROJECT_SECRET_VERBS))
    body = SecretIssueToken.parse(await json_body(request, optional=True, lenient=True))
    return reply(await platform.secrets.issue_project_token(principal, project_id, body))


@router.get(P + "/secrets/{segment}", summary="A secret's metadata, versions and bindings",
            **operation(response=Secret, errors=(*STORE_ERRORS, 405)))
async def get_secret(
    project_id: str, segment: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.secrets.get(principal, project_id, _plain_name(segment)))


@router.get(P + "/secrets/{name}/versions", summary="A secret's versions",
            **operation(response=SecretVersions, errors=STORE_ERRORS))
async def secret_versions(
    project_id: str, name: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.secrets.versions(principal, project_id, name))


@router.delete(P + "/secrets/{segment}", summary="Destroy every version of a secret (project admin)",
               **operation(response=SecretDeleted, errors=(*STORE_ERRORS, 405, 409)))
async def delete_secret(
    project_id: str, segment: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.secrets.delete(principal, project_id, _plain_name(segment)))


@router.post(P + "/secrets/{segment}", summary="`:reveal` (project admin) or `:issue-token` on one secret",
             **_verbs(SecretReveal, SecretIssueToken, response=SecretRevealResult | SecretIssueTokenResult,
                      errors=(*STORE_ERRORS, 405, 413, 501)))
async def secret_verb(
    project_id: str, segment: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    name, verb = _split(segment, SECRET_VERBS)
    if verb is None:
        raise MethodNotAllowed("method not allowed")
    # Both bodies are optional; a malformed reveal body reveals the current version.
    raw = await json_body(request, optional=True, lenient=True)
    if verb == "reveal":
        return reply(await platform.secrets.reveal(principal, project_id, name, SecretReveal.parse(raw)))
    return reply(await platform.secrets.issue_token(principal, project_id, name, SecretIssueToken.parse(raw)))


@router.get(P + "/secret-maps", summary="Every binding of the project",
            **operation(response=BindingList, paginated=True, errors=STORE_ERRORS))
async def list_bindings(
    project_id: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    size, token = _page_args(request)
    return reply(await platform.secrets.list_bindings(principal, project_id, size, token))


@router.get(P + "/agents/{agent}/secret-maps", summary="The bindings of one agent",
            **operation(response=AgentBindings, errors=STORE_ERRORS))
async def agent_bindings(
    project_id: str, agent: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.secrets.agent_bindings(principal, project_id, agent))


@router.post(P + "/agents/{agent}/secret-maps:{verb}", summary="`:apply`: write every bound value into the agent",
             **operation(response=BindingsApplied, no_body=True, errors=(*STORE_ERRORS, 424)))
async def agent_bindings_verb(
    project_id: str, agent: str, verb: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    if verb not in SECRET_MAP_VERBS:
        raise NotFound(unknown_verb_message(verb, SECRET_MAP_VERBS))
    return reply(await platform.secrets.apply(principal, project_id, agent))


@router.put(P + "/agents/{agent}/secret-maps/{env_name}", summary="Bind a secret to an agent's environment name",
            **operation(body=BindingPut, response=BindingSaved, errors=(*STORE_ERRORS, 413)))
async def bind(
    project_id: str, agent: str, env_name: str, request: Request,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    async def body() -> BindingPut:  # read once the service's gate has passed
        return BindingPut.parse(await json_body(request, BINDING_BODY_LIMIT))

    return reply(await platform.secrets.bind(principal, project_id, agent, env_name, body))


@router.delete(P + "/agents/{agent}/secret-maps/{env_name}", summary="Unbind and revoke immediately",
               **operation(response=BindingRemoved, errors=STORE_ERRORS))
async def unbind(
    project_id: str, agent: str, env_name: str,
    principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of),
) -> JSONResponse:
    return reply(await platform.secrets.unbind(principal, project_id, agent, env_name))
