"""Kubernetes resource quantities for the quota view.

Units on the "used" side (what `WorkloadRuntime.usage` reports): CPU in millicores, memory and
storage in bytes, everything else a count. `parse_quantity` turns a hard limit string into the same
unit; `format_quantity` prints a used value the way Kubernetes would.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(1e3),
            "M": Decimal(1e6), "G": Decimal(1e9), "T": Decimal(1e12), "P": Decimal(1e15), "E": Decimal(1e18)}


def is_cpu(resource: str) -> bool:
    return resource in ("cpu", "requests.cpu", "limits.cpu")


def is_bytes(resource: str) -> bool:
    return resource.endswith("memory") or resource.endswith("storage")


def _value(text: str) -> Decimal:
    text = text.strip()
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * factor
    for suffix in sorted(_DECIMAL, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * _DECIMAL[suffix]
    return Decimal(text)


def parse_quantity(resource: str, text: str) -> int:
    """A hard limit in the used side's unit; an unparsable value counts as 0 (unlimited)."""
    try:
        value = _value(text)
    except (InvalidOperation, ValueError):
        return 0
    if is_cpu(resource):
        value *= 1000
    return int(value)


def format_quantity(resource: str, value: int) -> str:
    if is_cpu(resource):
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if is_bytes(resource) and value:
        for suffix, factor in reversed(_BINARY.items()):
            if value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)
