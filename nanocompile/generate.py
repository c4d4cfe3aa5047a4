"""Writes a self-contained C source tree for a model: the generated C and header, the driver,
an explicit source list, a CMakeLists.txt, and copies of runtime/ and cmake/.

    python -m nanocompile.generate -m MODEL [--precision auto] --out DIR [--no-weights]
    python -m nanocompile.generate --default-arch --out DIR     (what `pip install .` builds)

With a model, the packed weights file is written as DIR/weights.bin for the C driver:
    cmake -S DIR -B DIR/build && cmake --build DIR/build
    DIR/build/<lib>_driver DIR/weights.bin 8
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .codegen.options import DEFAULT_CHUNK
from .codegen.tree import write_tree
from .compiler import STAGE_NAMES
from .engine.precision import AUTO, PRECISION_CHOICES
from .errors import NanocompileError
from .frontend.config import Qwen2Config
from .frontend.qwen2 import PRECISIONS as GRAPH_PRECISIONS

DEFAULT_ARCH = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                           num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0,
                           rms_norm_eps=1e-6, max_position_embeddings=32768)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nanocompile.generate", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("-m", "--model", help="'default', a GGUF file or a Hugging Face directory")
    src.add_argument("--default-arch", action="store_true", help="Qwen2.5-0.5B's architecture, no weights")
    ap.add_argument("--precision", default=AUTO, choices=list(PRECISION_CHOICES),
                    help="with -m: auto (default: what `nanocompile run` runs, native for a quantized GGUF), f32, "
                         "int8 or native; with --default-arch: f32 (auto's choice there) or int8")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="largest chunk of new tokens per pass")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--no-weights", action="store_true", help="do not write weights.bin")
    ap.add_argument("--dump-after", choices=list(STAGE_NAMES), metavar="STAGE",
                    help=f"also print the graph or loop IR after a stage ({', '.join(STAGE_NAMES)})")
    args = ap.parse_args(argv)

    try:
        if args.default_arch:
            if args.precision == AUTO:  # no weights to look at: float32, as a model without blocks runs
                args.precision = "f32"
            if args.precision not in GRAPH_PRECISIONS:
                raise NanocompileError(f"--default-arch has no weights: --precision {args.precision} needs a model "
                                       f"file (-m); without one choose {' or '.join(GRAPH_PRECISIONS)}")
            from .compiler.driver import compile_model
            module = compile_model(DEFAULT_ARCH, args.precision, args.chunk, dump_after=args.dump_after)
            write_tree(module, args.out)
        else:
            # here, not at the top: `pip install .` runs this module with numpy and jinja2 alone
            from .engine.open import open_model
            from .engine.pack import pack_weights
            from .models import load_model
            opened = open_model(load_model(args.model), args.precision, max_chunk=args.chunk)
            module = opened.compile(dump_after=args.dump_after)
            write_tree(module, args.out)
            if not args.no_weights:
                pack_weights(module, opened.weights, args.out / "weights.bin")
    except NanocompileError as e:
        print(f"nanocompile.generate: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} (lib{module.prefix.rstrip('_')}: {len(module.kernels)} kernels, "
          f"arena {module.arena_bytes} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
