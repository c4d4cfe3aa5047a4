"""What a grammar's token mask costs per token on the default model's vocabulary (151,936 ids):
llguidance (what nanocompile uses, engine/constrain.py) against xgrammar where it is importable
(it needs torch and triton: install it apart, e.g. pip install --target DIR --no-deps xgrammar
apache-tvm-ffi, and put DIR on PYTHONPATH). For each JSON schema, a valid document in the
separators both are told to use is tokenized by the model's tokenizer; each library compiles the
schema, then for every token computes the mask of allowed tokens and takes the token. Times per
token: median and maximum of the mask, over --rounds passes; compile once per round. Then, end to
end, what the masks cost generation on the default model (native) against its decode step.

    python -m bench.probes.grammar_masks [--rounds 5]     # prints a table; appends to bench/results.jsonl
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.support.measure import append, positive_int, summary

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                  "required": ["x", "y"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["point", "tags"],
        "additionalProperties": False},
        {"point": {"x": 1.5, "y": -2}, "tags": ["alpha", "beta", "gamma delta"]}),
    "enums": ({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                "sizes": {"type": "array", "items": {"type": "integer"}}},
               "required": ["color", "sizes"], "additionalProperties": False},
              {"color": "green", "sizes": [1, 22, 333, 4444]}),
}


def llguidance_pass(tokenizer, n_vocab: int, schema: dict, ids: list[int]) -> tuple[float, list[float]]:
    from nanocompile.engine.constrain import Grammar, vocabulary_of

    import llguidance as llg

    vocab = vocabulary_of(tokenizer, n_vocab)
    t0 = time.perf_counter()
    matcher = llg.LLMatcher(vocab, Grammar.json_schema(schema).compiled, log_level=0)
    compiled = time.perf_counter() - t0
    bits = np.empty((n_vocab + 31) // 32, np.uint32)
    times = []
    for token in ids:
        t = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        times.append(time.perf_counter() - t)
        if not (bits[token // 32] >> (token % 32)) & 1 or not matcher.consume_token(token):
            raise RuntimeError(f"llguidance refused token {token} of a valid document")
    return compiled, times


def xgrammar_pass(info, schema: dict, ids: list[int]) -> tuple[float, list[float]]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    matcher = xgr.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for token in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - t)
        if not matcher.accept_token(token):
            raise RuntimeError(f"xgrammar refused token {token} of a valid document")
    return compile_s, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=positive_int, default=5)
    args = ap.parse_args()
    from nanocompile.models import load_model

    model = load_model("default", progress=False)
    tokenizer, n_vocab = model.tokenizer, model.config.vocab_size
    engines = {"llguidance": lambda schema, ids: llguidance_pass(tokenizer, n_vocab, schema, ids)}
    try:
        import transformers
        import xgrammar as xgr

        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=n_vocab, stop_token_ids=tokenizer.eos_ids)
        engines["xgrammar"] = lambda schema, ids: xgrammar_pass(info, schema, ids)
    except ImportError as e:
        print(f"xgrammar not measured: {e}")
    results = {}
    for name, (schema, example) in SCHEMAS.items():
        ids = tokenizer.encode(json.dumps(example, separators=(", ", ": ")), special=False) + [tokenizer.eos_ids[0]]
        for engine, run in engines.items():
            masks, compiles = [], []
            for _ in range(args.rounds):
                compile_s, times = run(schema, ids)
                compiles.append(compile_s)
                masks += times
            results[f"{engine}/{name}"] = {"tokens": len(ids), "mask_s": summary(masks), "compile_s": summary(compiles)}
            m = results[f"{engine}/{name}"]
            print(f"{engine:>10} {name:>7}: {len(ids):3d} tokens, mask median {m['mask_s']['median'] * 1e3:.3f} ms, "
                  f"max {m['mask_s']['max'] * 1e3:.3f} ms; compile median {m['compile_s']['median'] * 1e3:.1f} ms")
    results["end_to_end"] = end_to_end(args.rounds)
    append({"bench": "grammar_masks", "rounds": args.rounds, "n_vocab": n_vocab, "results": results})


def end_to_end(rounds: int) -> dict:
    """The default model (native, this CPU's library, 2 threads) answering under each schema: the
    time generation waited for masks per token (what they cost beyond what ran beside the step)
    against the decode time per token."""
    import nanocompile
    from nanocompile import Grammar

    model = nanocompile.load("default", n_threads=2)
    waits, steps = [], []
    for _ in range(rounds):
        for name, (schema, _) in SCHEMAS.items():
            model.reset()
            out = model.create_chat_completion([{"role": "user", "content": f"An example {name} object as JSON."}],
                                               grammar=Grammar.json_schema(schema), max_tokens=60, temperature=0)
            n = max(len(out.tokens) - 1, 1)
            waits.append(out.timings.mask_seconds / len(out.tokens))
            steps.append(out.timings.decode_seconds / n)
    share = sorted(w / s for w, s in zip(waits, steps))
    result = {"precision": model.precision, "mask_wait_s": summary(waits), "decode_step_s": summary(steps),
              "share_of_step": summary(share)}
    print(f"end to end ({model.precision}): masks waited {result['mask_wait_s']['median'] * 1e3:.3f} ms a token, "
          f"a decode step {result['decode_step_s']['median'] * 1e3:.1f} ms: "
          f"{result['share_of_step']['median'] * 100:.2f}% (max {result['share_of_step']['max'] * 100:.2f}%)")
    return result


if __name__ == "__main__":
    main()
