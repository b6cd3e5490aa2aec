"""The README's library example runs as written and prints what its comments say (issue 19)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_library_example_runs_and_reads_model_attributes():
    section = README.read_text().split("## Use it as a library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    expected = [line.split("# ", 1)[1].strip() for line in code.splitlines() if "print(" in line and "# " in line]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})  # noqa: S102 - the documented example
    assert printed.getvalue().splitlines() == expected
