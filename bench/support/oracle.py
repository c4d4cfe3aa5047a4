"""The oracle: transformers' Qwen2ForCausalLM in float32, built from nanocompile's own weights
(`pip install torch==2.13.0 transformers`, the test extra)."""
from __future__ import annotations

import numpy as np


def hf_config(cfg):
    from transformers import Qwen2Config as HFQwen2Config

    return HFQwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        use_sliding_window=False, attn_implementation="eager", dtype="float32",
    )


def build_oracle(cfg, weights):
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(hf_config(cfg))
    # torch cannot share a read-only memory map; copy once
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)  # real buffers, not meta
    return model.eval()


def oracle_logits(model, ids) -> np.ndarray:
    """All-row logits [seq, vocab] of an uncached pass."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


def oracle_greedy(model, ids, n: int, return_logits: bool = False):
    """Greedy tokens with transformers' own KV cache; returns (tokens, cache[, logits per step])."""
    import torch

    tokens, logits = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        cache = out.cache
        for _ in range(n):
            last = out.logits[0, -1]
            logits.append(last.numpy().copy())
            t = int(last.argmax())
            tokens.append(t)
            out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = out.cache
    return (tokens, cache, logits) if return_logits else (tokens, cache)


def cache_layer(cache, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Layer i's keys and values as [kv_heads, tokens, head_dim]."""
    layer = cache.layers[i]
    return layer.keys[0].numpy(), layer.values[0].numpy()


class Transformers:
    """The oracle as an engine the benchmarks time: reset(), step(ids) -> the last id's logits with
    transformers' own KV cache, all_logits(ids) of an uncached pass."""

    def __init__(self, cfg, weights, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.torch, self.model, self.cache = torch, build_oracle(cfg, weights), None

    def reset(self) -> None:
        self.cache = None

    def step(self, tokens: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([tokens]), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.cache
        return out.logits[0, -1].float().numpy()

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        self.cache = None
        return oracle_logits(self.model, tokens)
