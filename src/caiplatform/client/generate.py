"""Write the sync client from the async one: `python -m caiplatform.client.generate` (`--check` fails
when the committed sync files differ). The same idea as `unasync` (httpcore's), with this package's names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
SOURCE, TARGET = HERE / "_async", HERE / "_sync"
HEADER = "# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.\n"

RULES: list[tuple[str, str]] = [
    (r"^import asyncio\n", ""),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basync_transport\b", "sync_transport"),
    (r"\bcaiplatform\.client\._async\b", "caiplatform.client._sync"),
]


def convert(text: str) -> str:
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return HEADER + text


def expected() -> dict[Path, str]:
    return {TARGET / path.relative_to(SOURCE): convert(path.read_text()) for path in sorted(SOURCE.rglob("*.py"))}


def main(argv: list[str]) -> int:
    wanted = expected()
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    extra = [path for path in TARGET.rglob("*.py") if path not in wanted]
    if "--check" in argv:
        for path in stale + extra:
            print(f"out of date: {path.relative_to(HERE.parent.parent)}")
        return 1 if stale or extra else 0
    for path in extra:
        path.unlink()
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
