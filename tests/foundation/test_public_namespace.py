"""The public namespace (issue 19): what `import caiplatform` offers, typed and cheap to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import caiplatform


def test_the_entry_points_and_the_errors_import_from_the_package():
    from caiplatform import BadRequest, NotFound, Platform, PlatformError, Settings
    from caiplatform.platform import Platform as Direct

    assert Platform is Direct
    assert issubclass(NotFound, PlatformError) and issubclass(BadRequest, PlatformError)
    assert isinstance(Settings(), Settings)


def test_all_lists_what_is_public_and_every_name_resolves():
    for name in caiplatform.__all__:
        assert getattr(caiplatform, name) is not None, name
    assert "Platform" in dir(caiplatform)


def test_an_unknown_name_is_an_attribute_error():
    try:
        caiplatform.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_the_package_ships_its_type_marker():
    assert (Path(caiplatform.__file__).parent / "py.typed").is_file()


def test_importing_the_package_loads_no_platform():
    """The harness imports parts of the package at every cold start: the package itself stays small."""
    code = "import sys, caiplatform; print(sorted(m for m in sys.modules if m.startswith('caiplatform')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['caiplatform']", loaded
