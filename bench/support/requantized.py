"""The default file requantized by llama.cpp into the other types users download (Q4_0, Q3_K_M,
Q5_K_M, Q6_K, IQ4_XS, ...): what a check of "every file" needs for the 0.5B shape when no hub can
be reached. Its 896-wide matrices take each type's fallbacks (Q5_1 in Q5_K_M, IQ4_NL in IQ4_XS,
Q5_0 and Q4_0 in Q3_K_M), as the published files of that shape do.

    python -m bench.support.requantized Q4_0 Q5_K_M IQ4_XS     # prints each file's path

Written once into the siblings' cache (bench/support/siblings.py: $NANOCOMPILE_SIBLINGS, else
~/.cache/nanocompile-siblings) as qwen2.5-coder-0.5b-<type>.gguf. Requantizing the Q4_K_M file
loses precision twice: these files are for speed, memory and size, not for text quality."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.support.siblings import cache_dir, quantize

# llama_ftype values (llama.h): the types a user picks when downloading a GGUF
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15,
          "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}


def requantized_path(kind: str) -> Path:
    return cache_dir() / f"qwen2.5-coder-0.5b-{kind.lower()}.gguf"


def make_requantized(kind: str, threads: int = 2) -> Path:
    """The default file as `kind` (FTYPES), made if it is not in the cache yet."""
    from nanocompile.models.default_model import default_model_path

    if kind not in FTYPES:
        raise ValueError(f"unknown type {kind!r} (choose from {', '.join(FTYPES)})")
    dest = requantized_path(kind)
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_suffix(".partial")
        quantize(default_model_path(), partial, threads, FTYPES[kind], requantize=True)
        partial.rename(dest)
    return dest


def main(argv=None) -> int:
    from bench.support.measure import positive_int

    p = argparse.ArgumentParser(prog="python -m bench.support.requantized", description=__doc__.split("\n\n")[0])
    p.add_argument("kinds", nargs="+", choices=sorted(FTYPES))
    p.add_argument("--threads", type=positive_int, default=2, help="llama.cpp's quantizer threads")
    args = p.parse_args(argv)
    for kind in args.kinds:
        print(make_requantized(kind, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
