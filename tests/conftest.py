"""Shared fixtures: the real model and its oracle are loaded once per test session."""
from __future__ import annotations

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


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """A tiny random Qwen2 in a GGUF file with a byte-level tokenizer and a ChatML template, loaded
    (into a cache of its own): for the API and the server, where speed matters more than text."""
    from model_files import random_weights, tiny_config, write_gguf
    from nanocompile.models import load_model

    d = tmp_path_factory.mktemp("tiny_chat")
    cfg = tiny_config(vocab=300, max_pos=256)
    path = write_gguf(d / "tiny.gguf", cfg, random_weights(cfg, seed=1), quantize=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOCOMPILE_CACHE", str(d / "cache"))
        return load_model(path, progress=False)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


REAL_PROMPTS = {
    "code": "def quicksort(arr):\n",
    "english": "The three laws of thermodynamics are",
    "chat": None,  # a chat-templated question, rendered with the model's template
}
N_TOKENS = 32


def real_prompt_ids(model, name):
    tok = model.tokenizer
    if name == "chat":
        return tok.encode(tok.render_chat([{"role": "user", "content": "Write a haiku about compilers."}]))
    return tok.encode(REAL_PROMPTS[name])


def greedy_run(session, ids, n):
    """Greedy tokens and the logits before each of them, on a nanocompile session."""
    import numpy as np

    session.reset()
    prompt_logits = session.step(ids, all_logits=True)
    logits, tokens, steps = prompt_logits[-1], [], []
    for _ in range(n):
        steps.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.step([tokens[-1]])
    return {"tokens": tokens, "step_logits": steps, "prompt_logits": prompt_logits}


@pytest.fixture(scope="session")
def real_reference(real_model, real_oracle, real_session):
    """Per prompt, computed once: transformers' greedy run (tokens, logits, cache) and the
    interpreter's (tokens, logits, cache)."""
    from oracle import oracle_greedy, oracle_logits

    runs = {}

    def get(name):
        if name not in runs:
            ids = real_prompt_ids(real_model, name)
            tokens, cache, logits = oracle_greedy(real_oracle, ids, N_TOKENS, return_logits=True)
            interp = greedy_run(real_session, ids, N_TOKENS)
            interp["cache"] = dict(real_session.cache)
            runs[name] = {"ids": ids, "oracle": {"tokens": tokens, "step_logits": logits, "cache": cache,
                                                 "prompt_logits": oracle_logits(real_oracle, ids)},
                          "interp": interp}
        return runs[name]

    return get


@pytest.fixture(scope="session")
def real_compiled(real_model):
    from nanocompile.session import open_session

    return open_session(real_model, "compiled", n_ctx=512, threads=2)
