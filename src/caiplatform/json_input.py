"""JSON from outside the server, decoded within limits: every request body, form field and stored value
that a caller chose goes through `decode` before any code walks it.

The standard library's decoder recurses once per nesting level, so a small body of a few thousand
brackets raises `RecursionError` (a 500) in the parser, or later in whatever walks or re-encodes the
value. `decode` refuses a value nested deeper than the limit before any caller sees it, and refuses the
literals `NaN`, `Infinity` and numbers that only parse to an infinite float, which no encoder of ours
may write back (Starlette's `JSONResponse` encodes with `allow_nan=False`).

The depth of a value that parsed is measured on the value (a walk over its containers, without
recursing); the bytes are scanned only when the parse fails, to report the nesting rather than the
parser's complaint, as a scan before the parse would. Scanning first cost 15 ms for a publish of 100
messages of 1 KiB (the string-skipping regular expression steps once per character), 50 times the parse.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # nested arrays and objects in one value (docs/decisions.md, Conventions)
MAX_INTEGER_DIGITS = 1000

# A string literal, escapes included; an unterminated one runs to the end (the parser reports it), so
# every match attempt succeeds and the scan stays linear.
_STRING = re.compile(rb'"(?:[^"\\]|\\[\s\S]?)*(?:"|\Z)')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_TO_PARENS = bytes.maketrans(b"[]{}", b"()()")
_RUNS = re.compile(rb"\(+|\)+")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_OPEN = ord("(")
# Passes before counting runs: after p passes at most one run in p characters is left.
_PASSES = 16
# Members a parsed value's walk visits before the walk gives way to counting the brackets of the bytes.
_WALK_FIRST_BUDGET = 2048


class JSONInputError(ValueError):
    """The text is not JSON the platform accepts; `str()` is the reason, for `invalid JSON body: ...`."""


def nesting_depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether some value in `raw` nests deeper than `limit` (brackets in strings ignored), without
    recursing. Each pass of `replace` removes the innermost pairs (one level, in C); the running depth of
    what is left, plus the levels removed, is the depth of the value."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    shape = _STRING.sub(b"", raw).translate(_TO_PARENS, _NOT_BRACKETS)
    removed = 0
    for _ in range(min(limit, _PASSES)):
        shorter = shape.replace(b"()", b"")
        if len(shorter) == len(shape):
            break
        shape, removed = shorter, removed + 1
    depth = removed
    for run in _RUNS.finditer(shape):
        depth += (run.end() - run.start()) * (1 if shape[run.start()] == _OPEN else -1)
        if depth > limit:
            return True
        if depth < removed:  # a closing bracket too many: the parser stops there
            return False
    return False


def value_depth_exceeds(value: Any, limit: int = MAX_DEPTH, budget: int | None = None) -> bool | None:
    """Whether a decoded value nests arrays and objects deeper than `limit`, without recursing; None when
    `budget` is given and the walk met more members than that before it could tell."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    left = budget
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        if left is not None:
            left -= len(container)
            if left < 0:
                return None
        for child in container.values() if isinstance(container, dict) else container:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _too_deep(data: bytes, value: Any, limit: int) -> bool:
    """Whether a parsed value nests deeper than `limit`. A walk over a value of few members (a publish of
    100 messages: 23 µs) costs less than counting the brackets of its bytes (57 µs for 100 KiB); a value
    of many members (a long array of numbers) is walked only when its brackets are more than `limit`."""
    if not isinstance(value, (dict, list)):
        return False
    quick = value_depth_exceeds(value, limit, _WALK_FIRST_BUDGET)
    if quick is not None:
        return quick
    return data.count(b"[") + data.count(b"{") > limit and bool(value_depth_exceeds(value, limit))


def _reject_constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JSONInputError(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INTEGER_DIGITS:
        raise JSONInputError(f"integer of {len(text)} digits is too large (limit {MAX_INTEGER_DIGITS})")
    return int(text)


def decode(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The value of `raw`, or `JSONInputError` (a `ValueError`) saying why it is refused."""
    try:
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
    except UnicodeEncodeError:
        raise JSONInputError("the text holds an unpaired UTF-16 surrogate") from None
    too_deep = f"nesting is deeper than {max_depth} levels"
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:  # the parser recurses per level: deeper than the interpreter allows
        raise JSONInputError(too_deep) from None
    except ValueError as exc:  # JSONInputError from the hooks, JSONDecodeError, UnicodeDecodeError
        # A body both too deep and malformed is refused for its depth, whichever the parser met first.
        if nesting_depth_exceeds(data, max_depth):
            raise JSONInputError(too_deep) from None
        raise (exc if isinstance(exc, JSONInputError) else JSONInputError(str(exc))) from None
    if _too_deep(data, value, max_depth):
        raise JSONInputError(too_deep)
    # `\ud800` decodes to a string no UTF-8 encoder (database, log) takes. A body without a backslash has no
    # escape at all: that test is a memchr (1 µs for 100 KiB), the pattern's search 28 µs.
    if b"\\" in data and _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise JSONInputError("a string holds an unpaired UTF-16 surrogate escape") from None
    return value


# --------------------------------------------------------------------------------------- the fast path

# An integer literal of 20 digits or more (2**64 and up: orjson reads it as a float, `json` as an int)
# starts after a bracket, comma, colon, space or minus; the long digit runs of a fraction follow a '.'.
# Digits become `d`, a '.' stays, every other byte `x`: then a plain substring search (in C) finds it.
_DIGIT_SHAPE = bytes(ord("d") if chr(b).isdigit() and b < 128 else b if b == ord(".") else ord("x") for b in range(256))
_HUGE_INTEGER_SHAPE = b"x" + b"d" * 20
_CONTAINERS = frozenset((dict, list))


def _deeper_than(value: Any, limit: int) -> bool:
    """`value_depth_exceeds`, skipping in C the members of a container that holds no container (the
    vectors of an upsert): the walk visits containers, not numbers."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        children = container.values() if isinstance(container, dict) else container
        if not _CONTAINERS.isdisjoint(map(type, children)):  # stops at the first container, builds no set
            stack.extend((child, depth + 1) for child in children if type(child) in _CONTAINERS)
    return False


def decode_fast(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`decode`, ten times faster on bodies of many numbers (a 1,000-point upsert of 384 floats: 330 ms
    through `decode`'s per-float hook, about 30 ms here), and the same answer: orjson refuses what `decode`
    refuses (NaN, Infinity, numbers that parse to an infinite float, malformed text, lone surrogate
    escapes) and on any refusal, or an integer orjson would turn into a float, the body is decoded again
    by `decode`, so every refusal keeps `decode`'s words. Depth is checked on the value as `decode` does."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a dependency; a stripped install still works
        return decode(raw, max_depth=max_depth)
    if isinstance(raw, str) or _HUGE_INTEGER_SHAPE in b"x" + raw.translate(_DIGIT_SHAPE):
        return decode(raw, max_depth=max_depth)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return decode(raw, max_depth=max_depth)
    if type(value) in _CONTAINERS and _deeper_than(value, max_depth):
        raise JSONInputError(f"nesting is deeper than {max_depth} levels")
    return value
