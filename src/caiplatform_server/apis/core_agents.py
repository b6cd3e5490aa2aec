"""Core API, agent management (document 1): deploy, list, get, delete, redeploy, env, secrets, files,
config, revisions, traffic, spec, metrics, logs and the embed config. Invoke and sessions live elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from caiplatform.domain.agents import DEPLOY_FIELDS
from caiplatform.errors import BadRequest
from caiplatform.models.agents import (
    AgentConfig,
    AgentDeleted,
    AgentEnv,
    AgentList,
    AgentMetrics,
    AgentSpec,
    AgentView,
    ConfigPatch,
    ConfigUpdated,
    DeployAccepted,
    DeployForm,
    EmbedConfig,
    EmbedDeleted,
    EmbedUpdate,
    EnvPatch,
    EnvUpdated,
    LogHistory,
    RedeployAccepted,
    RevisionList,
    SecretKeys,
    SecretsPatch,
    SecretsReplace,
    SecretsUpdated,
    SourceFile,
    SourceFileDeleted,
    SourceFiles,
    SourceFileWrite,
    SourceFileWritten,
    TrafficSet,
    TrafficSplit,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.agents import FILE_BODY_LIMIT, SECRETS_BODY_LIMIT, DeployUpload
from caiplatform.web.http import MiB, json_body, read_body
from caiplatform_server.app_deps import caller_of, platform_of, principal_of
from caiplatform_server.contract import operation, reply
from caiplatform_server.dispatch import prefetched_of, reads_with_credential

router = APIRouter(tags=["agents"])

A = "/v1/agents/{name}"
FORM_SLACK = 1 * MiB


PROJECT = {"name": "project", "in": "query", "required": False, "schema": {"type": "string"},
           "description": "The agent's project (slug, short id or id), when the name exists in several."}
OWNER = (403, 404, 409)  # the owner gate: no recorded owner, not found or not yours, ambiguous name


def project_param(request: Request) -> str | None:
    """The agent route's `?project=` (the agents and invoke routes alike)."""
    if not request.scope.get("query_string"):  # most calls: no query to parse
        return None
    return request.query_params.get("project") or None


def owner_gate_read(request: Request) -> Any:
    """The owner gate's read of the route's agent, made with the credential's (`reads_with_credential`):
    what `GET /v1/agents/{name}` and the invoke routes look the agent up by."""
    return request.app.state.platform.agents.gate_read(request.path_params["name"], project_param(request))


def op(*, query: Sequence[dict[str, Any]] = (), **kwargs: Any) -> dict[str, Any]:
    """`operation(...)` of an agent route: every one takes `?project=`."""
    return operation(query=[PROJECT, *query], **kwargs)


async def _deploy_form(request: Request, limit: int) -> DeployUpload:
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise BadRequest("invalid multipart form: the body must be multipart/form-data with fields name and code")
    raw = await read_body(request, limit)
    request._body = raw  # the form parser reads the already bounded body
    try:
        form = await request.form(max_files=4, max_fields=16, max_part_size=FORM_SLACK)
    except MultiPartException as exc:
        raise BadRequest(f"invalid multipart form: {exc.message}") from None
    except StarletteHTTPException as exc:  # starlette wraps the parser's errors
        raise BadRequest(f"invalid multipart form: {exc.detail}") from None
    except (ValueError, KeyError) as exc:
        raise BadRequest(f"invalid multipart form: {exc}") from None
    upload = DeployUpload()
    try:
        for key, value in form.multi_items():
            if key not in DEPLOY_FIELDS:
                if key not in upload.unknown:
                    upload.unknown.append(key)
                continue
            if key == "code":
                if isinstance(value, UploadFile):
                    upload.code = await value.read()
                else:
                    upload.code_not_a_file = True
            elif isinstance(value, str):
                upload.fields[key] = value
            else:
                upload.fields[key] = (await value.read()).decode("utf-8", errors="replace")
    finally:
        await form.close()
    return upload


@router.post("/v1/agents", summary="Deploy or redeploy from a .tar.gz (multipart)",
             **op(multipart=DeployForm, response=DeployAccepted, status=202, errors=(*OWNER, 413)))
