"""The authorization matrix: every identity route × every kind of principal → the expected status.

ONE table drives it. Columns follow `world.PRINCIPALS`: anonymous, invalid credential, member of P,
project admin of P, org admin of P's org, platform admin without grants, platform admin with an active
break-glass grant on P, service-account key of P (admin grant), workload key of P, automation token,
member of P who still owes a password change, member of another project. Each cell runs on a fresh
tenancy (`world.build_world`, put back by `world.Tenancies` after every accepted request), so destructive
routes are checked from every principal. A 404 in the table means the route must not reveal the project:
never a 200 (or a 403) there.
"""

from __future__ import annotations

import json

import pytest

from .world import PRINCIPALS, Tenancies

PLATFORM = "401 401 403 403 403 200 200 403 403 200 403 403"
SESSION = "401 401 200 200 200 200 200 200 403 200 403 200"
VISIBLE = "401 401 200 200 200 200 200 200 403 200 403 404"
METADATA_ADMIN = "401 401 403 200 200 200 200 403 403 200 403 404"
RESOURCE_MEMBER = "401 401 200 200 200 403 200 200 403 200 403 404"
RESOURCE_ADMIN = "401 401 403 200 200 403 200 403 403 200 403 404"


def created(row: str) -> str:
    return row.replace("200", "201")


P = "/v1/projects/{P}"

