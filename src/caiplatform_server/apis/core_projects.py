"""Core API part: projects, members, break-glass, invitations, service accounts, cloud mapping, quota and
audit (document 2). Every route decodes, calls one service method, encodes."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.models import projects as api
from caiplatform.models.accounts import ApiKeyCreate, ApiKeyCreated, ApiKeyList, ApiKeyRevoked
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import json_body
from caiplatform_server.apis.core_accounts import MANAGERS, page_of
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import AUTOMATION_TOKEN, PEOPLE, operation, reply

router = APIRouter(tags=["projects"])

Caller = Depends(principal_of)
Plat = Depends(platform_of)
P = "/v1/projects/{projectID}"
#: membership, invitations, credentials: people (and the operator's automation token), never a service account
HUMANS = (*PEOPLE, AUTOMATION_TOKEN)
#: a route about one project: it may be absent or invisible to the caller (404)
IN_PROJECT = (403, 404)


@router.get("/v1/projects", summary="Projects you can see",
            **operation(response=api.ProjectList, paginated=True, security=MANAGERS, errors=(403,)))
async def list_projects(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.list(principal, *page_of(request)))


@router.post("/v1/projects", summary="Create a project (provisions it)",
             **operation(body=api.ProjectCreate, response=api.ProjectCreated, status=201, security=MANAGERS,
                         errors=(403, 409)))
async def create_project(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ProjectCreate.parse(await json_body(request))
    return reply(await platform.projects.create(principal, body), 201)


@router.get(P, summary="One project", **operation(response=api.Project, security=MANAGERS, errors=IN_PROJECT))
async def get_project(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.get(principal, projectID))


@router.patch(P, summary="Rename a project",
              **operation(body=api.ProjectPatch, body_required=False, response=api.ProjectUpdated, security=HUMANS,
                          errors=(*IN_PROJECT, 409)))
async def patch_project(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ProjectPatch.parse(await json_body(request, optional=True))
    return reply(await platform.projects.update(principal, projectID, body))


@router.delete(P, summary="Delete a project",
               **operation(response=api.ProjectDeleted, security=HUMANS, errors=(*IN_PROJECT, 409)))
async def delete_project(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.delete(principal, projectID))


# -- cloud-credential mapping --------------------------------------------------------------------


@router.get(P + "/platform-cloud", summary="The project's cloud-credential mapping",
            **operation(response=api.CloudMapping, security=MANAGERS, errors=IN_PROJECT))
async def get_cloud(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.get_cloud(principal, projectID))


@router.put(P + "/platform-cloud", summary="Map the cloud credential deploys use",
            **operation(body=api.CloudMappingPut, response=api.CloudMapping, security=HUMANS, errors=IN_PROJECT))
async def put_cloud(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.CloudMappingPut.parse(await json_body(request))
    return reply(await platform.projects.map_cloud(principal, projectID, body))


@router.delete(P + "/platform-cloud", summary="Unmap the cloud credential (deploys are refused)",
               **operation(response=api.CloudMapping, security=HUMANS, errors=IN_PROJECT))
async def delete_cloud(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.unmap_cloud(principal, projectID))


# -- members ------------------------------------------------------------------------------------


@router.get(P + "/members", summary="Project members, service-account grants and break-glass history",
            **operation(response=api.ProjectMemberList, paginated=True, security=MANAGERS, errors=IN_PROJECT))
async def list_members(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.list_members(principal, projectID, *page_of(request)))


@router.post(P + "/members", summary="Grant a role to an existing account",
             **operation(body=api.MemberAdd, response=api.MemberAdded, status=201, security=HUMANS,
                         errors=(*IN_PROJECT, 409)))
async def add_member(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.MemberAdd.parse(await json_body(request))
    return reply(await platform.projects.add_member(principal, projectID, body), 201)


@router.patch(P + "/members/service-accounts/{saID}", summary="Change a service account's role",
              **operation(body=api.MemberRolePatch, response=api.ServiceAccountRole, security=HUMANS, errors=IN_PROJECT))
async def patch_sa_member(
    projectID: str, saID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    body = api.MemberRolePatch.parse(await json_body(request))
    return reply(await platform.projects.set_sa_role(principal, projectID, saID, body))


@router.delete(P + "/members/service-accounts/{saID}", summary="Remove a service account's grant",
               **operation(response=api.ServiceAccountGrantRemoved, security=HUMANS, errors=IN_PROJECT))
async def delete_sa_member(projectID: str, saID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.remove_sa_grant(principal, projectID, saID))


@router.patch(P + "/members/{userID}", summary="Change a member's role",
              **operation(body=api.MemberRolePatch, response=api.MemberRoleChanged, security=HUMANS,
                          errors=(*IN_PROJECT, 409)))
async def patch_member(
    projectID: str, userID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    body = api.MemberRolePatch.parse(await json_body(request))
    return reply(await platform.projects.set_member_role(principal, projectID, userID, body))


@router.delete(P + "/members/{userID}", summary="Remove a member (also ends a break-glass grant early)",
               **operation(response=api.MemberRemoved, security=HUMANS, errors=(*IN_PROJECT, 409)))
async def delete_member(projectID: str, userID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.remove_member(principal, projectID, userID))


@router.post(P + "/break-glass", summary="Take an expiring, audited grant (platform admin)",
             **operation(body=api.BreakGlassRequest, body_required=False, response=api.BreakGlassGrant, status=201,
                         security=PEOPLE, errors=IN_PROJECT))
async def break_glass(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.BreakGlassRequest.parse(await json_body(request, optional=True))
    return reply(await platform.projects.break_glass(principal, projectID, body), 201)


# -- invitations --------------------------------------------------------------------------------


@router.get(P + "/invitations", summary="Invitations of the project",
            **operation(response=api.InvitationList, paginated=True, security=MANAGERS, errors=IN_PROJECT))
async def list_invitations(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.list_invitations(principal, projectID, *page_of(request)))


@router.post(P + "/invitations", summary="Invite by e-mail (grants directly when the account exists)",
             **operation(body=api.InvitationCreate, response=api.InvitationSent, status=201, security=HUMANS,
                         errors=(*IN_PROJECT, 409)))
async def invite(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.InvitationCreate.parse(await json_body(request))
    return reply(await platform.projects.invite(principal, projectID, body), 201)


@router.delete(P + "/invitations/{invitationID}", summary="Revoke an open invitation",
               **operation(response=api.InvitationRevoked, security=HUMANS, errors=(*IN_PROJECT, 410)))
async def revoke_invitation(
    projectID: str, invitationID: str, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    return reply(await platform.projects.revoke_invitation(principal, projectID, invitationID))


# -- service accounts ---------------------------------------------------------------------------


@router.get(P + "/service-accounts", summary="Service accounts of the project",
            **operation(response=api.ServiceAccountList, paginated=True, security=MANAGERS, errors=IN_PROJECT))
async def list_service_accounts(
    projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    return reply(await platform.service_accounts.list(principal, projectID, *page_of(request)))


@router.post(P + "/service-accounts", summary="Create a service account",
             **operation(body=api.ServiceAccountCreate, response=api.ServiceAccountCreated, status=201, security=HUMANS,
                         errors=(*IN_PROJECT, 409)))
async def create_service_account(
    projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    body = api.ServiceAccountCreate.parse(await json_body(request))
    return reply(await platform.service_accounts.create(principal, projectID, body), 201)


@router.delete(P + "/service-accounts/{sa}", summary="Delete a service account (revokes its keys)",
               **operation(response=api.ServiceAccountDeleted, security=HUMANS, errors=IN_PROJECT))
async def delete_service_account(projectID: str, sa: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.service_accounts.delete(principal, projectID, sa))


@router.get(P + "/service-accounts/{sa}/keys", summary="A service account's keys, newest first",
            **operation(response=ApiKeyList, security=MANAGERS, errors=IN_PROJECT))
async def list_sa_keys(projectID: str, sa: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.service_accounts.list_keys(principal, projectID, sa))


@router.post(P + "/service-accounts/{sa}/keys", summary="Create a service-account key (secret shown once)",
             **operation(body=ApiKeyCreate, body_required=False, response=ApiKeyCreated, status=201, security=HUMANS,
                         errors=(*IN_PROJECT, 409)))
async def create_sa_key(
    projectID: str, sa: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    body = ApiKeyCreate.parse(await json_body(request, optional=True))
    return reply(await platform.service_accounts.create_key(principal, projectID, sa, body), 201)


@router.delete(P + "/service-accounts/{sa}/keys/{keyID}", summary="Revoke a service-account key",
               **operation(response=ApiKeyRevoked, security=HUMANS, errors=IN_PROJECT))
async def revoke_sa_key(
    projectID: str, sa: str, keyID: str, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    return reply(await platform.service_accounts.revoke_key(principal, projectID, sa, keyID))


# -- quota and audit ----------------------------------------------------------------------------


@router.get(P + "/quota", summary="Quota: used against hard, live",
            **operation(response=api.ProjectQuota, security=MANAGERS, errors=IN_PROJECT))
async def quota(projectID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.quota(principal, projectID))


@router.get(P + "/audit", summary="The project's audit log, newest first",
            **operation(response=api.AuditEntryList, paginated=True, security=MANAGERS, errors=IN_PROJECT))
async def audit(projectID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.audit_log(principal, projectID, *page_of(request)))
