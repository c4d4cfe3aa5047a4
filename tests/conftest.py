"""Shared fixtures: the real model and its oracle are loaded once per test session."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # oracle.py, model_files.py


@pytest.fixture(scope="session")
def real_model():
    """The default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), dequantized. Its absence fails
    the test rather than skipping it: the real model is the point of these tests."""
    from nanocompile.models import load_model

    return load_model("default", progress=False)


@pytest.fixture(scope="session")
def real_oracle(real_model):
    from oracle import build_oracle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_oracle(real_model.config, real_model.weights)


@pytest.fixture(scope="session")
def real_session(real_model):
    from nanocompile.session import InterpreterSession

    return InterpreterSession(real_model.config, real_model.weights, n_ctx=512)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
