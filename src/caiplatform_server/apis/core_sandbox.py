"""The code sandbox route (document 1, Limits; docs/decisions/codesandbox.md): `POST {SANDBOX_URL}/execute`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from caiplatform.codesandbox import CODE, TOOL
from caiplatform.codesandbox.models import ExecuteRequest, ExecuteResult, inline_schema
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["code sandbox"])


@router.post(
    "/v1/projects/{project_id}/sandbox/execute",
    summary="Run a snippet in a fresh sandbox from the warm pool (a workload credential of the project only)",
    responses={200: {"model": ExecuteResult, "description": "The snippet ran (or was killed; see `killed`)."},
               400: {"description": CODE.timeout_message + "; code is required; unsupported 'language'"},
               401: {"description": "no credential"}, 403: {"description": "not a workload credential"},
               404: {"description": "another project's workload"},
               503: {"description": "no warm sandbox pod available, try again shortly"}},
    openapi_extra={"requestBody": {"required": True,
                                   "content": {"application/json": {"schema": inline_schema(ExecuteRequest)}}}},
)
async def execute(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                  platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    platform.code_sandbox.authorize(principal, project_id)  # who, before reading a body
    body = await json_body(request, CODE.body_bytes)
    return await platform.code_sandbox.execute(principal, project_id, body)


@router.post(
    "/v1/projects/{project_id}/sandbox/tool-calls",
    summary="Run one of the calling agent's own tool functions in a fresh sandbox (agents with TOOL_SANDBOX set)",
    responses={200: {"description": "`{result}` or `{error}`, with `killed`, `message`, `duration_ms`, `startup_ms`"},
               400: {"description": TOOL.timeout_message}, 403: {"description": "not an agent's workload credential"},
               413: {"description": "body over 1 MiB"}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["module_path", "function"],
        "properties": {"module_path": {"type": "string", "description": "a .py file of the agent's code"},
                       "function": {"type": "string"}, "args": {"type": "object"},
                       "timeout_s": {"type": "integer", "minimum": 1, "maximum": 120, "default": 30}}}}}}},
)
async def tool_call(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    platform.code_sandbox.authorize(principal, project_id)
    body = await json_body(request, TOOL.body_bytes)
    return await platform.tool_sandbox.call(principal, project_id, body)
