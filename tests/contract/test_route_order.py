"""Every route authenticates, then authorizes, then reads the body (issue 40).

A route that reads its body first answers a caller without a credential, or one asking about a project it has
no grant to, with the body's `400`: that tells an anonymous caller which routes exist and what their bodies
look like, and tells anyone which project ids exist. So every operation of the served document is called with
a malformed body twice: with no credential (it must answer `401`) and, for a route about one project, as a
signed-in user with no grant to that project (it must answer `404`, as for a project that does not exist).

The routes meant to be called without a credential are listed below, each with its reason; the test also
checks that the document declares exactly these as callable without one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project, ProjectMember, User
from tests.openapi_support import served_document

DOCUMENT = served_document()

#: (method, path) -> why it answers without a credential
PUBLIC = {
    ("POST", "/v1/auth/login"): "signing in is how a credential is had",
    ("GET", "/v1/invitations/{token}"): "the invitation's token in the path is the credential",
    ("POST", "/v1/invitations/accept"): "the invitation's token in the body is the credential",
    ("GET", "/v1/embed/{key}/config"): "the embed key in the path is the credential of the web widget",
    ("POST", "/v1/embed/{key}/invoke"): "the embed key in the path is the credential of the web widget",
    ("GET", "/v1/embed/widget.js"): "the widget's script, loaded by any web page",
    ("GET", "/v1/embed/widget-{version}.js"): "the widget's script, loaded by any web page",
    ("GET", "/healthz"): "health probe of the load balancer",
    ("GET", "/livez"): "liveness probe of the orchestrator",
}
#: The data plane: open to anonymous callers unless the operator sets INVOKE_AUTH_REQUIRED (spec 1, Invoke), and
#: its rules validate the body (rule 1) before the agent is looked up (rule 6), so a malformed body is the same
#: 400 for an agent that exists and one that does not (no oracle).
DATA_PLANE = {
    ("POST", "/v1/agents/{name}/invoke"): "open to anonymous callers; validation before lookup (spec 1, Invoke)",
    ("POST", "/v1/agents/{name}/invoke/stream"): "the same rules as invoke (spec 1, Invoke)",
}
#: project-scoped routes whose answer to a caller without a grant is not 404, and why that tells nothing
NOT_404 = {
    ("GET", "/v1/search"): "searches only what the caller sees: a project it cannot see is an empty result",
    ("POST", "/v1/projects/{project_id}/sandbox/execute"):
        "takes only an agent's workload credential: any other caller is 403 before the project is read",
    ("POST", "/v1/projects/{project_id}/sandbox/tool-calls"):
        "takes only an agent's workload credential: any other caller is 403 before the project is read",
}

BAD_BODY = b'{"malformed": '
OPERATIONS = sorted((method.upper(), path) for path, item in DOCUMENT["paths"].items() for method in item)
PROJECT_IN_PATH = re.compile(r"^/v1/projects/\{(projectID|project_id)\}")


def _project_scoped(method: str, path: str) -> bool:
    if PROJECT_IN_PATH.match(path):
        return True
    op = DOCUMENT["paths"][path][method.lower()]
    return any(p["name"] == "project" and p["in"] == "query" for p in op.get("parameters", []))


@pytest.fixture(scope="module")
def stranger(world):
    """A signed-in user with a project of its own and no grant to the world's project."""
    portal, w = world

    async def make() -> dict[str, str]:
        platform = w.platform
        now = datetime.now(UTC)

        def run(session):  # type: ignore[no-untyped-def]
            user = User(email="stranger@example.com", password_hash="!unusable", role="user",
                        must_change_password=False, created_at=now)
            session.add(user)
            session.flush()
            home = session.scalar(select(Project).where(Project.slug == "default"))
            session.add(ProjectMember(project_id=home.id, user_id=user.id, role="admin", created_at=now))
            return user.id

        user_id = await platform.db.run(run)
        return {"Authorization": f"Bearer {platform.auth.tokens.issue(user_id, platform.clock.time())[0]}"}

    return portal.call(make)


def _call(world, method: str, path: str, headers: dict[str, str], query: dict[str, str] | None = None):
    portal, w = world
    # A route whose last segment carries a verb (`t1:publish`) takes it with POST; every other method, the name.
    url = (re.sub(r"\{([^}]+)\}", lambda m: w.path_value(path, m.group(1)) or "thing", path) if method == "POST"
           else re.sub(r"\{([^}]+)\}", lambda m: w.params.get(m.group(1), "thing"), w.fill(path, {})))
    request_headers = {**headers, "Content-Type": "application/json"}
    return portal.call(lambda: w.client.request(method, url, content=BAD_BODY, headers=request_headers,
                                                params=query))


def test_the_public_routes_are_the_ones_the_document_declares_public():
    declared = {(method.upper(), path) for path, item in DOCUMENT["paths"].items() for method, op in item.items()
                if op["security"] == []}
    assert declared == set(PUBLIC)


@pytest.mark.parametrize(("method", "path"), [op for op in OPERATIONS if op not in PUBLIC and op not in DATA_PLANE])
def test_no_credential_is_401_before_the_body_is_read(world, method, path):
    query = {"project": "fuzz"} if _project_scoped(method, path) and not PROJECT_IN_PATH.match(path) else None
    r = _call(world, method, path, {}, query)
    assert r.status_code == 401, (method, path, r.status_code, r.text)


@pytest.mark.parametrize(("method", "path"), [op for op in OPERATIONS if op not in PUBLIC and op not in DATA_PLANE
                                              and op not in NOT_404 and _project_scoped(*op)])
def test_a_project_without_a_grant_is_404_before_the_body_is_read(world, stranger, method, path):
    query = None if PROJECT_IN_PATH.match(path) else {"project": "fuzz"}
    r = _call(world, method, path, stranger, query)
    assert r.status_code == 404, (method, path, r.status_code, r.text)


def test_the_reported_case_platform_cloud_without_provider(world, stranger):
    """The issue's own probe: `{}` (no `provider`) is 401 without a credential, 404 for a project without a
    grant, and only for the project's admin the body's 400."""
    portal, w = world
    url = f"/v1/projects/{w.params['projectID']}/platform-cloud"

    def put(headers: dict[str, str]):  # type: ignore[no-untyped-def]
        return portal.call(lambda: w.client.put(url, json={}, headers=headers))

    assert put({}).status_code == 401
    assert put(stranger).status_code == 404
    r = put(w.headers)
    assert r.status_code == 400 and "provider" in r.json()["error"], r.text
