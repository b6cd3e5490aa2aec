"""A deterministic local embedder: no model, no network, same vector for the same text on every machine.

Each lower-cased word and each character trigram of a word is hashed (BLAKE2b) to a dimension and a
sign; the counts are summed and the vector is L2-normalised. Texts sharing words or word pieces land
close together, which is enough for memory recall in tests and for an embedded platform without an
embedding service (`EMBED_BASE_URL` unset).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable

DEFAULT_DIMS = 256
_WORD = re.compile(r"\w+", re.UNICODE)


def _slot(feature: str, dims: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "big")
    return value % dims, (1.0 if (value >> 63) & 1 else -1.0)


def _features(text: str) -> Iterable[tuple[str, float]]:
    for word in _WORD.findall(text.lower()):
        yield "w:" + word, 1.0
        padded = f"^{word}$"
        for i in range(len(padded) - 2):
            yield "t:" + padded[i : i + 3], 0.5


def embed_one(text: str, dims: int = DEFAULT_DIMS) -> list[float]:
    if dims < 1:
        raise ValueError("dims must be at least 1")
    vector = [0.0] * dims
    for feature, weight in _features(text or ""):
        index, sign = _slot(feature, dims)
        vector[index] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # Empty text still gets a unit vector, so cosine similarity is always defined.
        index, sign = _slot("empty:", dims)
        vector[index] = sign
        return vector
    return [v / norm for v in vector]


def local_embed(texts: str | Iterable[str], dims: int = DEFAULT_DIMS) -> list[list[float]]:
    """Embed each text into a unit vector of `dims` floats (a single string gives a one-item list)."""
    if isinstance(texts, str):
        texts = [texts]
    return [embed_one(text, dims) for text in texts]
