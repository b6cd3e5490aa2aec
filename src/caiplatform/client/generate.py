"""Write the sync client from the async one: `python -m caiplatform.client.generate` (`--check` fails
when the committed sync files differ). The same idea as `unasync` (httpcore's), with this package's names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
SOURCE, TARGET = HERE / "_async", HERE / "_sync"
HEADER = "# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.\n"

RULES: list[tuple[str, str]] = [
    (r"^import asyncio\n", ""),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basync_transport\b", "sync_transport"),
    (r"\bcaiplatform\.client\._async\b", "caiplatform.client._sync"),
]


def convert(text: str) -> str:
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return HEADER + text


def served_document() -> dict:
    from caiplatform.platform import Platform
    from caiplatform_server.app import create_app

    return create_app(Platform.in_memory(), manage_lifecycle=False).app.openapi()  # type: ignore[attr-defined,no-any-return]


def expected_resources() -> dict[Path, str]:
    """The async resources, from the served document and the names of `operations.py`."""
    from caiplatform.client import resources_codegen

    folder = SOURCE / "resources"
    overridden = {path.stem.removeprefix("custom_"): set(re.findall(r"^    (?:async )?def (\w+)\(", path.read_text(), re.M))
                  for path in folder.glob("custom_*.py")}
    sources = resources_codegen.render(served_document(), overridden)
    custom = set(overridden)
    files = {folder / f"{resource}.py": text for resource, text in sources.items()}
    files[folder / "__init__.py"] = resources_codegen.render_package(sorted(sources), custom)
    return files


def expected() -> dict[Path, str]:
    """Every generated file: the async resources, then the whole sync twin of the async package."""
    resources = expected_resources()
    sources = {path: path.read_text() for path in sorted(SOURCE.rglob("*.py"))}
    sources.update(resources)
    hand_written = [path for path in SOURCE.rglob("*.py")
                    if path.parent.name != "resources" or path.name == "base.py" or path.name.startswith("custom_")]
    generated_async = {path: text for path, text in resources.items()}
    twins = {TARGET / path.relative_to(SOURCE): convert(text) for path, text in sorted(sources.items())
             if path in generated_async or path in hand_written}
    return {**generated_async, **twins}


def main(argv: list[str]) -> int:
    wanted = expected()
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    extra = [path for path in [*TARGET.rglob("*.py"), *(SOURCE / "resources").glob("*.py")]
             if path not in wanted and not path.name.startswith("custom_") and path.name != "base.py"]
    if "--check" in argv:
        for path in stale + extra:
            print(f"out of date: {path.relative_to(HERE.parent.parent)}")
        return 1 if stale or extra else 0
    for path in extra:
        path.unlink()
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
