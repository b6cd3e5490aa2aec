"""caiplatform: an agent platform delivered as a Python library.

    from caiplatform import Platform, Principal
    platform = Platform.in_memory()

The names below are imported on first use, so that `import caiplatform` stays cheap for a workload's
harness, which imports a small part of the package at every cold start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Platform": "caiplatform.platform",
    "Settings": "caiplatform.settings",
    "Principal": "caiplatform.principal",
    "PrincipalKind": "caiplatform.principal",
    "PlatformError": "caiplatform.errors",
    "BadRequest": "caiplatform.errors",
    "Unauthenticated": "caiplatform.errors",
    "Forbidden": "caiplatform.errors",
    "NotFound": "caiplatform.errors",
    "MethodNotAllowed": "caiplatform.errors",
    "Conflict": "caiplatform.errors",
    "Gone": "caiplatform.errors",
    "PayloadTooLarge": "caiplatform.errors",
    "FailedDependency": "caiplatform.errors",
    "RateLimited": "caiplatform.errors",
    "InternalError": "caiplatform.errors",
    "NotSupported": "caiplatform.errors",
    "BadGateway": "caiplatform.errors",
    "Unavailable": "caiplatform.errors",
    "MissingDriver": "caiplatform.errors",
}

__all__ = [
    "__version__",
    "Platform",
    "Settings",
    "Principal",
    "PrincipalKind",
    "PlatformError",
    "BadRequest",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "Gone",
    "PayloadTooLarge",
    "FailedDependency",
    "RateLimited",
    "InternalError",
    "NotSupported",
    "BadGateway",
    "Unavailable",
    "MissingDriver",
]

if TYPE_CHECKING:
    from caiplatform.errors import (
        BadGateway,
        BadRequest,
        Conflict,
        FailedDependency,
        Forbidden,
        Gone,
        InternalError,
        MethodNotAllowed,
        MissingDriver,
        NotFound,
        NotSupported,
        PayloadTooLarge,
        PlatformError,
        RateLimited,
        Unauthenticated,
        Unavailable,
    )
    from caiplatform.platform import Platform
    from caiplatform.principal import Principal, PrincipalKind
    from caiplatform.settings import Settings


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'caiplatform' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
