"""Core API part: hosted MCP servers (document 2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from caiplatform.errors import NotFound
from caiplatform.pagination import page_body
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import KiB, MiB, json_body

router = APIRouter(prefix="/v1/projects/{projectID}/mcpservers", tags=["mcp servers"])


@router.post("", status_code=201, summary="Create an MCP server")
async def create(
    projectID: str, request: Request, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    body = await json_body(request, 4 * KiB, optional=True)
    return await platform.mcp.create(principal, projectID, body)


@router.get("", summary="List MCP servers")
async def list_servers(
    projectID: str,
    page_size: str | None = None,
    limit: str | None = None,
    page_token: str | None = None,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    page = await platform.mcp.list(principal, projectID, page_size if page_size is not None else limit, page_token)
    return page_body("mcpservers", page)


@router.get("/{name}", summary="Read an MCP server")
async def get(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    return {"mcp_server": await platform.mcp.get(principal, projectID, name)}


@router.delete("/{name}", summary="Delete an MCP server with its tools and versions")
async def delete(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    return await platform.mcp.delete(principal, projectID, name)


@router.get("/{name}/token", summary="The server's bearer token (project admins)")
async def token(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    # Not in the spec's route table, which shows no way to learn the token: see docs/decisions/mcp.md.
    return {"server": name, "token": await platform.mcp.token(principal, projectID, name)}


@router.get("/{name}/tools", summary="List the current tool set")
async def list_tools(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    return await platform.mcp.list_tools(principal, projectID, name)


@router.put("/{name}/tools/{tool}", status_code=202, summary="Publish (full replace) a tool; builds a new version")
async def publish_tool(
    projectID: str,
    name: str,
    tool: str,
    request: Request,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    body = await json_body(request, 1 * MiB, optional=True)
    return await platform.mcp.publish_tool(principal, projectID, name, tool, body)


@router.delete("/{name}/tools/{tool}", status_code=202, summary="Delete a tool; builds a new version without it")
async def delete_tool(
    projectID: str, name: str, tool: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    return await platform.mcp.delete_tool(principal, projectID, name, tool)


@router.get("/{name}/versions", summary="Versions, newest first")
async def versions(
    projectID: str, name: str, principal: Principal = Depends(principal_of), platform: Platform = Depends(platform_of)
) -> dict[str, Any]:
    return await platform.mcp.versions(principal, projectID, name)


@router.post("/{name}/versions/{version_verb}", summary="Version verbs: :rollback, :yank, :unyank")
async def version_verb(
    projectID: str,
    name: str,
    version_verb: str,
    principal: Principal = Depends(principal_of),
    platform: Platform = Depends(platform_of),
) -> dict[str, Any]:
    version, sep, verb = version_verb.partition(":")
    if not sep:
        raise NotFound("a version route needs a method suffix: :rollback, :yank or :unyank")
    return await platform.mcp.version_verb(principal, projectID, name, version, verb)
