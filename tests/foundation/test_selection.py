"""The collection-time rules that give each test its kind and name what it needs (docs/testing.md)."""

from __future__ import annotations

import importlib
import types

from hypothesis import given
from hypothesis import strategies as st

from caiplatform.testing import selection

PLAIN = types.ModuleType("plain")


def test_engine_fixtures_and_engine_parameters_make_an_engine_test():
    assert selection.kind_of(["platform", "postgres_url"], {}, [PLAIN], []) == "engine"
    assert selection.kind_of(["backend_name"], {"backend_name": "openbao"}, [PLAIN], []) == "engine"
    assert selection.kind_of(["backend_name"], {"backend_name": "memory"}, [PLAIN], []) == "unit"


def test_process_fixtures_parameters_and_module_words_make_a_process_test():
    assert selection.kind_of(["harness_client"], {}, [PLAIN], []) == "process"
    assert selection.kind_of(["backend"], {"backend": "local"}, [PLAIN], []) == "process"
    assert selection.kind_of([], {}, [PLAIN], []) == "unit"
    supervised = importlib.import_module("caiplatform.supervisor.engines")  # its source starts processes
    assert selection.kind_of([], {}, [PLAIN, supervised], []) == "process"


def test_an_explicit_kind_marker_wins():
    assert selection.kind_of(["postgres_url"], {}, [PLAIN], ["unit"]) == "unit"
    assert selection.kind_of([], {}, [PLAIN], ["parametrize", "e2e"]) == "e2e"


def _deploys_a_go_function():
    return "function-go"


def _deploys_langgraph():
    return {"framework": "langgraph"}


def _keeps(*_: object):
    return lambda function: function


@_keeps("function-ruby")
def _names_in_its_decorators_and_its_last_nested_function():
    def later():
        return "nodejs"

    return later


@given(st.just(1))
def _given_deploys_go(x):
    return "go"


def test_a_body_is_its_decorators_to_its_last_line_also_behind_a_given():
    assert selection.needs_of({}, _names_in_its_decorators_and_its_last_nested_function, None) == {"ruby", "node"}
    assert selection.needs_of({}, _given_deploys_go, None) == {"go"}


def test_needs_come_from_parameters_the_body_or_an_explicit_marker():
    assert selection.needs_of({"framework": "function-ruby"}, None, None) == {"ruby"}
    assert selection.needs_of({}, _deploys_a_go_function, None) == {"go"}
    assert selection.needs_of({}, _deploys_langgraph, None) == {"agents"}
    assert selection.needs_of({"framework": "function-ruby"}, _deploys_a_go_function, []) == set()
    assert selection.needs_of({}, None, ["node"]) == {"node"}


def test_a_missing_toolchain_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    selection.available.cache_clear()
    try:
        assert selection.missing_needs({"go", "ruby"}) == ["go", "ruby"]
    finally:
        selection.available.cache_clear()


def test_modules_that_cannot_hold_a_unit_test_are_known_from_their_source():
    # (the words are split here: this module's own source must not name them, or its tests are not `unit`)
    starts_processes, starts_engines = "Process" + "Supervisor", "engine" + "_url"
    assert selection.never_unit(f"from caiplatform.supervisor.process import {starts_processes}\n")
    assert selection.never_unit(f"url = {starts_engines}('postgres')\n")
    assert selection.never_unit("import pytest\n\npytestmark = pytest.mark.e2e\n")
    assert not selection.never_unit("async def test_x(client):\n    pass\n")
    # one explicit `unit` test keeps the module in a `-m unit` run
    assert not selection.never_unit(f"import {'sub' + 'process'}\n\n@pytest.mark.unit\ndef test_x():\n    pass\n")
