"""Request decoding and head limits live in `caiplatform.web.http` (the harness uses them too); these are
its names, for callers of the server package."""

from caiplatform.web.http import (
    DRAIN_LIMIT,
    HEADERS_TOO_LARGE,
    MAX_HEADER_BYTES,
    MAX_QUERY_PARAMETERS,
    MAX_URI_BYTES,
    TOO_MANY_QUERY_PARAMETERS,
    URI_TOO_LONG,
    KiB,
    MiB,
    decode_object,
    head_refusal,
    json_body,
    read_body,
)

__all__ = ["DRAIN_LIMIT", "HEADERS_TOO_LARGE", "MAX_HEADER_BYTES", "MAX_QUERY_PARAMETERS", "MAX_URI_BYTES",
           "TOO_MANY_QUERY_PARAMETERS", "URI_TOO_LONG", "KiB", "MiB", "decode_object", "head_refusal", "json_body",
           "read_body"]
