"""The same rules through the library, without HTTP: services take the calling principal first."""

from __future__ import annotations

import pytest

from caiplatform.errors import Forbidden, NotFound
from caiplatform.principal import Principal
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD


async def test_services_enforce_the_same_rules(platform, world):
    signed_in = await platform.auth.login(ADMIN_EMAIL, ADMIN_PASSWORD, client_ip=None)
    admin = await platform.auth.authenticate(signed_in.token)
    created = await platform.projects.create(admin, {"slug": "lib-project", "name": "Library"})
    project_id = created["project"]["id"]
    sa = await platform.service_accounts.create(admin, project_id, {"name": "lib-bot"})
    key = await platform.service_accounts.create_key(admin, project_id, "lib-bot", {})
    robot = await platform.auth.authenticate(key["secret"])
    assert robot.project_id == project_id
    listed = await platform.service_accounts.list(robot, project_id)
    assert [s["name"] for s in listed["service_accounts"]] == [sa["service_account"]["name"]]
    with pytest.raises(Forbidden):
        await platform.projects.add_member(robot, project_id, {"email": world.ids["TARGET_EMAIL"]})
    with pytest.raises(NotFound):
        await platform.projects.get(robot, world.ids["P"])
    member = await platform.auth.authenticate(world.headers["member"]["Authorization"].split()[1])
    with pytest.raises(NotFound):
        await platform.projects.quota(member, project_id)
    with pytest.raises(Forbidden):
        await platform.accounts.list_users(member)
    assert (await platform.projects.get(Principal.automation(), project_id))["slug"] == "lib-project"
