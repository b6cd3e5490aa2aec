"""The internal read surface: shapes, paging, required user id, 404s, internal credential."""

from __future__ import annotations

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.clock import ManualClock
from caiplatform.errors import BadRequest, NotFound, Unauthenticated, Unavailable
from caiplatform.pagination import PAGE_SIZE_MESSAGE, PAGE_TOKEN_MESSAGE, Pager
from caiplatform.ports.sessions import new_event
from caiplatform.turns.browse import USER_ID_REQUIRED, SessionBrowser, check_internal


@pytest.fixture
async def browser():
    clock = ManualClock()
    store = InMemorySessionStore(clock=clock)
    for i in range(3):
        for j in range(2):
            await store.append("bot", f"user-{i}", f"s-{i}-{j}",
                               [new_event("user", [{"text": f"hello {i}{j}"}], invocation_id="i", timestamp=clock.now())])
            clock.advance(1)
    return SessionBrowser(store, "bot", Pager(b"k" * 32))


async def test_users_and_sessions_page_with_signed_tokens(browser):
    first = await browser.users(page_size=2)
    assert [u["user_id"] for u in first["users"]] == ["user-0", "user-1"] and first["next_page_token"]
    assert first["users"][0]["session_count"] == 2
    rest = await browser.users(page_size=2, page_token=first["next_page_token"])
    assert [u["user_id"] for u in rest["users"]] == ["user-2"] and rest["next_page_token"] == ""
    sessions = await browser.sessions("user-1")
    assert [s["session_id"] for s in sessions["sessions"]] == ["s-1-0", "s-1-1"]
    assert sessions["sessions"][0]["preview"] == "hello 10" and sessions["next_page_token"] == ""
    with pytest.raises(BadRequest, match=PAGE_TOKEN_MESSAGE):
        await browser.sessions("user-1", page_token=first["next_page_token"])
    with pytest.raises(BadRequest, match=PAGE_SIZE_MESSAGE):
        await browser.users(page_size=201)
    with pytest.raises(BadRequest, match=USER_ID_REQUIRED):
        await browser.sessions(None)


async def test_transcript_and_delete(browser):
    body = await browser.transcript("s-0-0")
    assert body["events"][0]["author"] == "user" and body["user_id"] == "user-0"
    await browser.delete("s-0-0")
    with pytest.raises(NotFound, match="session s-0-0 not found"):
        await browser.transcript("s-0-0")
    with pytest.raises(NotFound, match="session s-0-0 not found"):
        await browser.delete("s-0-0")


def test_internal_credential():
    with pytest.raises(Unavailable):
        check_internal("x", None)
    with pytest.raises(Unauthenticated):
        check_internal(None, "secret")
    with pytest.raises(Unauthenticated):
        check_internal("wrong", "secret")
    check_internal("secret", "secret")
