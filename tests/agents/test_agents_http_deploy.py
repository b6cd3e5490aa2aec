"""Deploy, list, get, delete, redeploy and the owner gate over HTTP (document 1)."""

from __future__ import annotations

import io
import re
import tarfile
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from caiplatform.db.models import AuditEntry, Project
from caiplatform.db.models.agents import Agent, AgentFile
from caiplatform.ports.runtime import WorkloadRef

from .agents_support import FUNCTION, GRAPH, deploy, tarball, wait_settled


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


async def _post(client, headers, data, files=None, params=None):
    return await client.post("/v1/agents", params={"project": "default"} if params is None else params, headers=headers, data=data, files=files)


def _code(files=None):
    return {"code": ("code.tar.gz", tarball(files or GRAPH), "application/gzip")}


async def test_deploy_reaches_ready_with_the_agent_view(client, world):
    response = await deploy(client, world.member, "hello")
    assert response.status_code == 202
    body = response.json()
    assert body["agent"] == "hello" and body["build_id"]
    view = await wait_settled(client, world.member, "hello")
    assert view["state"] == view["status"] == "ready" and view["ready"] is True
    assert "message" not in view and "external_url" not in view
    assert view["kind"] == "agent" and view["framework"] == "langgraph" and "runtime" not in view
    assert re.fullmatch(rf"registry\.local/cai-{world.project_short}-hello@sha256:[0-9a-f]{{64}}", view["image"])
    assert view["latest_revision"] == "hello-00001"
    assert view["public_url"] == f"https://hello-{world.project_short}.apps.localhost"
    assert view["owner"] == "member@example.com"
    assert view["url"]


async def test_without_a_model_endpoint_the_deploy_and_the_view_name_the_setting(client, world, platform):
    platform.agents.settings = platform.agents.settings.model_copy(update={"model_base_url": None})
    response = await deploy(client, world.member, "nomodel")
    assert response.status_code == 202
    note = response.json()["note"]
    assert "no model endpoint is configured" in note and "MODEL_BASE_URL" in note and "--scripted-model" in note
    view = await wait_settled(client, world.member, "nomodel")
    assert view["ready"] is True and "MODEL_BASE_URL" in view["message"]  # it cannot answer: not silently fine
    # A function needs no model: nothing to say.
    assert "note" not in (await deploy(client, world.member, "fnx", FUNCTION, framework="function")).json()
    # The agent's own MODEL_BASE_URL is an endpoint too.
    env = await client.patch("/v1/agents/nomodel/env", headers=world.member, json={"set": {"MODEL_BASE_URL": "http://127.0.0.1:9/v1"}})
    assert env.status_code == 200, env.text
    assert "message" not in (await client.get("/v1/agents/nomodel", headers=world.member)).json()


async def test_function_deploy_and_default_framework(client, world):
    response = await deploy(client, world.member, "fn", FUNCTION, framework="function")
    assert response.status_code == 202
    view = await wait_settled(client, world.member, "fn")
    assert view["ready"] and view["kind"] == "function" and view["framework"] == "function" and view["runtime"] == "python"
    # No framework: adk, whose entry file is missing here, so the build fails with a readable message.
    assert (await _post(client, world.member, {"name": "plain"}, _code(GRAPH))).status_code == 202
    failed = await wait_settled(client, world.member, "plain")
    assert failed["state"] == failed["status"] == "failed" and failed["ready"] is False
    assert failed["framework"] == "adk" and "agent.py" in failed["message"]


@pytest.mark.parametrize(
    ("data", "files", "message"),
    [
        ({"name": "x", "project": "default"}, "code", "unknown form field 'project'"),
        ({"name": "Bad_Name"}, "code", "missing or invalid 'name' (must be a lowercase DNS label)"),
        ({}, "code", "missing or invalid 'name' (must be a lowercase DNS label)"),
        ({"name": "a" * 64}, "code", "missing or invalid 'name' (must be a lowercase DNS label)"),
        ({"name": "x", "framework": "rails"}, "code", "unsupported 'framework': "),
        ({"name": "x", "framework": "adk", "runtime": "python"}, "code", "'runtime' only applies to framework=function"),
        ({"name": "x", "framework": "function", "runtime": "cobol"}, "code", "unsupported 'runtime': "),
        ({"name": "x"}, None, "missing 'code' file field: "),
        ({"name": "x", "code": "not a file"}, None, "missing 'code' file field: "),
        ({"name": "x", "config": "{nope"}, "code", "invalid 'config' field: "),
        ({"name": "x", "config": '{"scaling": {"min_scale": -1}}'}, "code", "invalid 'config' field: min_scale -1 is negative"),
    ],
)
async def test_deploy_validation_messages(client, world, data, files, message):
    response = await _post(client, world.member, data, _code() if files else None)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(message)
    assert (await client.get("/v1/agents", headers=world.admin)).json()["agents"] == []


