"""The same rules through the library, without HTTP: services take the calling principal first, then
typed arguments (the request models of `caiplatform.models`), and return models."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest, Forbidden, NotFound
from caiplatform.models.accounts import ApiKeyCreate, UserCreate
from caiplatform.models.projects import MemberAdd, Project, ProjectCreate, ServiceAccountCreate
from caiplatform.principal import Principal
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD


async def test_services_enforce_the_same_rules(platform, world):
    signed_in = await platform.auth.login(ADMIN_EMAIL, ADMIN_PASSWORD, client_ip=None)
    admin = await platform.auth.authenticate(signed_in.token)
    assert (await platform.auth.me(admin)).email == ADMIN_EMAIL
    created = await platform.projects.create(admin, ProjectCreate(slug="lib-project", name="Library"))
    assert isinstance(created.project, Project) and created.project.name == "Library"
    project_id = created.project.id
    sa = await platform.service_accounts.create(admin, project_id, ServiceAccountCreate(name="lib-bot"))
    key = await platform.service_accounts.create_key(admin, project_id, "lib-bot", ApiKeyCreate())
    robot = await platform.auth.authenticate(key.secret)
    assert robot.project_id == project_id
    listed = await platform.service_accounts.list(robot, project_id)
    assert [s.name for s in listed.service_accounts] == [sa.service_account.name]
    assert listed.page_items() == listed.service_accounts
    with pytest.raises(Forbidden):
        await platform.projects.add_member(robot, project_id, MemberAdd(email=world.ids["TARGET_EMAIL"]))
    with pytest.raises(NotFound):
        await platform.projects.get(robot, world.ids["P"])
    member = await platform.auth.authenticate(world.headers["member"]["Authorization"].split()[1])
    with pytest.raises(NotFound):
        await platform.projects.quota(member, project_id)
    with pytest.raises(Forbidden):
        await platform.accounts.list_users(member)
    assert (await platform.projects.get(Principal.automation(), project_id)).slug == "lib-project"


def test_request_models_keep_the_spec_messages_and_refuse_unknown_fields():
    with pytest.raises(BadRequest, match="^invalid slug"):
        ProjectCreate.parse({"slug": "Not A Slug"})
    with pytest.raises(BadRequest, match='^unknown field "nmae"$'):
        ProjectCreate.parse({"slug": "ok", "nmae": "typo"})
    with pytest.raises(BadRequest, match="^a valid e-mail address is required$"):
        UserCreate.parse({"email": "nobody"})
    with pytest.raises(BadRequest, match="^expires_in_days must be 0"):
        ApiKeyCreate.parse({"expires_in_days": "7"})
    assert ProjectCreate.parse({"slug": " Mixed-Case "}).slug == "mixed-case"
    assert ServiceAccountCreate.parse({"name": "bot", "description": "CI"}).display_name == "CI"
