"""`framework=function-ruby`: `main.rb` defines `handle(event, context)`.

`ruby ruby_shim.rb <code dir>` loads `main.rb` (through Bundler when the code has a `Gemfile`, whose
gems the build installed under `vendor/bundle`) and speaks the JSON-lines protocol of
`caiplatform.turns.line_function`. `event` is the parsed JSON body (a Hash with string keys);
`context` answers `context.session_id` and `context[:session_id]` alike.
"""

from __future__ import annotations

from pathlib import Path

from caiplatform.turns.line_function import LineFunctionRunner

SHIM = Path(__file__).with_name("ruby_shim.rb")


def bundle_env(code_dir: Path) -> dict[str, str]:
    """Where Bundler finds the gems the build installed (used by the build and by the runner)."""
    if not (code_dir / "Gemfile").is_file():
        return {}
    return {"BUNDLE_GEMFILE": str(code_dir / "Gemfile"), "BUNDLE_PATH": str(code_dir / "vendor" / "bundle")}


class RubyFunctionRunner(LineFunctionRunner):
    framework = "function-ruby"
    entry_file = "main.rb"
    language = "Ruby"

    async def command(self) -> list[str]:
        return [self.which("ruby"), str(SHIM), str(self.code_dir)]

    def child_env(self) -> dict[str, str]:
        return {**super().child_env(), **bundle_env(self.code_dir)}
