"""Each speed as a fraction of what the machine allows, from the probe measured in the same run.

Decode (tg): every weight and the cached keys and values are read once per token, so the step
cannot beat bytes per token / read bandwidth. nanocompile's bytes are counted from its loop IR
(weights, KV cache, activations); the others' are the weight tensors as stored in the GGUF they
run (one row of the embedding table) plus the KV cache in the type they keep it (llama.cpp F16,
transformers F32). Bandwidth: the mean of the probes just before and after the engines' turns in
that round.

Prefill (pp): bounded by arithmetic: FLOPs per prompt token (2 per weight of every projection,
causal attention, the output row of the last token) over the probe's peak for the arithmetic the
engine does: float32 vector multiply-add with separate multiplies and adds (nanocompile's kernels
keep them separate for bitwise results; an engine using fused multiply-add can exceed this) or
the int8 dot product (2 FLOPs per multiply-accumulate).
"""
from __future__ import annotations

from bench.support.measure import vector_peak
from bench.report.engines import Engine


def kv_bytes_per_token(config: dict, engine: Engine) -> int:
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * engine.kv_bytes


def decode_bytes(engine: Engine, test: dict, prepared: dict, measured: dict | None) -> float:
    """Bytes one step of this tg test moves, averaged over its steps."""
    if measured is not None:
        return measured
    weights = "f32" if engine.family == "transformers" else engine.weights
    mid_depth = test["depth"] + (test["tokens"] - 1) / 2
    return prepared["facts"][weights]["weight_bytes_per_token"] + kv_bytes_per_token(prepared["config"], engine) * mid_depth


def prefill_flops_per_token(config: dict, n: int) -> float:
    h, q, kv, ffn = (config["hidden_size"], config["num_attention_heads"] * config["head_dim"],
                     config["num_key_value_heads"] * config["head_dim"], config["intermediate_size"])
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * ffn
    attention = 2 * 2 * config["num_hidden_layers"] * q * n * (n + 1) / 2  # QK^T and PV, causal
    return (2 * per_layer * config["num_hidden_layers"] * n + attention + 2 * config["vocab_size"] * h) / n


def peak_flops(engine: Engine, probe: dict) -> float:
    if engine.arithmetic == "int8":
        return 2 * probe["int8_dot_gmac_s"]["median"] * 1e9
    return vector_peak(probe)["median"] * 1e9


def bandwidth(probes: list[dict]) -> float:
    return sum(p["read_gb_s"]["median"] for p in probes) / len(probes) * 1e9
