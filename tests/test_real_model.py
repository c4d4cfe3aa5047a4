"""Oracle gates on the real default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M dequantized).

The interpreter against transformers' Qwen2ForCausalLM in float32 on the same weights:
logits within 1e-3 at every step, greedy tokens identical for 32 tokens, the KV cache equal
to transformers' cache in every layer, and cached decoding equal to uncached.
"""
import numpy as np
import pytest
from helpers import N_TOKENS, real_prompt_ids
from bench.support.oracle import cache_layer


@pytest.mark.parametrize("name", ["code", "english", "chat"])
def test_interpreter_matches_transformers(real_model, real_reference, name):
    run = real_reference(name)
    oracle, interp = run["oracle"], run["interp"]
    worst = float(np.abs(interp["prompt_logits"] - oracle["prompt_logits"]).max())
    for got, want in zip(interp["step_logits"], oracle["step_logits"]):
        worst = max(worst, float(np.abs(got - want).max()))
    print(f"{name}: max |logit difference| {worst:.3g} over {len(run['ids'])} prompt rows and {N_TOKENS} steps")
    assert worst <= 1e-3
    assert interp["tokens"] == oracle["tokens"]
    # both caches hold the prompt and all N generated tokens
    for layer in range(real_model.config.num_hidden_layers):
        k, v = cache_layer(oracle["cache"], layer)
        ours_k, ours_v = interp["cache"][f"cache.{layer}.k"], interp["cache"][f"cache.{layer}.v"]
        assert ours_k.shape == k.shape == (2, len(run["ids"]) + N_TOKENS, 64)
        assert np.abs(ours_k - k).max() <= 1e-3
        assert np.abs(ours_v - v).max() <= 1e-3


def test_cached_decoding_equals_uncached(real_model, real_session):
    from nanocompile.engine.interpreted import InterpreterSession

    ids = real_prompt_ids(real_model, "code")
    s = real_session
    s.reset()
    logits = s.step(ids)
    seq = list(ids)
    fresh = InterpreterSession.from_weights(real_model.config, real_model.weights, n_ctx=512)
    for _ in range(12):
        fresh.reset()
        full = fresh.step(seq)
        assert int(np.argmax(full)) == int(np.argmax(logits))
        assert np.abs(full - logits).max() <= 1e-3
        t = int(np.argmax(logits))
        seq.append(t)
        logits = s.step([t])


def test_generated_code_is_sensible(real_model, real_reference):
    """Not a gate, a sanity check on the dequantized weights: the code prompt continues as Python."""
    text = real_model.tokenizer.decode(real_reference("code")["oracle"]["tokens"])
    assert "return" in text or "if" in text, text
