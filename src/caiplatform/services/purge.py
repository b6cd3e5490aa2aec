"""Removing what a project being deleted holds (the areas' `purge_project`), one resource at a time."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def remove_each(kind: str, items: Iterable[T], name: Callable[[T], str],
                      remove: Callable[[T], Awaitable[Any]]) -> int:
    """`remove` every item, best effort: one that fails is logged and does not keep the others.
    Returns how many were removed."""
    removed = 0
    for item in items:
        try:
            await remove(item)
        except Exception:  # noqa: BLE001 - the project goes anyway; a leftover is logged, not fatal
            log.exception("removing %s %s of a deleted project failed", kind, name(item))
        else:
            removed += 1
    return removed
