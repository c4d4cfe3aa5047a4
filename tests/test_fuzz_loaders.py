"""The loader fuzzer: several hundred deterministic mutants of a tiny GGUF file and a tiny Hugging
Face directory (fuzz_cases.py), each run through `nanocompile run` in a forked child with a time
limit and an address-space cap (fuzz_runner.py). Each must end in exit status 1 with one line
naming the file and the fault, or in a run whose config is the one the file states (read here
independently: by the gguf library's reader, by json). Never a traceback, a signal, a hang, a
memory blow-up, or another config."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_cases import all_cases

WORKERS = 2
# fragments of Python's own error texts, which a message in the file's terms never contains
INTERNAL = ("Traceback", "Error:", "Error(", "object has no attribute", "unpack requires", "not subscriptable",
            "invalid literal for", "is not iterable", "unhashable type", "index out of", "takes ", "argument")

pytestmark = pytest.mark.slow  # over 600 files, each through the CLI


def expected_gguf(path: Path) -> dict | str:
    """The config a GGUF file states, read by the gguf library (not nanocompile's parser)."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any failure means the library could not read it
        return f"the gguf library cannot read it ({type(e).__name__}: {e})"
    fields = reader.fields

    def value(key, default=None, integer=True):
        f = fields.get(key)
        if f is None:
            return default
        v = f.contents()
        if integer and not (isinstance(v, int) and not isinstance(v, bool)):
            return f"{key} is stored as {f.types[0].name}"
        return v

    a = "qwen2."
    heads = value(a + "attention.head_count")
    hidden = value(a + "embedding_length")
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    return {"hidden_size": hidden, "intermediate_size": value(a + "feed_forward_length"),
            "num_hidden_layers": value(a + "block_count"), "num_attention_heads": heads,
            "num_key_value_heads": value(a + "attention.head_count_kv", heads),
            "vocab_size": int(embd.shape[1]) if embd is not None else None,
            "head_dim": value(a + "attention.key_length", hidden // heads if isinstance(hidden, int)
                              and isinstance(heads, int) and heads else None),
            "rope_theta": float(value(a + "rope.freq_base", 10000.0, integer=False)),
            "rms_norm_eps": float(value(a + "attention.layer_norm_rms_epsilon", integer=False)),
            "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
            "max_position_embeddings": value(a + "context_length", 32768), "qkv_bias": True}


def expected_hf(path: Path) -> dict | str:
    """The config a config.json states, read by json with transformers' defaults."""
    d = json.loads((path / "config.json").read_text())
    rope = d.get("rope_parameters") or {}
    theta = d["rope_theta"] if "rope_theta" in d else rope.get("rope_theta", 10000.0)
    heads = d["num_attention_heads"]
    return {"hidden_size": d["hidden_size"], "intermediate_size": d["intermediate_size"],
            "num_hidden_layers": d["num_hidden_layers"], "num_attention_heads": heads,
            "num_key_value_heads": d.get("num_key_value_heads") or heads, "vocab_size": d["vocab_size"],
            "head_dim": d.get("head_dim") or d["hidden_size"] // heads, "rope_theta": theta,
            "rms_norm_eps": d.get("rms_norm_eps", 1e-6), "tie_word_embeddings": d.get("tie_word_embeddings", False),
            "max_position_embeddings": d.get("max_position_embeddings", 32768), "qkv_bias": True}


FLOAT_FIELDS = ("rope_theta", "rms_norm_eps")


def same_value(key: str, got, want) -> bool:
    """got, as the loader's config holds it, is what the file states (an integer stored for a
    float field is that number; anything else must have the same type and value)."""
    if key in FLOAT_FIELDS and isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(got, float) and (got == want or (math.isnan(got) and math.isnan(want)))
    return type(got) is type(want) and got == want


def judge(result: dict) -> str | None:
    """None if the case ended as it must; otherwise what went wrong."""
    if result["timeout"]:
        return "hung (killed after the time limit)"
    if result["signal"] is not None:
        return f"killed by signal {result['signal']}"
    rc, err = result["rc"], result["stderr"]
    if "Traceback" in err:
        return f"traceback:\n{err[-1500:]}"
    if rc == 0:
        try:
            want = (expected_gguf if result["kind"] == "gguf" else expected_hf)(Path(result["path"]))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            want = f"its config cannot be read independently ({type(e).__name__}: {e})"
        if isinstance(want, str):
            return f"ran, but {want}"
        got = result["config"]
        differ = {k: (got.get(k), want[k]) for k in want if not same_value(k, got.get(k), want[k])}
        if differ:
            return f"ran with a config that differs from the file: {differ}"
        if not result["stdout"].strip():
            return "ran, but generated nothing"
        return None
    if rc != 1:
        return f"exit status {rc}:\n{err[-800:]}"
    lines = err.strip().splitlines()
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr:\n{err[-800:]}"
    line = lines[0]
    if not line.startswith("nanocompile: error: "):
        return f"not an error line: {line}"
    if result["path"] not in line:
        return f"the message does not name the file: {line}"
    leaked = [f for f in INTERNAL if f in line]
    if leaked:
        return f"the message has Python's error text ({leaked}): {line}"
    return None


def test_every_malformed_model_file_is_refused_cleanly(tmp_path):
    cases = all_cases(tmp_path / "cases")
    assert len(cases) >= 600
    env = {**os.environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache"), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runner = Path(__file__).with_name("fuzz_runner.py")
    procs = []
    for w in range(WORKERS):
        share = tmp_path / f"cases{w}.json"
        share.write_text(json.dumps([c.__dict__ for c in cases[w::WORKERS]]))
        procs.append((subprocess.Popen([sys.executable, str(runner), str(share), str(tmp_path / f"results{w}.json")],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), w))
    results = []
    for proc, w in procs:
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, out
        results += json.loads((tmp_path / f"results{w}.json").read_text())
    assert len(results) == len(cases)
    failures = [(r, why) for r in results if (why := judge(r))]
    report = "\n".join(f"- {r['name']} ({Path(r['path']).name}): {why}" for r, why in failures[:40])
    assert not failures, f"{len(failures)} of {len(results)} cases failed:\n{report}"
    ran = [r for r in results if r["rc"] == 0]
    refused = [r for r in results if r["rc"] == 1]
    # not vacuous: the intact files run, and most mutants are refused, each in its own words
    assert {r["name"] for r in ran} >= {"intact", "intact, sharded"}
    assert len(refused) > len(results) / 2
    assert len({r["stderr"].split(": ", 3)[-1][:40] for r in refused}) > 100
