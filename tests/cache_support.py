"""Where tests keep what they build once and reuse across runs: the checkout's git-ignored
`.caiplatform/test-cache/` (or `CAI_TEST_CACHE_DIR`), never the user's home."""

from __future__ import annotations

import os
from pathlib import Path


def shared_cache_dir() -> Path:
    base = os.environ.get("CAI_TEST_CACHE_DIR")
    return Path(base) if base else Path(__file__).resolve().parents[1] / ".caiplatform" / "test-cache"
