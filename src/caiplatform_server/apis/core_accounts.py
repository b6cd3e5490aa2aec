"""Core API part: users, organizations, personal keys, invitations (anonymous side), search, profile
and the operator backfill (document 2). Every route decodes, calls one service method, encodes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

router = APIRouter(tags=["accounts"])

Caller = Depends(principal_of)
Plat = Depends(platform_of)


def page_size_of(page_size: str | None, limit: str | None) -> str | None:
    return page_size if page_size is not None else limit


# -- users ---------------------------------------------------------------------------------------


@router.get("/v1/users", summary="List accounts (platform admin)")
async def list_users(
    page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.accounts.list_users(principal, page_size_of(page_size, limit), page_token)


@router.post("/v1/users", status_code=201, summary="Create an account")
async def create_user(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.create_user(principal, await json_body(request))


@router.get("/v1/users/me/keys", summary="Your personal API keys")
async def list_keys(principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.personal_keys.list(principal)


@router.post("/v1/users/me/keys", status_code=201, summary="Create a personal API key (secret shown once)")
async def create_key(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.personal_keys.create(principal, await json_body(request, optional=True))


@router.delete("/v1/users/me/keys/{keyID}", summary="Revoke a personal API key")
async def revoke_key(keyID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.personal_keys.revoke(principal, keyID)


@router.patch("/v1/users/{email}", summary="Change an account's platform role")
async def patch_user(email: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.set_role(principal, email, await json_body(request, optional=True))


@router.delete("/v1/users/{email}", summary="Delete an account")
async def delete_user(email: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.delete_user(principal, email)


@router.post("/v1/users/{email}/reset-password", summary="Reset an account's password to a temporary one")
async def reset_password(email: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.reset_password(principal, email)


# -- organizations ------------------------------------------------------------------------------


@router.get("/v1/orgs", summary="List organizations")
async def list_orgs(
    page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.accounts.list_orgs(principal, page_size_of(page_size, limit), page_token)


@router.post("/v1/orgs", status_code=201, summary="Create an organization")
async def create_org(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.create_org(principal, await json_body(request))


@router.delete("/v1/orgs/{orgID}", summary="Delete an empty organization")
async def delete_org(orgID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.delete_org(principal, orgID)


@router.get("/v1/orgs/{orgID}/members", summary="List org members")
async def list_org_members(
    orgID: str, page_size: str | None = None, limit: str | None = None, page_token: str | None = None,
    principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.accounts.list_org_members(principal, orgID, page_size_of(page_size, limit), page_token)


@router.post("/v1/orgs/{orgID}/members", status_code=201, summary="Add an org member")
async def add_org_member(orgID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat) -> Any:
    status, body = await platform.accounts.add_org_member(principal, orgID, await json_body(request))
    return body if status == 201 else JSONResponse(body, status_code=status)


@router.patch("/v1/orgs/{orgID}/members/{userID}", summary="Change an org member's role")
async def patch_org_member(
    orgID: str, userID: str, request: Request, principal: Principal = Caller, platform: Platform = Plat
) -> dict[str, Any]:
    return await platform.accounts.set_org_member_role(principal, orgID, userID, await json_body(request))


@router.delete("/v1/orgs/{orgID}/members/{userID}", summary="Remove an org member")
async def remove_org_member(orgID: str, userID: str, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.accounts.remove_org_member(principal, orgID, userID)


# -- invitations: the invitee's side (the token is the credential) --------------------------------


@router.get("/v1/invitations/{token}", summary="Preview an invitation")
async def preview_invitation(token: str, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.projects.preview_invitation(token)


@router.post("/v1/invitations/accept", summary="Accept an invitation (creates the account when none exists)")
async def accept_invitation(request: Request, platform: Platform = Plat) -> dict[str, Any]:
    body = await json_body(request)
    return await platform.projects.accept_invitation(body, request.client.host if request.client else None)


# -- search, profile, operator ----------------------------------------------------------------------


@router.get("/v1/search", summary="Search what you can see")
async def search(
    q: str | None = None, project: str | None = None, page_size: str | None = None, limit: str | None = None,
    page_token: str | None = None, principal: Principal = Caller, platform: Platform = Plat,
) -> dict[str, Any]:
    return await platform.search.search(principal, q, project, page_size_of(page_size, limit), page_token)


@router.get("/v1/profile", summary="Your profile and the platform model key's presence")
async def profile(principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.profile.profile(principal)


@router.put("/v1/profile/model-key", summary="Set the platform-wide default model key")
async def set_model_key(request: Request, principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.profile.set_model_key(principal, await json_body(request))


@router.delete("/v1/profile/model-key", summary="Remove the platform-wide default model key")
async def delete_model_key(principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.profile.delete_model_key(principal)


@router.post("/v1/admin/valkey-acl/backfill", summary="Re-create every project's cache access user")
async def backfill(principal: Principal = Caller, platform: Platform = Plat) -> dict[str, Any]:
    return await platform.profile.backfill_cache_acl(principal)
