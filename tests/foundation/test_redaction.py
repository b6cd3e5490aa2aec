"""What an error may tell a caller about the server: one line, no absolute path."""

from __future__ import annotations

import pytest

from caiplatform.redaction import MAX_REASON_CHARS, one_line, without_paths

TRACEBACK = """x: revision x-00001 could not start an instance: Traceback (most recent call last):
  File "/srv/venv/lib/python3.11/site-packages/starlette/routing.py", line 661, in lifespan
    async with self.lifespan_context(app) as maybe_state:
ModuleNotFoundError: No module named 'nosuch'
"""


@pytest.mark.parametrize("text,expected", [
    ("sqlite:////srv/data/sessions/p-a.sqlite3", "sqlite:.../p-a.sqlite3"),
    ('File "/usr/lib/python3/x.py", line 3', 'File ".../x.py", line 3'),
    ("open '/nonexistent/dir/' failed", "open '.../' failed"),
    ("http://127.0.0.1:8080/v1/x and https://host/a", "http://127.0.0.1:8080/v1/x and https://host/a"),
    ("GET /healthz answered 503", "GET /healthz answered 503"),
    ("./main.go:3:37: undefined", "./main.go:3:37: undefined"),
])
def test_absolute_paths_keep_only_their_last_segment(text, expected):
    assert without_paths(text) == expected


@pytest.mark.parametrize("detail,expected", [
    (TRACEBACK, "x: revision x-00001 could not start an instance: ModuleNotFoundError: No module named 'nosuch'"),
    ("Traceback (most recent call last):\n  File \"/a/b.py\", line 1\nValueError: bad", "ValueError: bad"),
    ("pod exited with code 1 while starting:\nhello\nError: Cannot find module '/srv/x/y.js'\n    at f (/srv/a.js:1:2)",
     "pod exited with code 1 while starting: Error: Cannot find module '.../y.js'"),
    ("compiling failed (exit code 2):\n# function\n./main.go:3:37: undefined: x",
     "compiling failed (exit code 2): ./main.go:3:37: undefined: x"),
    ("ValueError: asked to fail", "ValueError: asked to fail"),
    ("", ""),
])
def test_one_line_keeps_the_first_line_and_the_exception(detail, expected):
    assert one_line(detail) == expected


def test_one_line_is_bounded():
    assert len(one_line("x" * 10_000)) == MAX_REASON_CHARS
