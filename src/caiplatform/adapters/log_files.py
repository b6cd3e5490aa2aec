"""Saved log history kept as JSON lines (one `LogLine` a line), shared by the local and Kubernetes runtimes.

`erase_lines` is the erasure of a user's lines (`caiplatform.services.erasures`): the file is rewritten
without them into a temporary file that replaces it, so a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def erase_lines(path: Path, matches: Callable[[str], bool]) -> int:
    """Rewrite `path` without the lines whose message `matches`; how many lines went (0: file untouched)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return 0
    kept: list[str] = []
    gone = 0
    for raw in text.splitlines():
        try:
            message = str(json.loads(raw).get("message", ""))
        except (ValueError, AttributeError):
            message = raw  # a line we cannot read is judged on its raw text
        if matches(message):
            gone += 1
        else:
            kept.append(raw + "\n")
    if gone:
        tmp = path.with_suffix(".jsonl.erasing")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return gone
