"""Static reading of tool source: declared credential keys and docstring parameter descriptions."""

from __future__ import annotations

from caiplatform.mcp.server import parse_docstring
from caiplatform.mcp.source import check_tool_source, decorator_credential_keys


def test_decorator_credential_keys():
    assert decorator_credential_keys('from caiplatform import mcp\n@mcp.tool(credential_keys=["A", "B"])\ndef f(): pass\n') == ["A", "B"]
    assert decorator_credential_keys("@tool(credential_keys=('X',))\nasync def f(): pass\n") == ["X"]
    assert decorator_credential_keys("@tool\ndef f(): pass\n") == []
    assert decorator_credential_keys("def f(:") == []


def test_google_and_sphinx_docstrings():
    google = "Add two numbers.\n\nArgs:\n    a: the first\n        and only.\n    b (int): second\n\nReturns:\n    the sum\n"
    assert parse_docstring(google) == ("Add two numbers.", {"a": "the first and only.", "b": "second"})
    assert parse_docstring("Greet.\n\n:param str name: who\n:returns: text") == ("Greet.", {"name": "who"})
    assert parse_docstring("Two\nlines.") == ("Two\nlines.", {})
    assert parse_docstring(None) == ("", {})


def test_check_tool_source():
    assert check_tool_source("add", "@tool\ndef add(): pass\n") is None
    assert check_tool_source("add", "def add(): pass\n") is None  # named like the file
    assert "exactly one" in check_tool_source("add", "@tool\ndef a(): pass\n@tool\ndef b(): pass\n")
    assert "no function decorated" in check_tool_source("add", "x = 1\n")
