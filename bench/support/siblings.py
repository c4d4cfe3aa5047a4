"""The larger Qwen2.5 siblings at their real shapes, with random weights, as llama.cpp's Q4_K_M:
what a benchmark of a 1.5B, 3B or 7B needs when no hub can be reached.

    python -m bench.support.siblings 1.5B [3B 7B] [--keep-f16]

Each file is written once into a cache outside the repository ($NANOCOMPILE_SIBLINGS, else
~/.cache/nanocompile-siblings): a float16 GGUF streamed tensor by tensor through the gguf
library's writer (the default model's tokenizer and chat template copied into it), then
quantized by llama.cpp itself (llama_model_quantize, ftype 15 = Q4_K_M), so the mix of types
(Q4_K, Q6_K for the output or a tied embedding and half the V and down projections) is the one
users download. The float16 file is removed afterwards unless --keep-f16. The vocabulary is the
default tokenizer's 151936 tokens for every size (7B's checkpoint pads its table to 152064).
Random weights decode nonsense: these files are for speed and memory, not for text."""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_K_M = 15  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M
STD = 0.02  # the initializer's scale: values of a trained model's order
SEED = 2026


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool


# config.json of Qwen2.5-{1.5B,3B,7B}(-Instruct, -Coder): head size hidden / heads = 128
SHAPES = {
    "1.5B": Shape(layers=28, hidden=1536, heads=12, kv_heads=2, ffn=8960, tied=True),
    "3B": Shape(layers=36, hidden=2048, heads=16, kv_heads=2, ffn=11008, tied=True),
    "7B": Shape(layers=28, hidden=3584, heads=28, kv_heads=4, ffn=18944, tied=False),
}


def cache_dir() -> Path:
    return Path(os.environ.get("NANOCOMPILE_SIBLINGS") or Path.home() / ".cache" / "nanocompile-siblings")


def sibling_path(size: str) -> Path:
    return cache_dir() / f"qwen2.5-{size.lower()}-random-q4_k_m.gguf"


def tensors(s: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF names and NumPy shapes ([out, in]), in llama.cpp's order."""
    head = s.hidden // s.heads
    kv = s.kv_heads * head
    out = [("token_embd.weight", (vocab, s.hidden))]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,)),
                (b + "attn_q.weight", (s.hidden, s.hidden)), (b + "attn_q.bias", (s.hidden,)),
                (b + "attn_k.weight", (kv, s.hidden)), (b + "attn_k.bias", (kv,)),
                (b + "attn_v.weight", (kv, s.hidden)), (b + "attn_v.bias", (kv,)),
                (b + "attn_output.weight", (s.hidden, s.hidden)),
                (b + "ffn_norm.weight", (s.hidden,)),
                (b + "ffn_gate.weight", (s.ffn, s.hidden)), (b + "ffn_up.weight", (s.ffn, s.hidden)),
                (b + "ffn_down.weight", (s.hidden, s.ffn))]
    out.append(("output_norm.weight", (s.hidden,)))
    if not s.tied:
        out.append(("output.weight", (vocab, s.hidden)))
    return out


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm gains near 1 and biases in float32 (as converted checkpoints keep them), matrices in float16."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= STD
    return values if len(shape) == 1 else values.astype(np.float16)


def copy_tokenizer(writer, source: Path) -> int:
    """The tokenizer.* keys of a GGUF file, as they are; returns the number of tokens."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    tokens = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
            if name == "tokenizer.ggml.tokens":
                tokens = len(value)
        else:
            writer.add_key_value(name, value, kind)
    return tokens


def write_f16(size: str, path: Path, tokenizer_from: Path) -> None:
    import gguf
    from tqdm import tqdm

    s = SHAPES[size]
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(f"Qwen2.5 {size} random weights (nanocompile bench)")
    writer.add_block_count(s.layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(1)  # MOSTLY_F16
    vocab = copy_tokenizer(writer, tokenizer_from)
    plan = tensors(s, vocab)
    for name, shape in plan:  # the table first, so that the data streams one tensor at a time
        dtype = np.float32 if len(shape) == 1 else np.float16
        writer.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(SEED)
    for name, shape in tqdm(plan, desc=f"{size} float16", unit="tensor", file=sys.stderr):
        writer.write_tensor_data(random_tensor(name, shape, rng))
    writer.close()


def quantize(source: Path, dest: Path, threads: int, ftype: int = Q4_K_M, requantize: bool = False) -> None:
    """llama.cpp's llama_model_quantize of source into dest as ftype (a llama_ftype); requantize:
    from a file that is quantized already."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = requantize
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize {source} -> {dest} returned {status}")


def make_sibling(size: str, keep_f16: bool = False, threads: int = 2) -> Path:
    """The Q4_K_M file of `size` (SHAPES), made if it is not in the cache yet."""
    from nanocompile.models.default_model import default_model_path

    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r} (choose from {', '.join(SHAPES)})")
    dest = sibling_path(size)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    f16 = dest.with_name(dest.name.replace("q4_k_m", "f16"))
    partial = dest.with_suffix(".partial")
    start = time.perf_counter()
    if not f16.exists():
        write_f16(size, f16.with_suffix(".partial"), default_model_path())
        f16.with_suffix(".partial").rename(f16)
    written = time.perf_counter()
    quantize(f16, partial, threads)
    partial.rename(dest)
    if not keep_f16:
        f16.unlink()
    print(f"{size}: {dest} ({dest.stat().st_size / 2**30:.2f} GiB), float16 in {written - start:.0f} s, "
          f"Q4_K_M in {time.perf_counter() - written:.0f} s", file=sys.stderr)
    return dest


def main(argv=None) -> int:
    from bench.support.measure import positive_int

    p = argparse.ArgumentParser(prog="python -m bench.support.siblings", description=__doc__.split("\n\n")[0])
    p.add_argument("sizes", nargs="+", choices=sorted(SHAPES))
    p.add_argument("--keep-f16", action="store_true", help="keep the float16 file beside the Q4_K_M one")
    p.add_argument("--threads", type=positive_int, default=2, help="llama.cpp's quantizer threads")
    args = p.parse_args(argv)
    for size in args.sizes:
        print(make_sibling(size, args.keep_f16, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
