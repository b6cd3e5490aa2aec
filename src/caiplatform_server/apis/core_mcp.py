"""Core API part: hosted MCP servers (document 2).

Routes decode, make one `McpServerService` call and write its model; the rules live in the service and
the request models (`caiplatform.models.mcp`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.errors import NotFound
from caiplatform.models.mcp import (
    McpServer,
    McpServerCreate,
    McpServerDeleted,
    McpServerEnvelope,
    McpServerList,
    McpServerToken,
    McpToolDeleted,
    McpToolList,
    McpToolPublish,
    McpToolPublished,
    McpVersionList,
    McpVersionRollback,
    McpVersionUnyank,
    McpVersionYank,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import KiB, MiB, json_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import operation, reply

router = APIRouter(prefix="/v1/projects/{projectID}/mcpservers", tags=["mcp servers"])

#: a role missing or a credential that may not manage (403); not found or not yours (404)
ERRORS = (403, 404)


@router.post("", summary="Create an MCP server",
             **operation(body=McpServerCreate, response=McpServer, status=201, errors=(*ERRORS, 409, 413)))
async def create(
    projectID: str, request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    async def body() -> McpServerCreate:  # read once the service's gate has passed
        return McpServerCreate.parse(await json_body(request, 4 * KiB, optional=True))

    return reply(await platform.mcp.create(principal, projectID, body), status=201)


@router.get("", summary="List MCP servers", **operation(response=McpServerList, paginated=True, errors=ERRORS))
async def list_servers(
    projectID: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    query = request.query_params
    return reply(await platform.mcp.list(principal, projectID, query.get("page_size", query.get("limit")),
                                         query.get("page_token")))


@router.get("/{name}", summary="Read an MCP server", **operation(response=McpServerEnvelope, errors=ERRORS))
async def get(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    return reply(McpServerEnvelope(mcp_server=await platform.mcp.get(principal, projectID, name)))


@router.delete("/{name}", summary="Delete an MCP server with its tools and versions",
               **operation(response=McpServerDeleted, errors=ERRORS))
async def delete(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    return reply(await platform.mcp.delete(principal, projectID, name))


@router.get("/{name}/token", summary="The server's bearer token (project admins)",
            **operation(response=McpServerToken, errors=ERRORS))
async def token(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    # Not in the spec's route table, which shows no way to learn the token: see docs/decisions/mcp.md.
    return reply(McpServerToken(server=name, token=await platform.mcp.token(principal, projectID, name)))


@router.get("/{name}/tools", summary="List the current tool set", **operation(response=McpToolList, errors=ERRORS))
async def list_tools(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    return reply(await platform.mcp.list_tools(principal, projectID, name))


@router.put("/{name}/tools/{tool}", summary="Publish (full replace) a tool; builds a new version",
            **operation(body=McpToolPublish, response=McpToolPublished, status=202, errors=(*ERRORS, 413)))
async def publish_tool(
    projectID: str,
    name: str,
    tool: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    async def body() -> McpToolPublish:  # read once the service's gate has passed
        return McpToolPublish.parse(await json_body(request, 1 * MiB, optional=True))

    return reply(await platform.mcp.publish_tool(principal, projectID, name, tool, body), status=202)


@router.delete("/{name}/tools/{tool}", summary="Delete a tool; builds a new version without it",
               **operation(response=McpToolDeleted, status=202, errors=ERRORS))
async def delete_tool(
    projectID: str, name: str, tool: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    return reply(await platform.mcp.delete_tool(principal, projectID, name, tool), status=202)


@router.get("/{name}/versions", summary="Versions, newest first", **operation(response=McpVersionList, errors=ERRORS))
async def versions(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> JSONResponse:
    return reply(await platform.mcp.versions(principal, projectID, name))


@router.post("/{name}/versions/{version_verb}", summary="Version verbs: :rollback, :yank, :unyank",
             **operation(response=McpVersionRollback | McpVersionYank | McpVersionUnyank, no_body=True, errors=(*ERRORS, 409)))
async def version_verb(
    projectID: str,
    name: str,
    version_verb: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> JSONResponse:
    version, sep, verb = version_verb.partition(":")
    if not sep:
        raise NotFound("a version route needs a method suffix: :rollback, :yank or :unyank")
    return reply(await platform.mcp.version_verb(principal, projectID, name, version, verb))
