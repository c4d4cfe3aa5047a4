"""The compiled whole-model library against the interpreter and transformers.

Real model: greedy tokens identical to both for 3 prompts x 32 tokens, logits within 1e-3.
Tiny configs with odd widths, GQA 1/3/7, tied and untied: tokens identical to the interpreter.
Chunking: a prompt longer than the largest chunk gives bitwise the logits of feeding it one
token at a time, because every output element is computed by the same operations in the same
order either way (masked keys add exact zeros).
"""
import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import N_TOKENS, greedy_run, real_prompt_ids

from nanocompile.codegen.options import DEFAULT_CHUNK
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.interpreted import InterpreterSession, library_order

pytestmark = [pytest.mark.c, pytest.mark.levels]


@pytest.mark.parametrize("name", ["code", "english", "chat"])
def test_compiled_matches_interpreter_and_transformers(real_reference, real_compiled, name):
    run = real_reference(name)
    got = greedy_run(real_compiled, run["ids"], N_TOKENS)
    assert got["tokens"] == run["interp"]["tokens"] == run["oracle"]["tokens"]
    worst_interp = float(np.abs(got["prompt_logits"] - run["interp"]["prompt_logits"]).max())
    worst_oracle = float(np.abs(got["prompt_logits"] - run["oracle"]["prompt_logits"]).max())
    for a, b, c in zip(got["step_logits"], run["interp"]["step_logits"], run["oracle"]["step_logits"]):
        worst_interp = max(worst_interp, float(np.abs(a - b).max()))
        worst_oracle = max(worst_oracle, float(np.abs(a - c).max()))
    print(f"{name}: compiled vs interpreter {worst_interp:.3g}, vs transformers {worst_oracle:.3g}")
    assert worst_interp <= 1e-3 and worst_oracle <= 1e-3


TINY = {
    "gqa1-odd-untied": dict(hidden=36, heads=3, kv_heads=3, head_dim=12, ffn=53, layers=2, vocab=157),
    "gqa3-odd-tied": dict(hidden=45, heads=3, kv_heads=1, head_dim=14, ffn=97, layers=3, vocab=211, tied=True),
    "gqa7-untied": dict(hidden=70, heads=7, kv_heads=1, head_dim=10, ffn=131, layers=2, vocab=301),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_configs_are_bitwise_the_interpreters_compiled_order(name):
    """In the interpreter's "compiled" order the float32 library gives the same logits, bit for
    bit, at every step (fused, scheduled, 2 threads)."""
    cfg = tiny_config(**TINY[name])
    w = random_weights(cfg, seed=len(name))
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    compiled = greedy_run(CompiledSession.from_weights(cfg, w, n_ctx=64, threads=2), prompt, 8)
    interp = greedy_run(InterpreterSession.from_weights(cfg, w, n_ctx=64, order=library_order()), prompt, 8)
    assert np.array_equal(compiled["prompt_logits"], interp["prompt_logits"])
    assert all(np.array_equal(a, b) for a, b in zip(compiled["step_logits"], interp["step_logits"]))


def test_real_model_is_bitwise_the_interpreters_compiled_order(real_model, real_compiled):
    """The shipped float32 library on the real model: the prompt's logits and a step, bit for bit
    the interpreter's in its "compiled" order (the tiny configs above take more steps)."""
    interp = InterpreterSession.from_weights(real_model.config, real_model.weights, n_ctx=64, order=library_order())
    ids = real_prompt_ids(real_model, "code")
    real_compiled.reset()
    assert np.array_equal(real_compiled.step(ids, all_logits=True), interp.step(ids, all_logits=True))
    assert np.array_equal(real_compiled.step([262]), interp.step([262]))


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_configs_give_the_interpreters_tokens(name):
    cfg = tiny_config(**TINY[name])
    w = random_weights(cfg, seed=len(name))
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    compiled = greedy_run(CompiledSession.from_weights(cfg, w, n_ctx=64), prompt, 16)
    interp = greedy_run(InterpreterSession.from_weights(cfg, w, n_ctx=64), prompt, 16)
    assert compiled["tokens"] == interp["tokens"]
    assert np.abs(compiled["prompt_logits"] - interp["prompt_logits"]).max() <= 1e-4


def test_long_prompt_runs_in_chunks_bitwise_equal_to_single_steps():
    cfg = tiny_config(max_pos=256)
    w = random_weights(cfg, seed=5)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, cfg.vocab_size, 150)]
    chunked = CompiledSession.from_weights(cfg, w, n_ctx=200)
    assert chunked.lib.max_chunk() == DEFAULT_CHUNK < len(ids)
    all_rows = chunked.step(ids, all_logits=True)       # chunks of 96 and 54
    single = CompiledSession.from_weights(cfg, w, n_ctx=200)
    rows = np.stack([single.step([t]) for t in ids])
    assert np.array_equal(all_rows, rows)
    last = CompiledSession.from_weights(cfg, w, n_ctx=200).step(ids)  # the logits="none" variant for early chunks
    assert np.array_equal(last, rows[-1])
    assert chunked.past == single.past == 150


def test_real_model_fused_is_bitwise_unfused(real_model, real_compiled):
    """The shipped library (fused, scheduled: vector code, packed weights, 2 threads) against the
    phase 2 library (one kernel per primitive, as lowered, one thread): the prompt, four cached
    steps and the KV cache, bit for bit. Fusion and schedules each keep every bit."""
    unfused = CompiledSession.from_weights(real_model.config, real_model.weights, n_ctx=64, weights_key=real_model.key,
                              fuse=False, schedule=False)
    assert real_compiled.module.options.fuse and not unfused.module.options.fuse
    assert real_compiled.module.options.schedule and not unfused.module.options.schedule
    assert any(w.packed for w in real_compiled.module.weights)
    ids = real_prompt_ids(real_model, "code")
    real_compiled.reset()
    a, b = real_compiled.step(ids, all_logits=True), unfused.step(ids, all_logits=True)
    assert np.array_equal(a, b)
    token = int(np.argmax(a[-1]))
    for _ in range(4):
        a, b = real_compiled.step([token]), unfused.step([token])
        assert np.array_equal(a, b)
        token = int(np.argmax(a))
    for layer in (0, 11, 23):
        for x, y in zip(real_compiled.read_cache(layer), unfused.read_cache(layer)):
            assert x.shape == (2, len(ids) + 4, 64) and np.array_equal(x, y)
