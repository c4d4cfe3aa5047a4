"""Oracle gate on random tiny configs: the interpreter against transformers' Qwen2ForCausalLM.

Odd widths leave vector tails later; GQA ratios 1, 3 and 7; tied and untied embeddings.
"""
import warnings

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from bench.support.oracle import build_oracle, cache_layer, oracle_greedy, oracle_logits

from nanocompile.engine.interpreted import InterpreterSession

pytestmark = pytest.mark.slow  # transformers and torch take seconds to import

CONFIGS = {
    "gqa1-odd-untied": dict(hidden=36, heads=3, kv_heads=3, head_dim=12, ffn=53, layers=2, vocab=157, tied=False),
    "gqa3-odd-tied": dict(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211, tied=True),
    "gqa7-untied": dict(hidden=70, heads=7, kv_heads=1, head_dim=10, ffn=131, layers=2, vocab=301, tied=False),
    "gqa7-wide-tied": dict(hidden=56, heads=14, kv_heads=2, head_dim=8, ffn=77, layers=2, vocab=127, tied=True,
                           theta=1e6),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request):
    cfg = tiny_config(**CONFIGS[request.param])
    weights = random_weights(cfg, seed=len(request.param))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = build_oracle(cfg, weights)
    return cfg, weights, oracle


PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26]


def test_logits_within_1e4(tiny):
    cfg, w, oracle = tiny
    ids = [t % cfg.vocab_size for t in PROMPT]
    s = InterpreterSession.from_weights(cfg, w, n_ctx=64)
    got = s.step(ids, all_logits=True)
    want = oracle_logits(oracle, ids)
    assert np.abs(got - want).max() <= 1e-4


def test_greedy_tokens_and_cache_match(tiny):
    cfg, w, oracle = tiny
    ids = [t % cfg.vocab_size for t in PROMPT]
    want, cache = oracle_greedy(oracle, ids, 16)
    s = InterpreterSession.from_weights(cfg, w, n_ctx=64)
    logits = s.step(ids)
    got = []
    for _ in range(16):
        got.append(int(np.argmax(logits)))
        logits = s.step([got[-1]])
    assert got == want
    for i in range(cfg.num_hidden_layers):
        k, v = cache_layer(cache, i)
        assert np.abs(s.cache[f"cache.{i}.k"] - k).max() <= 1e-5
        assert np.abs(s.cache[f"cache.{i}.v"] - v).max() <= 1e-5


def test_cached_decoding_equals_uncached(tiny):
    cfg, w, _ = tiny
    ids = [t % cfg.vocab_size for t in PROMPT]
    cached = InterpreterSession.from_weights(cfg, w, n_ctx=64)
    logits = cached.step(ids)
    seq = list(ids)
    for _ in range(8):
        t = int(np.argmax(logits))
        fresh = InterpreterSession.from_weights(cfg, w, n_ctx=64).step(seq)  # everything recomputed
        assert int(np.argmax(fresh)) == t
        np.testing.assert_allclose(fresh, logits, atol=1e-5)
        seq.append(t)
        logits = cached.step([t])