@pytest.mark.parametrize(
    ("archive", "fragment"),
    [
        (tarball(GRAPH, extra=[_link("evil", "/etc/passwd")]), "links are not allowed"),
        (tarball(GRAPH, extra=[_link("hard", "graph.py", tarfile.LNKTYPE)]), "links are not allowed"),
        (tarball({**GRAPH, "../escape.py": "x"}), "path escapes the source tree"),
        (tarball({**GRAPH, "/abs.py": "x"}), "path escapes the source tree"),
        (tarball({**GRAPH, "big.bin": b"x" * (1024 * 1024 + 1)}), "1 MiB"),
        (tarball({f"f{i}.py": "" for i in range(201)}), "more than 200 files"),
        (b"this is not gzip", "not a readable .tar.gz"),
    ],
)
async def test_deploy_refuses_bad_archives(client, world, archive, fragment):
    response = await _post(client, world.member, {"name": "x", "framework": "langgraph"},
                           {"code": ("c.tar.gz", archive, "application/gzip")})
    assert response.status_code == 400
    assert response.json()["error"].startswith("invalid 'code' archive: ") and fragment in response.json()["error"]


async def test_deploy_needs_credentials_and_multipart(client, world):
    assert (await _post(client, {}, {"name": "x"}, _code())).status_code == 401
    response = await client.post("/v1/agents", headers=world.member, json={"name": "x"})
    assert response.status_code == 400 and response.json()["error"].startswith("invalid multipart form: ")


async def test_upload_cap(platform, client, world):
    platform.settings.max_upload_bytes = 1000
    big = tarball({"graph.py": GRAPH["graph.py"], "noise.txt": __import__("os").urandom(1024 * 1024 + 4096)})
    response = await _post(client, world.member, {"name": "big", "framework": "langgraph"},
                           {"code": ("c.tar.gz", big, "application/gzip")})
    assert response.status_code == 413


async def test_wrapped_directory_is_unwrapped(client, world):
    buffer = io.BytesIO(tarball({"myagent/graph.py": GRAPH["graph.py"]}))
    response = await _post(client, world.member, {"name": "wrapped", "framework": "langgraph"},
                           {"code": ("c.tar.gz", buffer.getvalue(), "application/gzip")})
    assert response.status_code == 202
    assert (await wait_settled(client, world.member, "wrapped"))["ready"]
    files = (await client.get("/v1/agents/wrapped/files", headers=world.member)).json()["files"]
    assert [f["path"] for f in files] == ["graph.py"]


async def test_one_build_per_agent_and_stale_claims(platform, client, world, clock):
    assert (await deploy(client, world.member, "busy")).status_code == 202
    await wait_settled(client, world.member, "busy")
    await platform.db.run(lambda s: s.execute(update(Agent).where(Agent.name == "busy").values(build_claimed_at=clock.now())))
    again = await deploy(client, world.member, "busy")
    assert again.status_code == 409 and again.json()["error"] == "a build is already in progress for agent busy"
    redeploy = await client.post("/v1/agents/busy/redeploy", headers=world.member)
    assert redeploy.status_code == 409 and redeploy.json()["error"] == "a build is already in progress for agent busy"
    clock.advance(minutes=31)  # a crashed build's claim becomes reclaimable
    assert (await deploy(client, world.member, "busy")).status_code == 202
    view = await wait_settled(client, world.member, "busy")
    assert view["ready"] and view["latest_revision"] == "busy-00002"


async def test_redeploy_same_name_and_from_stored_source(platform, client, world):
    await deploy(client, world.member, "again")
    await wait_settled(client, world.member, "again")
    assert (await deploy(client, world.member, "again")).status_code == 202
    assert (await wait_settled(client, world.member, "again"))["latest_revision"] == "again-00002"
    response = await client.post("/v1/agents/again/redeploy", headers=world.member)
    assert response.status_code == 202
    body = response.json()
    assert body["agent"] == "again" and body["build_id"] and body["files"] == 1 and body["note"]
    assert (await wait_settled(client, world.member, "again"))["latest_revision"] == "again-00003"
    await platform.db.run(lambda s: s.execute(AgentFile.__table__.delete()))
    missing = await client.post("/v1/agents/again/redeploy", headers=world.member)
    assert missing.status_code == 400
    assert missing.json()["error"] == (
        "no source is stored for this agent - deploy it once from the CLI or upload files first"
    )


