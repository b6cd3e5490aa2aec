"""The wire format of the code sandbox (`POST /v1/projects/{project_id}/sandbox/execute`), as Pydantic models.

Documented in `docs/decisions/codesandbox.md` and served in `/openapi.json`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from caiplatform.models.base import RequestModel, ResponseModel

Language = Literal["python", "shell", "nodejs"]


class InputFile(RequestModel):
    path: str = Field(description="Relative path under the snippet's working directory (no `..`, not absolute).")
    content: str = Field(description="The file's content: text, or base64 when `encoding` is `base64`.")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ExecuteRequest(RequestModel):
    code: str = Field(description="The snippet.")
    language: str = Field("python", description="`python`; `shell` and `nodejs` where the server has them.")
    timeout_s: int = Field(20, description="Seconds the snippet may run, 1 to 60 (default 20).")
    files: list[InputFile] = Field(default_factory=list, description="Written into the working directory first.")

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        """The messages of document 1 and of the wire format, before pydantic's own checks; the language
        depends on the machine's toolchains and is checked by the service."""
        if not isinstance(data, dict):
            return data
        from caiplatform.codesandbox.limits import CODE
        from caiplatform.domain.codesandbox import check_files

        code = data.get("code")
        if not isinstance(code, str) or not code.strip():
            from caiplatform.errors import BadRequest

            raise BadRequest("code is required")
        checked = {**data, "timeout_s": CODE.check_timeout(data.get("timeout_s"))}
        check_files(data.get("files"))
        if checked.get("language") is None:
            checked.pop("language", None)
        if checked.get("files") is None:
            checked.pop("files", None)
        return checked


class OutputFile(ResponseModel):
    path: str = Field(description="Relative to `$OUTPUT_DIR`.")
    size: int
    content_base64: str


class ExecuteResult(ResponseModel):
    exit_code: int | None = Field(description="The snippet's exit status (negative: killed by that signal); null "
                                  "when the sandbox died before it could report one.")
    stdout: str
    stderr: str
    stdout_truncated: bool = Field(description="stdout was longer than its cap (1 MiB) and was cut there.")
    stderr_truncated: bool
    duration_ms: int = Field(description="From handing the snippet to the sandbox to its answer.")
    waited_ms: int = Field(description="How long the call waited for a warm sandbox.")
    killed: Literal["timeout", "memory"] | None = Field(
        description="Why the platform or the kernel stopped the snippet: it ran past `timeout_s`, or past the "
                    "memory limit (512 MiB).")
    message: str | None = Field(description="What happened, when the snippet was killed or the sandbox failed.")
    files: list[OutputFile] = Field(description="Files the snippet wrote under `$OUTPUT_DIR` (4 MiB and 100 files "
                                    "at most together).")
    files_truncated: bool
    language: Language
    timeout_s: int


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its `$defs` inlined, for an OpenAPI `requestBody` of a route that
    decodes its body itself (so its errors keep the specification's messages)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return dict(resolve(schema))
