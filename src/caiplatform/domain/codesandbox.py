"""The code sandbox's request rules with their messages (document 1, "Code sandbox"): the input files of a
snippet. The request model runs them (`codesandbox/models.py`); the service orchestrates."""

from __future__ import annotations

import base64
import binascii
from pathlib import PurePosixPath
from typing import Any

from caiplatform.errors import BadRequest

# The snippet's own directory in the working directory; an input file may not be written there.
SNIPPET_DIR = ".cai"


def check_files(value: Any) -> list[dict[str, str]]:
    """The input files of a snippet as `{path, content_base64}`; a bad one is the 400 naming it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest("invalid 'files': expected a list of {path, content, encoding}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not isinstance(item.get("content"), str):
            raise BadRequest(f"invalid 'files[{i}]': expected {{path, content, encoding}} with string path and content")
        path = PurePosixPath(item["path"])
        if not item["path"] or path.is_absolute() or ".." in path.parts or path.parts[0] == SNIPPET_DIR:
            raise BadRequest(f"invalid 'files[{i}].path': a relative path without '..' (and not under {SNIPPET_DIR}/)")
        encoding = item.get("encoding", "utf-8")
        if encoding == "base64":
            try:
                data = base64.b64decode(item["content"], validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest(f"invalid 'files[{i}].content': not base64") from None
        elif encoding == "utf-8":
            data = item["content"].encode()
        else:
            raise BadRequest(f"invalid 'files[{i}].encoding': utf-8 or base64")
        out.append({"path": str(path), "content_base64": base64.b64encode(data).decode()})
    return out
