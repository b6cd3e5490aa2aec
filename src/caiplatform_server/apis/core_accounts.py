"""Core API part: users, organizations, personal keys, invitations (anonymous side), search, profile
and the operator backfill (document 2). Every route decodes, calls one service method, encodes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.models import accounts as api
from caiplatform.models.projects import InvitationAccept, InvitationAccepted, InvitationPreview
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.contract import ANONYMOUS, AUTOMATION_TOKEN, CALLERS, PEOPLE, operation, reply

router = APIRouter(tags=["accounts"])

Caller = Depends(principal_of)
Plat = Depends(platform_of)

#: platform-admin routes: a person, or the automation token that acts for the operator
ADMINS = (*PEOPLE, AUTOMATION_TOKEN)
#: any management credential
MANAGERS = (*CALLERS, AUTOMATION_TOKEN)


def page_of(request: Request) -> tuple[str | None, str | None]:
    """`page_size` (alias `limit`) and `page_token` of a list route; the pager checks them."""
    query = request.query_params
    return query.get("page_size", query.get("limit")), query.get("page_token")


# -- users ---------------------------------------------------------------------------------------


@router.get("/v1/users", summary="List accounts (platform admin)",
            **operation(response=api.UserList, paginated=True, security=ADMINS, errors=(403,)))
async def list_users(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.list_users(principal, *page_of(request)))


@router.post("/v1/users", summary="Create an account",
             **operation(body=api.UserCreate, response=api.UserCreated, status=201, security=ADMINS, errors=(403, 409)))
async def create_user(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.UserCreate.parse(await json_body(request))
    return reply(await platform.accounts.create_user(principal, body), 201)


@router.get("/v1/users/me/keys", summary="Your personal API keys",
            **operation(response=api.ApiKeyList, security=PEOPLE, errors=(403,)))
async def list_keys(principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.personal_keys.list(principal))


@router.post("/v1/users/me/keys", summary="Create a personal API key (secret shown once)",
             **operation(body=api.ApiKeyCreate, body_required=False, response=api.ApiKeyCreated, status=201,
                         security=PEOPLE, errors=(403,)))
async def create_key(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ApiKeyCreate.parse(await json_body(request, optional=True))
    return reply(await platform.personal_keys.create(principal, body), 201)


@router.delete("/v1/users/me/keys/{keyID}", summary="Revoke a personal API key",
               **operation(response=api.ApiKeyRevoked, security=PEOPLE, errors=(403, 404)))
async def revoke_key(keyID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.personal_keys.revoke(principal, keyID))


@router.patch("/v1/users/{email}", summary="Change an account's platform role",
              **operation(body=api.UserRolePatch, response=api.UserRoleChanged, security=ADMINS, errors=(403, 404, 409)))
async def patch_user(email: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.UserRolePatch.parse(await json_body(request, optional=True))
    return reply(await platform.accounts.set_role(principal, email, body))


@router.delete("/v1/users/{email}", summary="Delete an account",
               **operation(response=api.UserDeleted, security=ADMINS, errors=(403, 404, 409)))
async def delete_user(email: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.delete_user(principal, email))


@router.post("/v1/users/{email}/reset-password", summary="Reset an account's password to a temporary one",
             **operation(no_body=True, response=api.PasswordReset, security=ADMINS, errors=(403, 404)))
async def reset_password(email: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.reset_password(principal, email))


# -- organizations ------------------------------------------------------------------------------


@router.get("/v1/orgs", summary="List organizations",
            **operation(response=api.OrgList, paginated=True, security=ADMINS, errors=(403,)))
async def list_orgs(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.list_orgs(principal, *page_of(request)))


@router.post("/v1/orgs", summary="Create an organization",
             **operation(body=api.OrgCreate, response=api.OrgCreated, status=201, security=ADMINS, errors=(403, 409)))
async def create_org(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.OrgCreate.parse(await json_body(request))
    return reply(await platform.accounts.create_org(principal, body), 201)


@router.delete("/v1/orgs/{orgID}", summary="Delete an empty organization",
               **operation(response=api.OrgDeleted, security=ADMINS, errors=(403, 404, 409)))
async def delete_org(orgID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.delete_org(principal, orgID))


@router.get("/v1/orgs/{orgID}/members", summary="List org members",
            **operation(response=api.OrgMemberList, paginated=True, security=ADMINS, errors=(403, 404)))
async def list_org_members(
    orgID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    return reply(await platform.accounts.list_org_members(principal, orgID, *page_of(request)))


def _add_org_member_contract() -> dict[str, Any]:
    kwargs = operation(body=api.OrgMemberAdd, response=api.OrgMemberChanged, status=201, security=ADMINS,
                       errors=(403, 404, 409))
    kwargs["responses"][200] = {"model": api.OrgMemberChanged, "description": "Already a member with that role"}
    return kwargs


@router.post("/v1/orgs/{orgID}/members", summary="Add an org member", **_add_org_member_contract())
async def add_org_member(orgID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.OrgMemberAdd.parse(await json_body(request))
    result = await platform.accounts.add_org_member(principal, orgID, body)
    return reply(result, 201 if result.created else 200)


@router.patch("/v1/orgs/{orgID}/members/{userID}", summary="Change an org member's role",
              **operation(body=api.OrgMemberPatch, response=api.OrgMemberChanged, security=ADMINS, errors=(403, 404, 409)))
async def patch_org_member(
    orgID: str, userID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> JSONResponse:
    body = api.OrgMemberPatch.parse(await json_body(request))
    return reply(await platform.accounts.set_org_member_role(principal, orgID, userID, body))


@router.delete("/v1/orgs/{orgID}/members/{userID}", summary="Remove an org member",
               **operation(response=api.OrgMemberRemoved, security=ADMINS, errors=(403, 404, 409)))
async def remove_org_member(orgID: str, userID: str, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.accounts.remove_org_member(principal, orgID, userID))


# -- invitations: the invitee's side (the token is the credential) --------------------------------


@router.get("/v1/invitations/{token}", summary="Preview an invitation",
            **operation(response=InvitationPreview, security=ANONYMOUS, errors=(404, 410)))
async def preview_invitation(token: str, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.projects.preview_invitation(token))


@router.post("/v1/invitations/accept", summary="Accept an invitation (creates the account when none exists)",
             **operation(body=InvitationAccept, response=InvitationAccepted, security=ANONYMOUS, errors=(404, 410)))
async def accept_invitation(request: Request, platform: Platform = Plat) -> JSONResponse:
    body = InvitationAccept.parse(await json_body(request))
    return reply(await platform.projects.accept_invitation(body, request.client.host if request.client else None))


# -- search, profile, operator ----------------------------------------------------------------------

SEARCH_QUERY = [
    {"name": "q", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "Case-insensitive substring of a name."},
    {"name": "project", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "Only this project (slug, short or id)."},
]


@router.get("/v1/search", summary="Search what you can see",
            **operation(response=api.SearchResults, paginated=True, query=SEARCH_QUERY, security=MANAGERS, errors=(403,)))
async def search(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    query = request.query_params
    return reply(await platform.search.search(principal, query.get("q"), query.get("project"), *page_of(request)))


@router.get("/v1/profile", summary="Your profile and the platform model key's presence",
            **operation(response=api.Profile, security=MANAGERS, errors=(403,)))
async def profile(principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.profile.profile(principal))


@router.put("/v1/profile/model-key", summary="Set the platform-wide default model key",
            **operation(body=api.ModelKeySet, response=api.Profile, security=ADMINS, errors=(403,)))
async def set_model_key(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    body = api.ModelKeySet.parse(await json_body(request))
    return reply(await platform.profile.set_model_key(principal, body))


@router.delete("/v1/profile/model-key", summary="Remove the platform-wide default model key",
               **operation(response=api.Profile, security=ADMINS, errors=(403,)))
async def delete_model_key(principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.profile.delete_model_key(principal))


@router.post("/v1/admin/valkey-acl/backfill", summary="Re-create every project's cache access user",
             **operation(no_body=True, response=api.CacheAclBackfill, security=ADMINS, errors=(403,)))
async def backfill(principal: Principal = Caller, platform: Platform = Plat) -> JSONResponse:
    return reply(await platform.profile.backfill_cache_acl(principal))
