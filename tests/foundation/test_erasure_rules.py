"""The rules of an erasure (`caiplatform.domain.erasure`): what a request may name, what marks a log line
as the user's, the steps and their order."""

from __future__ import annotations

import pytest

from caiplatform.domain import erasure
from caiplatform.errors import BadRequest


def test_user_id_and_agents_follow_the_invoke_and_agent_name_rules():
    assert erasure.check_user_id("alice-7@example.com") == "alice-7@example.com"
    for bad in (None, "", "has space", "x" * 129, 7):
        with pytest.raises(BadRequest):
            erasure.check_user_id(bad)
    assert erasure.check_agents(None) is None
    assert erasure.check_agents(["b", "a", "b"]) == ["b", "a"]
    for bad in ([], "weather", ["Bad_Name"], [1], ["a"] * 101):
        with pytest.raises(BadRequest):
            erasure.check_agents(bad)


def test_one_scope_key_per_set_of_agents():
    assert erasure.scope_key(None) == "*"
    assert erasure.scope_key(["b", "a"]) == erasure.scope_key(["a", "b"]) == "a,b"


def test_log_needles_leave_out_short_texts():
    needles = erasure.log_needles("alice", ["s-1", "s-1"], ["hi", "  my favourite colour is teal  ", ""])
    assert needles == ["alice", "s-1", "my favourite colour is teal"]


def test_sessions_are_erased_last_in_each_agent():
    steps = erasure.steps_for(["a", "b"])
    assert [s.key for s in steps] == ["a/log_history", "a/memory", "a/sessions",
                                      "b/log_history", "b/memory", "b/sessions"]
