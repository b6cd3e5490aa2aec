"""Every resource method of the client against the in-process app and, in the end-to-end group, against a
live `caiplatform serve` (issue 20), as the admin of a project full of objects (`tests/world_support.py`):
each call either answers (decoded into the models the document names) or raises the platform's own error.
A decoding failure, a wrong URL (404 where the world has the object) or any other exception fails the
test. Reads run first, then writes, then deletes."""

from __future__ import annotations

import inspect
import re

import anyio.from_thread
import httpx
import pytest

from caiplatform.client import AsyncClient
from caiplatform.client.operations import OPERATIONS
from caiplatform.errors import NotFound, PlatformError
from caiplatform.testing.serve import ServeProcess

ORDER = {"GET": 0, "POST": 1, "PUT": 1, "PATCH": 1, "DELETE": 2}
# Operations whose objects the world does not hold, or that need a credential the admin is not (a
# workload key, an embed key, a preview token): a 404 or 403 is their expected answer here.
NOT_IN_THE_WORLD = re.compile(r"/v1/embed/\{key\}|/invitations/(\{token\}|accept)|sandbox/|/sessions/\{session_id\}|"
                              r"/files/\{path\}|widget-\{version\}|/mcpservers/\{name\}|/keys/\{keyID\}|"
                              r"/invitations/\{invitationID\}|/members/|service-accounts/\{sa\}|users/\{email\}|"
                              r"orgs/\{orgID\}|/secret-maps/\{env_name\}|/tools/\{tool\}|versions/\{version_verb\}|"
                              r"/erasures/\{erasureID\}")


async def _call(method, args):  # type: ignore[no-untyped-def]
    result = method(*args)
    if inspect.isawaitable(result):
        return await result
    return [item async for item in result]


def test_every_resource_method_answers_a_model_or_a_platform_error(world):
    portal, w = world
    from caiplatform_server.app import create_app

    transport = httpx.ASGITransport(app=create_app(w.platform, manage_lifecycle=False))
    token = w.headers["Authorization"].split(" ", 1)[1]
    walk(portal, w, AsyncClient("http://testserver", token=token, transport=transport, max_retries=0))


@pytest.mark.e2e
def test_every_resource_method_against_a_live_server(tmp_path):
    from tests.world_support import World

    env = {"RATELIMIT_RPS": "100000", "RATELIMIT_BURST": "100000", "CAI_INTERNAL_TOKEN": "internal-for-fuzz"}
    with ServeProcess(tmp_path / "data", env=env) as server, anyio.from_thread.start_blocking_portal() as portal:
        w = portal.call(World.served, server.base_url)
        try:
            token = w.headers["Authorization"].split(" ", 1)[1]
            walk(portal, w, AsyncClient(server.base_url, token=token, max_retries=0))
        finally:
            portal.call(w.aclose)


def walk(portal, w, client) -> None:  # type: ignore[no-untyped-def]
    failures: list[str] = []
    answered = 0
    operations = sorted(OPERATIONS.items(), key=lambda item: (ORDER[item[0][0]], item[0][1].count("/"), item[0][1]))
    for (http_method, path), names in operations:
        if path in ("/v1/projects/{projectID}",) and http_method == "DELETE":
            continue  # the world's own project: every later call would only see 404s
        for name in names:
            method = getattr(getattr(client, name.resource), name.method)
            params = [p for p in inspect.signature(method).parameters.values()
                      if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.name != "body"]
            templates = re.findall(r"\{([^}]+)\}", path)
            args = [w.path_value(path, template) or "thing" for template in templates if template != "verb"]
            args = [a.split(":")[0] if name.verb else a for a in args][: len(params)]
            try:
                portal.call(_call, method, args)
                answered += 1
            except NotFound as exc:
                if not NOT_IN_THE_WORLD.search(path) and http_method != "DELETE":
                    failures.append(f"{http_method} {path} ({name.method}): 404 {exc.message}")
            except PlatformError:
                pass
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                failures.append(f"{http_method} {path} ({name.method}): {type(exc).__name__}: {exc}"[:400])
    portal.call(client.aclose)
    assert not failures, "\n".join(failures)
    assert answered >= 60, answered
