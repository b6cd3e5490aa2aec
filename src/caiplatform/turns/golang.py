"""`framework=function-go`: `main.go` defines `Handle(event, context)` (see `caiplatform.build.golang`).

The builder compiled the function into one program (`CAI_FUNCTION_BINARY`) that speaks the JSON-lines
protocol of `caiplatform.turns.line_function`. A code directory that no builder compiled (the harness
started by hand on a source tree) is compiled once when the runner starts, into a temporary directory
removed on close.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from caiplatform.build.golang import BINARY_NAME, build_go_function
from caiplatform.ports.builder import BuildError
from caiplatform.turns.line_function import LineFunctionRunner
from caiplatform.turns.loader import EntryError

log = logging.getLogger(__name__)


class GoFunctionRunner(LineFunctionRunner):
    framework = "function-go"
    entry_file = "main.go"
    language = "Go"
    _compiled_in: Path | None = None

    async def command(self) -> list[str]:
        built = self.env.get("CAI_FUNCTION_BINARY")
        if built and Path(built).is_file():
            return [built]
        self.which("go")
        if self._compiled_in is None:
            self._compiled_in = Path(tempfile.mkdtemp(prefix="cai-go-function-"))
            try:
                # Compiling needs the process's own home (Go's build cache), which a function's env may lack.
                await build_go_function(self.code_dir, self._compiled_in / BINARY_NAME, log.debug,
                                        env={**os.environ, **self.child_env()})
            except BuildError as exc:
                self._remove_compiled()
                raise EntryError(str(exc)) from None
        return [str(self._compiled_in / BINARY_NAME)]

    def _remove_compiled(self) -> None:
        if self._compiled_in is not None:
            shutil.rmtree(self._compiled_in, ignore_errors=True)
            self._compiled_in = None

    async def aclose(self) -> None:
        await super().aclose()
        self._remove_compiled()
