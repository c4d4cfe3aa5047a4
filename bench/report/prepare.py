"""Worker: what every other worker reads. The model (the default one, or for --quick a tiny
random Qwen2 written as a GGUF by tests/helpers.py), the F32 and Q8_0 GGUFs llama.cpp's own
quantizer writes from it (the same weights for every engine), the token ids accuracy scores,
which engines can run here and why not, and the facts the rooflines need."""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from bench.report.child import run_worker
from bench.report.engines import ENGINES, missing

QUICK_SEED = 15


def tiny_model(directory: Path) -> Path:
    """A tiny Qwen2 whose widths are whole Q8_0 blocks, so llama.cpp quantizes every matrix."""
    path = directory / "tiny.gguf"
    if path.exists():
        return path
    try:
        from bench.support.tiny import random_weights, tiny_config, write_gguf
    except ImportError as e:
        raise SystemExit(f"--quick writes its model with bench/support/tiny.py, which needs {e.name}: "
                         f"pip install '.[test]'") from None
    cfg = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, layers=2, vocab=320, max_pos=1024)
    tmp = path.with_suffix(".tmp")
    write_gguf(tmp, cfg, random_weights(cfg, seed=QUICK_SEED))
    tmp.replace(path)
    return path


def file_type(gguf) -> str:
    """Q4_K_M for the default model: the file's declared type, else its matrices' commonest."""
    import gguf as gguf_lib

    declared = gguf.metadata.get("general.file_type")
    if declared is not None:
        return gguf_lib.LlamaFileType(declared.value).name.replace("MOSTLY_", "").replace("ALL_", "")
    return Counter(t.type for t in gguf.tensors if len(t.dims) == 2).most_common(1)[0][0]


def weight_bytes_per_token(gguf) -> int:
    """Bytes of weights one decode step reads: every tensor, but one row of the embedding table
    (all of it when the output matrix is the embedding, tied)."""
    tensors = {t.name: t for t in gguf.tensors}
    embed = tensors["token_embd.weight"]
    rows = embed.dims[1]
    total = sum(t.n_bytes for name, t in tensors.items() if name != "token_embd.weight")
    return total + (embed.n_bytes if "output.weight" not in tensors else embed.n_bytes // rows)


def work(spec: dict) -> dict:
    from bench.report.kl import corpus_tokens
    from bench.support.measure import machine
    from nanocompile.cache.location import cache_root
    from nanocompile.models import load_model
    from nanocompile.models.gguf_file import read_gguf
    from nanocompile.target import detect_march

    run_dir = Path(spec["run_dir"])
    source = str(tiny_model(run_dir)) if spec["quick"] else "default"
    model = load_model(source, progress=False)
    files = {"source": source, "file": str(model.source)}
    reasons = {e.id: missing(e) for e in ENGINES}
    if reasons["llama-f32"] is None:
        from bench.support.peer import requantized

        directory = run_dir / "requantized" if spec["quick"] else cache_root().path / "requantized"
        for weights in ("f32", "q8_0"):
            files[weights] = str(requantized(Path(model.source), weights, directory))
    elif reasons["hf-f32"] is None:
        reasons["hf-f32"] = "needs the F32 GGUF that llama.cpp writes (llama-cpp-python)"
    facts = {}
    for weights in ("file", "f32", "q8_0"):
        if weights in files:
            g = read_gguf(Path(files[weights]))
            facts[weights] = {"bytes": Path(files[weights]).stat().st_size, "type": file_type(g),
                              "weight_bytes_per_token": weight_bytes_per_token(g)}
    return {"files": files, "missing": reasons, "config": dataclasses.asdict(model.config), "facts": facts,
            "model_name": model.name, "key": model.key, "vocab": model.config.vocab_size,
            "cache": str(cache_root().path), "machine": {**machine(), "isa_level": detect_march()[0]},
            "corpus": corpus_tokens(model.tokenizer, spec["accuracy_tokens"])}


if __name__ == "__main__":
    run_worker(work)
