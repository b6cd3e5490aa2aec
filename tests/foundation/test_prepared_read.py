"""`PreparedRead` gives the rows SQLAlchemy's own execution gives: same values, same types, same names."""

from __future__ import annotations

from sqlalchemy import select

from caiplatform.db.models import User
from caiplatform.services.agents.lookup import CANDIDATES
from caiplatform.services.auth import SESSION_ACCOUNT
from caiplatform.testing.http import asgi_client, login
from tests.agents.agents_support import FUNCTION, deploy


def _same(platform, prepared, params) -> list:
    ours = platform.db.read_sync(lambda c: prepared.all(c, params))
    theirs = platform.db.read_sync(lambda c: c.execute(prepared.statement, params).all())
    assert [tuple(row) for row in ours] == [tuple(row) for row in theirs]
    assert [[type(v) for v in row] for row in ours] == [[type(v) for v in row] for row in theirs]
    assert all(row._fields == tuple(other._fields) for row, other in zip(ours, theirs, strict=True))
    return ours


async def test_rows_are_the_ones_execute_gives(platform):
    async with asgi_client(platform) as client:
        token = await login(client)
        assert (await deploy(client, token, "bot", FUNCTION, framework="function")).status_code == 202
    user_id = platform.db.read_sync(lambda c: c.execute(select(User.id)).scalar())
    (account,) = _same(platform, SESSION_ACCOUNT, {"id": user_id})
    assert account.must_change_password is False and account.id == user_id
    assert _same(platform, SESSION_ACCOUNT, {"id": "nobody"}) == []
    (candidate,) = _same(platform, CANDIDATES, {"name": "bot", "grant_user": user_id})  # JSON, timestamps, EXISTS
    assert (candidate.env == {} and candidate.created_at.tzinfo is not None
            and candidate.grant_org_admin in (True, False))
    assert _same(platform, CANDIDATES, {"name": "bot", "grant_user": None})[0].grant_user_role is None
