"""The default model's generated C at every precision and vector level, with its kernel counts,
bytes-moved polynomials and hashes, written to a directory: run it before and after a change that
must not alter what the compiler computes, and compare the two directories with `diff -r`.

    python -m bench.probes.c_tree OUT [--marches x86-64-v4+vnni,x86-64-v3]
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--marches", default="x86-64-v4+vnni,x86-64-v3")
    args = ap.parse_args()

    from nanocompile.codegen.render import render_tree
    from nanocompile.compiler.driver import count_calls
    from nanocompile.engine.open import open_model
    from nanocompile.loopir.work import bytes_per_run
    from nanocompile.models import load_model

    model = load_model("default", progress=False)
    for march in args.marches.split(","):
        for precision in ("f32", "int8", "native"):
            module = open_model(model, precision, march, tuned=False).compile()
            d = args.out / f"{march}-{precision}"
            d.mkdir(parents=True, exist_ok=True)
            tree = render_tree(module)
            for name, text in tree.items():
                (d / name).write_text(text)
            info = {"calls": {v: count_calls(module, v) for v in module.variants},
                    "bytes": {v: str(bytes_per_run(module.variants[v])) for v in module.variants},
                    "weights_bytes": module.weights_bytes, "layout_hash": module.layout_hash,
                    "fingerprint_hash": module.fingerprint_hash, "arena": module.arena_bytes}
            (d / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True))
            digest = hashlib.sha256(tree["model.c"].encode()).hexdigest()[:16]
            print(f"{march:16} {precision:7} {len(module.kernels):3} kernels, model.c {digest}", flush=True)


if __name__ == "__main__":
    main()
