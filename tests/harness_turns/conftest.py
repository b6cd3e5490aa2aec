"""A scripted model server on a loopback port, shared by the turn runner tests."""

from __future__ import annotations

import pytest

from caiplatform.testing.model_server import ScriptedModel, model_env


@pytest.fixture(scope="session")
def _model_server():
    model = ScriptedModel()
    with model.serve() as base_url:
        yield model, base_url


@pytest.fixture
def model(_model_server, monkeypatch):
    """The scripted model (echo until a test sets a script), with MODEL_* pointing at it."""
    server, base_url = _model_server
    server.set_script(None, mode="conversation")
    server.requests.clear()
    for key, value in model_env(base_url).items():
        monkeypatch.setenv(key, value)
    yield server
    server.set_script(None, mode="conversation")