async def deploy(
    request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    upload = await _deploy_form(request, platform.settings.max_upload_bytes + FORM_SLACK)
    return reply(await platform.agents.deploy(principal, project_param(request), upload), status=202)


@router.get("/v1/agents", summary="Agents and functions the caller may manage",
            **op(response=AgentList, paginated=True, errors=(404, 409)))
async def list_agents(
    request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    q = request.query_params
    return reply(await platform.agents.list(principal, project_param(request), q.get("page_size", q.get("limit")),
                                            q.get("page_token")))


@router.get(A, summary="One agent", **op(response=AgentView, errors=OWNER))
@reads_with_credential(owner_gate_read)
async def get_agent(name: str, request: Request) -> JSONResponse:
    platform, principal = caller_of(request)
    return reply(await platform.agents.get(principal, name, project_param(request), prefetched_of(request)))


@router.delete(A, summary="Delete an agent (its sessions stay)", **op(response=AgentDeleted, errors=OWNER))
async def delete_agent(name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.delete(principal, name, project_param(request)))


@router.post(A + "/redeploy", summary="Rebuild from the stored source",
             **op(response=RedeployAccepted, status=202, no_body=True, errors=OWNER))
async def redeploy(name: str, request: Request, principal: Principal = Depends(principal_of),
                   platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.redeploy(principal, name, project_param(request)), status=202)


# -- logs -------------------------------------------------------------------------------------------

FOLLOW = {"name": "follow", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
          "description": "Keep tailing."}


def _follow(request: Request) -> bool:
    return request.query_params.get("follow", "").lower() in ("1", "true", "yes")


@router.get(A + "/logs", summary="Live logs of the newest instance (text/plain)",
            **op(content_type="text/plain", query=[FOLLOW], errors=OWNER))
async def logs(name: str, request: Request, principal: Principal = Depends(principal_of),
               platform: Platform = Depends(platform_of)) -> StreamingResponse:
    follow = _follow(request)
    lines = await platform.agents.logs(principal, name, project_param(request), follow=follow)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")


@router.get(A + "/logs/build", summary="The latest build's log lines (text/plain); with follow, until it ends",
            **op(content_type="text/plain", query=[FOLLOW], errors=OWNER))
async def build_log(name: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> StreamingResponse:
    follow = _follow(request)
    lines = await platform.agents.build_log(principal, name, project_param(request), follow=follow)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8")


HISTORY_QUERY = [
    {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "default": 500}},
    {"name": "since", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"},
     "description": "RFC 3339"},
]


@router.get(A + "/logs/history", summary="Persisted log lines",
            **op(response=LogHistory, query=HISTORY_QUERY, errors=OWNER))
async def log_history(name: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    q = request.query_params
    return reply(await platform.agents.log_history(principal, name, project_param(request), q.get("limit"), q.get("since")))


# -- secrets and env --------------------------------------------------------------------------------


@router.get(A + "/secrets", summary="Names of the agent's secret keys", **op(response=SecretKeys, errors=OWNER))
async def secret_keys(name: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.secret_keys(principal, name, project_param(request)))


@router.put(A + "/secrets", summary="Replace the agent's secret",
            **op(body=SecretsReplace, response=SecretsUpdated, errors=(*OWNER, 413)))
async def put_secrets(name: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    secrets = SecretsReplace.parse(await json_body(request, SECRETS_BODY_LIMIT))
    return reply(await platform.agents.put_secrets(principal, name, project_param(request), secrets))


@router.patch(A + "/secrets", summary="Merge into the agent's secret",
              **op(body=SecretsPatch, response=SecretsUpdated, errors=(*OWNER, 413)))
async def patch_secrets(name: str, request: Request, principal: Principal = Depends(principal_of),
                        platform: Platform = Depends(platform_of)) -> JSONResponse:
    patch = SecretsPatch.parse(await json_body(request, SECRETS_BODY_LIMIT))
    return reply(await platform.agents.patch_secrets(principal, name, project_param(request), patch))


@router.get(A + "/env", summary="The agent's environment", **op(response=AgentEnv, errors=OWNER))
async def get_env(name: str, request: Request, principal: Principal = Depends(principal_of),
                  platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.get_env(principal, name, project_param(request)))


@router.patch(A + "/env", summary="Merge into the agent's environment",
              **op(body=EnvPatch, response=EnvUpdated, errors=(*OWNER, 413)))
async def patch_env(name: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    patch = EnvPatch.parse(await json_body(request, SECRETS_BODY_LIMIT))
    return reply(await platform.agents.patch_env(principal, name, project_param(request), patch))


# -- stored source ----------------------------------------------------------------------------------


@router.get(A + "/files", summary="The stored source files", **op(response=SourceFiles, errors=OWNER))
async def list_files(name: str, request: Request, principal: Principal = Depends(principal_of),
                     platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.list_files(principal, name, project_param(request)))


@router.get(A + "/files/{path:path}", summary="One stored file", **op(response=SourceFile, errors=OWNER))
async def read_file(name: str, path: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.read_file(principal, name, project_param(request), path))


@router.put(A + "/files/{path:path}", summary="Write one stored file (redeploy to run it)",
            **op(body=SourceFileWrite, response=SourceFileWritten, errors=(*OWNER, 413)))
async def write_file(name: str, path: str, request: Request, principal: Principal = Depends(principal_of),
                     platform: Platform = Depends(platform_of)) -> JSONResponse:
    file = SourceFileWrite.parse(await json_body(request, FILE_BODY_LIMIT))
    return reply(await platform.agents.write_file(principal, name, project_param(request), path, file))


@router.delete(A + "/files/{path:path}", summary="Delete one stored file",
               **op(response=SourceFileDeleted, errors=OWNER))
async def delete_file(name: str, path: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.delete_file(principal, name, project_param(request), path))


# -- revisions, traffic, config, spec, metrics -------------------------------------------------------


@router.get(A + "/revisions", summary="Revisions with live traffic, newest first",
            **op(response=RevisionList, errors=OWNER))
async def revisions(name: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.revisions(principal, name, project_param(request)))


@router.post(A + "/set-traffic", summary="Replace the traffic split",
             **op(body=TrafficSplit, response=TrafficSet, status=202, errors=(*OWNER, 413)))
async def set_traffic(name: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    split = TrafficSplit.parse(await json_body(request, 64 * 1024, optional=True))
    return reply(await platform.agents.set_traffic(principal, name, project_param(request), split), status=202)


@router.get(A + "/config", summary="Compute config (null on platform defaults)",
            **op(response=AgentConfig, errors=OWNER))
async def get_config(name: str, request: Request, principal: Principal = Depends(principal_of),
                     platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.get_config(principal, name, project_param(request)))


@router.patch(A + "/config", summary="Sparse update of the compute config; rolls a revision",
              **op(body=ConfigPatch, response=ConfigUpdated, errors=(*OWNER, 413)))
async def patch_config(name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    patch = ConfigPatch.parse(await json_body(request, 64 * 1024))
    return reply(await platform.agents.patch_config(principal, name, project_param(request), patch))


@router.get(A + "/spec", summary="Sanitized live spec (YAML)", **op(response=AgentSpec, errors=OWNER))
async def spec(name: str, request: Request, principal: Principal = Depends(principal_of),
               platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.spec(principal, name, project_param(request)))


@router.get(A + "/metrics", summary="Live counts", **op(response=AgentMetrics, errors=OWNER))
async def metrics(name: str, request: Request, principal: Principal = Depends(principal_of),
                  platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.metrics(principal, name, project_param(request)))


# -- embed config -----------------------------------------------------------------------------------


@router.get(A + "/embed", summary="Chat widget config", **op(response=EmbedConfig, errors=OWNER))
async def get_embed(name: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.get_embed(principal, name, project_param(request)))


@router.put(A + "/embed", summary="Partial update of the widget config; the first one mints the key",
            **op(body=EmbedUpdate, body_required=False, response=EmbedConfig, errors=(*OWNER, 413)))
async def put_embed(name: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    update = EmbedUpdate.parse(await json_body(request, 64 * 1024, optional=True))
    return reply(await platform.agents.put_embed(principal, name, project_param(request), update))


@router.delete(A + "/embed", summary="Remove the widget config", **op(response=EmbedDeleted, errors=OWNER))
async def delete_embed(name: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.delete_embed(principal, name, project_param(request)))


@router.post(A + "/embed/rotate-key", summary="Mint a new public embed key",
             **op(response=EmbedConfig, no_body=True, errors=OWNER))
async def rotate_embed_key(name: str, request: Request, principal: Principal = Depends(principal_of),
                           platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.agents.rotate_embed_key(principal, name, project_param(request)))
