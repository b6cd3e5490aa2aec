"""Settings for a test, built once per set of values and environment, copied for each test.

pydantic-settings reads every field from every source (environment, dotenv, secrets) on each `Settings(...)`,
about 5 ms of CPU, and most tests make one. The cache key includes the process environment, so a test that
sets `MODEL_BASE_URL` (say) before its settings are made still gets what the environment says; each test
gets a deep copy it may change.
"""

from __future__ import annotations

import os
from typing import Any

from caiplatform.settings import Settings

_built: dict[tuple[Any, ...], Settings] = {}


def settings_for(**values: Any) -> Settings:
    key = (tuple(sorted(values.items())), tuple(sorted(os.environ.items())))
    if key not in _built:
        _built[key] = Settings(**values)
    return _built[key].model_copy(deep=True)