# (method, path, body, expected statuses in PRINCIPALS order)
MATRIX: list[tuple[str, str, dict | None, str]] = [
    ("GET", "/v1/auth/me", None, "401 401 200 200 200 200 200 200 200 200 200 200"),
    # users (platform admin; creation also by org and project admins, in their own org)
    ("GET", "/v1/users", None, PLATFORM),
    ("POST", "/v1/users", {"email": "new-{TAG}@example.com", "password": "a long enough password"},
     "401 401 403 201 201 201 201 403 403 201 403 403"),
    ("PATCH", "/v1/users/{TARGET_EMAIL}", {"role": "user"}, PLATFORM),
    ("DELETE", "/v1/users/{TARGET_EMAIL}", None, PLATFORM),
    ("POST", "/v1/users/{TARGET_EMAIL}/reset-password", None, PLATFORM),
    # organizations
    ("GET", "/v1/orgs", None, PLATFORM),
    ("POST", "/v1/orgs", {"slug": "n-{TAG}", "name": "New"}, created(PLATFORM)),
    ("DELETE", "/v1/orgs/{EMPTY_ORG}", None, PLATFORM),
    ("GET", "/v1/orgs/{ORG}/members", None, PLATFORM),
    ("POST", "/v1/orgs/{ORG}/members", {"email": "{OWES_EMAIL}"}, created(PLATFORM)),
    ("PATCH", "/v1/orgs/{ORG}/members/{TARGET_ID}", {"role": "member"}, PLATFORM),
    ("DELETE", "/v1/orgs/{ORG}/members/{TARGET_ID}", None, PLATFORM),
    # personal keys: people only; someone else's key id is 404
    ("GET", "/v1/users/me/keys", None, "401 401 200 200 200 200 200 403 403 403 403 200"),
    ("POST", "/v1/users/me/keys", {"display_name": "laptop"}, "401 401 201 201 201 201 201 403 403 403 403 201"),
    ("DELETE", "/v1/users/me/keys/{TARGET_KEY}", None, "401 401 404 404 404 404 404 403 403 403 403 404"),
    # projects
    ("GET", "/v1/projects", None, SESSION),
    ("POST", "/v1/projects", {"slug": "c-{TAG}", "name": "C", "org_id": "{ORG}"},
     "401 401 403 403 201 201 201 403 403 201 403 403"),
    ("GET", P, None, VISIBLE),
    ("PATCH", P, {"name": "Renamed"}, METADATA_ADMIN),
    ("DELETE", P, None, METADATA_ADMIN),
    ("GET", P + "/platform-cloud", None, VISIBLE),
    ("PUT", P + "/platform-cloud", {"provider": "local"}, METADATA_ADMIN),
    ("DELETE", P + "/platform-cloud", None, METADATA_ADMIN),
    # members, service-account grants, break-glass
    ("GET", P + "/members", None, VISIBLE),
    ("POST", P + "/members", {"email": "{OTHER_EMAIL}"}, created(METADATA_ADMIN)),
    ("PATCH", P + "/members/{TARGET_ID}", {"role": "admin"}, METADATA_ADMIN),
    ("DELETE", P + "/members/{TARGET_ID}", None, METADATA_ADMIN),
    ("PATCH", P + "/members/service-accounts/{SA2}", {"role": "admin"}, METADATA_ADMIN),
    ("DELETE", P + "/members/service-accounts/{SA2}", None, METADATA_ADMIN),
    ("POST", P + "/break-glass", {"reason": "investigating an outage"}, "401 401 403 403 403 201 403 403 403 403 403 404"),
    # invitations
    ("GET", P + "/invitations", None, VISIBLE),
    ("POST", P + "/invitations", {"email": "guest-{TAG}@example.com", "role": "member"}, created(METADATA_ADMIN)),
    ("DELETE", P + "/invitations/{INV}", None, METADATA_ADMIN),
    ("GET", "/v1/invitations/{INV_TOKEN}", None, " ".join(["200"] * len(PRINCIPALS))),
    ("POST", "/v1/invitations/accept", {"token": "{INV_TOKEN}", "password": "a long enough password"},
     " ".join(["200"] * len(PRINCIPALS))),
    # service accounts: listing needs membership (resource axis), management resource admin and a person
    ("GET", P + "/service-accounts", None, RESOURCE_MEMBER),
    ("POST", P + "/service-accounts", {"name": "bot-{TAG}"}, created(RESOURCE_ADMIN)),
    ("DELETE", P + "/service-accounts/{SA2}", None, RESOURCE_ADMIN),
    ("GET", P + "/service-accounts/{SA2}/keys", None, RESOURCE_MEMBER),
    ("POST", P + "/service-accounts/{SA2}/keys", {"display_name": "ci"}, created(RESOURCE_ADMIN)),
    ("DELETE", P + "/service-accounts/{SA2}/keys/{SA2_KEY}", None, RESOURCE_ADMIN),
    # quota, audit, search, profile, operator
    ("GET", P + "/quota", None, RESOURCE_MEMBER),
    ("GET", P + "/audit", None, RESOURCE_MEMBER),
    ("GET", "/v1/search?q=p-", None, SESSION),
    ("GET", "/v1/profile", None, SESSION),
    ("PUT", "/v1/profile/model-key", {"api_key": "sk-test"}, PLATFORM),
    ("DELETE", "/v1/profile/model-key", None, PLATFORM),
    ("POST", "/v1/admin/valkey-acl/backfill", None, PLATFORM),
]


def _fill(value, ids):
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("method", "path", "body", "expected"), MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
async def test_matrix(platform, client, settings, clock, method, path, body, expected):
    statuses = [int(s) for s in expected.split()]
    assert len(statuses) == len(PRINCIPALS)
    failures = []
    world = None
    with Tenancies(platform, settings.automation_token) as tenancies:
        for principal, want in zip(PRINCIPALS, statuses, strict=True):
            if path.startswith("/v1/invitations"):
                clock.advance(minutes=16)  # accept is sign-in throttled: give every principal a fresh window
            if world is None:
                # A refused request changes nothing, so the next principal may reuse the same tenancy.
                world = tenancies.fresh()
            url = _fill(path, world.ids)
            content = json.dumps(_fill(body, world.ids)) if body is not None else None
            response = await client.request(method, url, headers=world.headers[principal], content=content)
            if response.is_success:
                world = None
            if response.status_code != want:
                failures.append(f"{principal}: want {want}, got {response.status_code} {response.text[:160]}")
            if want == 404:
                assert response.status_code == 404, f"{principal} must not see the project: {response.text}"
    assert not failures, "\n".join(failures)
