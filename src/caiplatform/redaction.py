"""What an error may tell a caller about the server: one line, and no path of the server's file system.

Upstream failures (an instance that would not start, an agent's import error, a turn that raised) carry
tracebacks and file paths; the caller gets `one_line(detail)`, the full text goes to the server's log
and stays in the workload's own logs.
"""

from __future__ import annotations

import re

MAX_REASON_CHARS = 500
TRACEBACK_HEADER = "Traceback (most recent call last):"

# An absolute path of two or more segments, also the one inside a `sqlite:////...` URL; not the
# authority of a `scheme://host/...` URL and not the path of a relative one.
_PATH = re.compile(r"""(?<![\w.~/-])(?!//[^/])/+(?:[^\s/'"`():,;<>\[\]]+/)+([^\s/'"`():,;<>\[\]]*)""")
# The line that ends a traceback (`ModuleNotFoundError: No module named 'x'`, `Error: Cannot find module`).
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt)\b:?.*$")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last segment (`/srv/data/x/agent.py` → `.../agent.py`)."""
    return _PATH.sub(lambda m: f".../{m.group(1)}", text)


def one_line(detail: str) -> str:
    """The caller's view of `detail`: its first line, plus the exception that ends a traceback in the
    rest of it (or, when the first line announces more with a colon, the last line: a compiler's or a
    process's final word), without server paths, at most `MAX_REASON_CHARS` long."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0].replace(TRACEBACK_HEADER, "").strip()
    exception = next((line for line in reversed(lines[1:]) if _EXCEPTION_LINE.match(line)), None)
    if exception is None and len(lines) > 1 and first.endswith(":"):
        exception = lines[-1]
    if exception is not None and exception not in first:
        first = f"{first.rstrip(':').rstrip()}: {exception}" if first else exception
    reason = without_paths(first.rstrip(":").rstrip())
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 3] + "..."
