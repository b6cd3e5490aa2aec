"""The code sandbox route (document 1, Limits; docs/decisions/codesandbox.md): `POST {SANDBOX_URL}/execute`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.codesandbox import CODE, TOOL
from caiplatform.codesandbox.models import ExecuteRequest, ExecuteResult, inline_schema
from caiplatform.models.agents import SandboxToolAnswer, SandboxToolCall
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import WORKLOAD_KEY, operation, reply

router = APIRouter(tags=["code sandbox"])


def _inline_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The execute body's schema inline (as the code sandbox documents it), not a reference."""
    kwargs["openapi_extra"]["requestBody"]["content"]["application/json"]["schema"] = inline_schema(ExecuteRequest)
    return kwargs


@router.post(
    "/v1/projects/{project_id}/sandbox/execute",
    summary="Run a snippet in a fresh sandbox from the warm pool (a workload credential of the project only)",
    description=f"400: {CODE.timeout_message}; code is required; unsupported 'language'. 403: not a workload "
                "credential. 404: another project's workload. 503: no warm sandbox pod available, try again shortly.",
    **_inline_body(operation(body=ExecuteRequest, response=ExecuteResult, security=(WORKLOAD_KEY,),
                             errors=(403, 404, 413))),
)
async def execute(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                  platform: Platform = Depends(platform_of)) -> JSONResponse:
    platform.code_sandbox.authorize(principal, project_id)  # who, before reading a body
    body = ExecuteRequest.parse(await json_body(request, CODE.body_bytes))
    return reply(await platform.code_sandbox.execute(principal, project_id, body))


@router.post(
    "/v1/projects/{project_id}/sandbox/tool-calls",
    summary="Run one of the calling agent's own tool functions in a fresh sandbox (agents with TOOL_SANDBOX set)",
    description=f"400: {TOOL.timeout_message}. 403: not an agent's workload credential. 413: body over 1 MiB.",
    **operation(body=SandboxToolCall, response=SandboxToolAnswer, security=(WORKLOAD_KEY,), errors=(403, 404, 413)),
)
async def tool_call(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    platform.code_sandbox.authorize(principal, project_id)
    body = SandboxToolCall.parse(await json_body(request, TOOL.body_bytes))
    return reply(await platform.tool_sandbox.call(principal, project_id, body))