async def test_list_get_and_owner_gate(platform, client, world):
    await deploy(client, world.member, "mine")
    await deploy(client, world.member2, "theirs")
    await deploy(client, world.automation, "orphan")
    for who, name in ((world.member, "mine"), (world.member2, "theirs"), (world.automation, "orphan")):
        await wait_settled(client, who, name, project="default")

    listing = (await client.get("/v1/agents", headers=world.member)).json()
    assert [a["name"] for a in listing["agents"]] == ["mine"] and listing["next_page_token"] == ""
    everyone = {a["name"] for a in (await client.get("/v1/agents", headers=world.admin)).json()["agents"]}
    assert everyone == {"mine", "theirs", "orphan"}
    assert {a["name"] for a in (await client.get("/v1/agents", headers=world.automation)).json()["agents"]} == everyone
    assert (await client.get("/v1/agents", headers=world.outsider)).json() == {"agents": [], "next_page_token": ""}
    paged = (await client.get("/v1/agents", headers=world.admin, params={"page_size": 2})).json()
    assert len(paged["agents"]) == 2 and paged["next_page_token"]
    rest = (await client.get("/v1/agents", headers=world.admin, params={"page_token": paged["next_page_token"]})).json()
    assert len(rest["agents"]) == 1 and rest["next_page_token"] == ""
    assert (await client.get("/v1/agents", headers=world.admin, params={"page_size": 201})).status_code == 400
    assert (await client.get("/v1/agents", headers=world.admin, params={"page_token": "junk"})).status_code == 400
    assert (await client.get("/v1/agents", headers={})).status_code == 401

    other = await client.get("/v1/agents/theirs", headers=world.member)
    assert other.status_code == 404 and other.json()["error"] == "unknown agent: theirs"
    assert (await client.get("/v1/agents/nothing", headers=world.member)).json()["error"] == "unknown agent: nothing"
    assert (await client.get("/v1/agents/mine", headers=world.outsider, params={"project": "default"})).status_code == 404
    orphan = await client.get("/v1/agents/orphan", headers=world.member)
    assert orphan.status_code == 403 and "only a project admin" in orphan.json()["error"]
    assert (await client.get("/v1/agents/orphan", headers=world.admin)).json()["owner"] == ""
    assert (await client.get("/v1/agents/theirs", headers=world.admin)).status_code == 200
    # A project admin adopts an agent without a recorded owner by redeploying it.
    assert (await deploy(client, world.admin, "orphan")).status_code == 202
    assert (await wait_settled(client, world.admin, "orphan"))["owner"] == "boss@example.com"
    # Someone else's name cannot be taken over by a plain member.
    assert (await deploy(client, world.member, "theirs")).status_code == 409


async def test_project_pinning_and_names_in_several_projects(platform, client, world):
    short = world.project_short
    assert (await deploy(client, world.admin, "twin", project="default")).status_code == 202
    assert (await deploy(client, world.admin, "twin", project="other")).status_code == 202
    await wait_settled(client, world.admin, "twin", project="default")
    await wait_settled(client, world.admin, "twin", project="other")
    ambiguous = await client.get("/v1/agents/twin", headers=world.admin)
    assert ambiguous.status_code == 409 and "?project=" in ambiguous.json()["error"]
    for ref in ("default", short, world.project_id):
        view = await client.get("/v1/agents/twin", headers=world.admin, params={"project": ref})
        assert view.status_code == 200 and view.json()["project_id"] == world.project_id
    unresolved = await _post(client, world.admin, {"name": "where", "framework": "langgraph"}, _code(), params={})
    assert unresolved.status_code == 409 and "?project=" in unresolved.json()["error"]
    # A member of one project needs no ?project=.
    assert (await _post(client, world.member, {"name": "auto", "framework": "langgraph"}, _code(), params={})).status_code == 202
    assert (await client.get("/v1/agents/twin", headers=world.admin, params={"project": "nope"})).status_code == 404


async def test_cloud_credential_gate(platform, client, world):
    def unmap(session):
        project = session.get(Project, world.project_id)
        project.settings = {**(project.settings or {}), "platform_cloud": None}

    await platform.db.run(unmap)
    response = await deploy(client, world.member, "nocloud")
    assert response.status_code == 409 and "no cloud credential mapped" in response.json()["error"]
    assert (await client.get("/v1/agents/nocloud", headers=world.member)).status_code == 404


