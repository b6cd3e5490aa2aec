import pytest

from caiplatform.errors import MissingDriver, NotFound
from caiplatform.registry import AdapterRef, Registry


def test_missing_driver_names_the_install_line(tmp_path, monkeypatch):
    module = tmp_path / "fake_adapter_mod.py"
    module.write_text("import a_driver_that_is_not_installed\nclass Adapter: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry([AdapterRef("vector", "fake", "fake_adapter_mod:Adapter", "qdrant")], read_entry_points=False)
    with pytest.raises(MissingDriver) as err:
        registry.load("vector", "fake")
    assert "pip install 'caiplatform[qdrant]'" in err.value.message
    assert "a_driver_that_is_not_installed" in err.value.message


def test_unknown_adapter_lists_known_names():
    registry = Registry(read_entry_points=False)
    with pytest.raises(NotFound) as err:
        registry.ref("vector", "nope")
    assert "memory" in err.value.message


def test_entry_points_extend_the_registry(monkeypatch):
    from importlib.metadata import EntryPoint

    import caiplatform.registry as reg

    ep = EntryPoint(name="vector.thirdparty", value="json:JSONDecoder", group=reg.ENTRY_POINT_GROUP)
    monkeypatch.setattr(reg, "entry_points", lambda group: [ep] if group == reg.ENTRY_POINT_GROUP else [])
    registry = Registry()
    assert "thirdparty" in registry.names("vector")
    assert registry.load("vector", "thirdparty").__name__ == "JSONDecoder"
