"""Minted session ids and derived user ids (invoke rules 2 and 3)."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.errors import BadRequest
from caiplatform.services.invoke_ids import SHORT_SESSION_MESSAGE, derive_user_id, mint_session_id, resolve


def test_minted_session_ids_are_uuid4():
    ids = {mint_session_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_derived_user_id_is_stable_uuid5_and_distinct():
    sid = "a-session-id-that-is-long-enough"
    assert derive_user_id(sid) == derive_user_id(sid)
    assert uuid.UUID(derive_user_id(sid)).version == 5
    assert derive_user_id(sid) != derive_user_id(sid + "x")
    assert derive_user_id(sid) != sid


def test_resolve_fills_and_checks():
    ids = resolve(None, None, authenticated=False)
    assert ids.session_minted and ids.user_derived and ids.user_id == derive_user_id(ids.session_id)
    long = "x" * 24
    assert resolve(long, None, authenticated=False).user_id == derive_user_id(long)
    with pytest.raises(BadRequest, match="at least 24 characters"):
        resolve("x" * 23, None, authenticated=False)
    assert "guessable" in SHORT_SESSION_MESSAGE
    assert resolve("short", None, authenticated=True).session_id == "short"
    assert resolve("short", "alice@example.com", authenticated=True).user_id == "alice@example.com"
    with pytest.raises(BadRequest, match="invalid user_id"):
        resolve(None, "bad user!", authenticated=True)
    with pytest.raises(BadRequest):
        resolve(123, None, authenticated=True)