async def test_delete_removes_everything_and_audits(platform, client, world):
    await deploy(client, world.member, "gone")
    await wait_settled(client, world.member, "gone")
    await client.patch("/v1/agents/gone/secrets", headers=world.member, json={"set": {"K": "v"}})
    response = await client.delete("/v1/agents/gone", headers=world.member)
    assert response.status_code == 200 and response.json() == {"agent": "gone", "deleted": True}
    assert (await client.get("/v1/agents/gone", headers=world.member)).status_code == 404
    assert await platform.runtime.status(WorkloadRef(world.project_id, world.project_short, "gone")) is None
    left = await platform.db.run(lambda s: s.scalar(select(Agent).where(Agent.name == "gone")))
    assert left is None
    actions = await platform.db.run(lambda s: [a.action for a in s.scalars(select(AuditEntry).where(AuditEntry.target == "gone"))])
    assert "agent.deploy" in actions and "agent.delete" in actions
    # The name is free again.
    assert (await deploy(client, world.member, "gone")).status_code == 202
    assert (await wait_settled(client, world.member, "gone"))["latest_revision"] == "gone-00001"


async def test_deploy_applies_config_to_first_revision(platform, client, world):
    response = await deploy(client, world.member, "tuned", config='{"scaling": {"min_scale": 0, "max_scale": 3}, "timeout_seconds": 30}')
    assert response.status_code == 202
    await wait_settled(client, world.member, "tuned")
    body = (await client.get("/v1/agents/tuned/config", headers=world.member)).json()
    assert body == {"agent": "tuned", "config": {"scaling": {"min_scale": 0, "max_scale": 3}, "timeout_seconds": 30}}


async def test_stale_claims_do_not_block_forever(platform, client, world, clock):
    """A build claim is held in the database, so a second server replica sees it too."""
    await deploy(client, world.member, "held")
    await wait_settled(client, world.member, "held")
    claimed_at = clock.now() - timedelta(minutes=29)
    await platform.db.run(lambda s: s.execute(update(Agent).where(Agent.name == "held").values(build_claimed_at=claimed_at)))
    assert (await deploy(client, world.member, "held")).status_code == 409
    clock.advance(minutes=2)
    assert (await deploy(client, world.member, "held")).status_code == 202


async def test_malformed_multipart(client, world):
    response = await client.post("/v1/agents", headers={**world.member, "Content-Type": "multipart/form-data"},
                                 content=b"garbage")
    assert response.status_code == 400 and response.json()["error"].startswith("invalid multipart form: ")
    response = await client.post("/v1/agents", headers={**world.member, "Content-Type": "multipart/form-data; boundary=xyz"},
                                 content=b"--xyz\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nabc\r\n--xyz--\r\n")
    assert response.status_code == 400 and response.json()["error"].startswith("missing 'code' file field: ")


async def test_concurrent_first_deploys_of_one_name(client, world):
    import asyncio

    responses = await asyncio.gather(*(deploy(client, world.member, "race") for _ in range(3)))
    codes = sorted(r.status_code for r in responses)
    assert codes[0] == 202 and set(codes[1:]) <= {202, 409}
    assert all(r.json()["error"] == "a build is already in progress for agent race" for r in responses if r.status_code == 409)
    assert (await wait_settled(client, world.member, "race"))["ready"]


async def test_someone_elses_agent_of_the_same_name_does_not_make_a_name_ambiguous(platform, client, world):
    from caiplatform.db.models import ProjectMember

    def join_other(session):
        from sqlalchemy import select as sa_select

        from caiplatform.db.models import User

        member = session.scalar(sa_select(User).where(User.email == "member@example.com"))
        session.add(ProjectMember(project_id=world.other_project_id, user_id=member.id, role="member",
                                  created_at=platform.clock.now()))

    await platform.db.run(join_other)
    assert (await deploy(client, world.member, "same", project="default")).status_code == 202
    assert (await deploy(client, world.admin, "same", project="other")).status_code == 202
    await wait_settled(client, world.member, "same", project="default")
    view = await client.get("/v1/agents/same", headers=world.member)
    assert view.status_code == 200 and view.json()["project_id"] == world.project_id


async def test_a_malformed_name_in_a_path_is_400(client, world):
    for path in ("/v1/agents/Bad_Name", "/v1/agents/Bad_Name/env", "/v1/agents/-x/revisions"):
        response = await client.get(path, headers=world.member)
        assert response.status_code == 400 and response.json()["error"] == "invalid agent name (must be a lowercase DNS label)"


async def test_a_caller_without_projects_resolves_to_no_project(client, world):
    response = await _post(client, world.outsider, {"name": "lost", "framework": "langgraph"}, _code(), params={})
    assert response.status_code == 409
    assert response.json()["error"] == "request resolved to no project: add ?project=<slug> or use a project-scoped credential"
