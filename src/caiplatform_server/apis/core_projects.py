"""Core API part: projects, members, break-glass, invitations, service accounts, cloud mapping, quota and
audit (document 2). Every route decodes, calls one service method, encodes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.apis.core_accounts import page_size_of
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["projects"])

Caller = Depends(principal_of)
Plat = Depends(platform_of)
P = "/v1/projects/{projectID}"


@router.get("/v1/projects", summary="Projects you can see")
async def list_projects(
    page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.projects.list(principal, page_size_of(page_size, limit), page_token)


@router.post("/v1/projects", status_code=201, summary="Create a project (provisions it)")
async def create_project(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.create(principal, await json_body(request))


@router.get(P, summary="One project")
async def get_project(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.get(principal, projectID)


@router.patch(P, summary="Rename a project")
async def patch_project(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.update(principal, projectID, await json_body(request, optional=True))


@router.delete(P, summary="Delete a project")
async def delete_project(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.delete(principal, projectID)


# -- cloud-credential mapping --------------------------------------------------------------------


@router.get(P + "/platform-cloud", summary="The project's cloud-credential mapping")
async def get_cloud(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.get_cloud(principal, projectID)


@router.put(P + "/platform-cloud", summary="Map the cloud credential deploys use")
async def put_cloud(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.map_cloud(principal, projectID, await json_body(request))


@router.delete(P + "/platform-cloud", summary="Unmap the cloud credential (deploys are refused)")
async def delete_cloud(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.unmap_cloud(principal, projectID)


# -- members ------------------------------------------------------------------------------------


@router.get(P + "/members", summary="Project members, service-account grants and break-glass history")
async def list_members(
    projectID: str, page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.projects.list_members(principal, projectID, page_size_of(page_size, limit), page_token)


@router.post(P + "/members", status_code=201, summary="Grant a role to an existing account")
async def add_member(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.add_member(principal, projectID, await json_body(request))


@router.patch(P + "/members/service-accounts/{saID}", summary="Change a service account's role")
async def patch_sa_member(
    projectID: str, saID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.projects.set_sa_role(principal, projectID, saID, await json_body(request))


@router.delete(P + "/members/service-accounts/{saID}", summary="Remove a service account's grant")
async def delete_sa_member(projectID: str, saID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.remove_sa_grant(principal, projectID, saID)


@router.patch(P + "/members/{userID}", summary="Change a member's role")
async def patch_member(
    projectID: str, userID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.projects.set_member_role(principal, projectID, userID, await json_body(request))


@router.delete(P + "/members/{userID}", summary="Remove a member (also ends a break-glass grant early)")
async def delete_member(projectID: str, userID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.remove_member(principal, projectID, userID)


@router.post(P + "/break-glass", status_code=201, summary="Take an expiring, audited grant (platform admin)")
async def break_glass(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.break_glass(principal, projectID, await json_body(request, optional=True))


# -- invitations --------------------------------------------------------------------------------


@router.get(P + "/invitations", summary="Invitations of the project")
async def list_invitations(
    projectID: str, page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.projects.list_invitations(principal, projectID, page_size_of(page_size, limit), page_token)


@router.post(P + "/invitations", status_code=201, summary="Invite by e-mail (grants directly when the account exists)")
async def invite(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.invite(principal, projectID, await json_body(request))


@router.delete(P + "/invitations/{invitationID}", summary="Revoke an open invitation")
async def revoke_invitation(
    projectID: str, invitationID: str, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.projects.revoke_invitation(principal, projectID, invitationID)


# -- service accounts ---------------------------------------------------------------------------


@router.get(P + "/service-accounts", summary="Service accounts of the project")
async def list_service_accounts(
    projectID: str, page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.service_accounts.list(principal, projectID, page_size_of(page_size, limit), page_token)


@router.post(P + "/service-accounts", status_code=201, summary="Create a service account")
async def create_service_account(
    projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.service_accounts.create(principal, projectID, await json_body(request))


@router.delete(P + "/service-accounts/{sa}", summary="Delete a service account (revokes its keys)")
async def delete_service_account(projectID: str, sa: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.service_accounts.delete(principal, projectID, sa)


@router.get(P + "/service-accounts/{sa}/keys", summary="A service account's keys, newest first")
async def list_sa_keys(projectID: str, sa: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.service_accounts.list_keys(principal, projectID, sa)


@router.post(P + "/service-accounts/{sa}/keys", status_code=201, summary="Create a service-account key (secret shown once)")
async def create_sa_key(
    projectID: str, sa: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.service_accounts.create_key(principal, projectID, sa, await json_body(request, optional=True))


@router.delete(P + "/service-accounts/{sa}/keys/{keyID}", summary="Revoke a service-account key")
async def revoke_sa_key(
    projectID: str, sa: str, keyID: str, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.service_accounts.revoke_key(principal, projectID, sa, keyID)


# -- quota and audit ----------------------------------------------------------------------------


@router.get(P + "/quota", summary="Quota: used against hard, live")
async def quota(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.quota(principal, projectID)


@router.get(P + "/audit", summary="The project's audit log, newest first")
async def audit(
    projectID: str, page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.projects.audit_log(principal, projectID, page_size_of(page_size, limit), page_token)
