"""One setting of the compiler A/B in the generated C alone: a tree per value (python -m
nanocompile.generate, the setting patched while it is written), each built by CMake and timed by
its own process of bench/probes/tree_steps.c (a prompt of PAST ids, then one-row and ROWS-row steps,
each rolled back), the processes alternated round by round. Without Python in the timed process
this was the steadiest comparison on a noisy VM (docs/results/phase24.md, phase25.md). Every
process must print the same hash of its ROWS-row logits: a setting of the schedule changes no bit.

    python -m bench.probes.tree_ab nanocompile.schedule.recipes:NARROW_TILES "{16: (8, 32, (1,))}" \\
        "{16: (6, 24, (1,))}" -m default [--march x86-64-v3] [--chunk 96] [--rounds 8] [--steps 15]
        [--rows 8] [--past 256] [--keep DIR] [--no-append]   # prints; appends a c_tree_ab record
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.probes.setting import constant, literal, require_setting, setting
from bench.support.measure import THREADS, append, positive_int, two_sided_sign_test, x86_level

HERE = Path(__file__).resolve().parent
FIELDS = ("prompt", "first_prompt", "one", "one_min", "rows", "rows_min")


def write_tree(model: str, out: Path, chunk: int | None) -> None:
    from nanocompile.generate import main as generate

    argv = ["-m", model, "--precision", "native", "--out", str(out)] + (["--chunk", str(chunk)] if chunk else [])
    if generate(argv) != 0:
        raise SystemExit(f"tree_ab: writing {out} failed")


def build(tree: Path) -> Path:
    """The tree's library built, and the timing program linked against it."""
    from nanocompile.compiler.build import cmake_build

    cmake_build(tree, tree / "build", {"CMAKE_BUILD_TYPE": "Release"})
    library = next((tree / "build").glob("libnc_*.so"))
    prefix = library.stem[len("libnc_"):] + "_"
    program = tree / "tree_steps"
    subprocess.run(["cc", "-O2", f"-I{tree}", f"-DPREFIX={prefix}", str(HERE / "tree_steps.c"), f"-L{tree / 'build'}",
                    f"-l{library.stem[3:]}", f"-Wl,-rpath,{tree / 'build'}", "-o", str(program)], check=True)
    return program


def row_count(text: str) -> int:
    rows = positive_int(text)
    if rows > 16:
        raise argparse.ArgumentTypeError(f"{text!r}: the timing program takes 1 to 16 rows")
    return rows


def built_for(tree: Path) -> str:
    """The x86-64 level the tree's library was generated for (its fingerprint's march)."""
    fingerprint = json.loads((tree / "manifest.json").read_text())["fingerprint"]
    return (json.loads(fingerprint) if isinstance(fingerprint, str) else fingerprint)["march"]


def run(tree: Path, steps: int, rows: int, past: int) -> dict:
    line = subprocess.run([str(tree / "tree_steps"), str(tree / "weights.bin"), str(steps), str(rows), str(THREADS),
                           str(past)],
                          capture_output=True, text=True, check=True).stdout.split()
    return {**dict(zip(FIELDS, map(float, line[:6]))), "hash": line[6]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("setting", type=constant, help="MODULE:NAME of the constant")
    ap.add_argument("values", type=literal, nargs=2, help="the baseline value, then the variant")
    ap.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    ap.add_argument("--march", type=x86_level, default=None, help="an x86-64 level (default: this CPU's)")
    ap.add_argument("--chunk", type=positive_int, default=None, help="the trees' largest prompt chunk")
    ap.add_argument("--rounds", type=positive_int, default=8)
    ap.add_argument("--steps", type=positive_int, default=15, help="steps of each size a process times")
    ap.add_argument("--rows", type=row_count, default=8, help="rows of the many-row step (1-16)")
    ap.add_argument("--past", type=positive_int, default=256, help="ids before the timed steps (at most 4096)")
    ap.add_argument("--keep", type=Path, default=None, help="write the trees here and keep them")
    ap.add_argument("--no-append", action="store_true", help="print only, record nothing")
    args = ap.parse_args()
    module, name = args.setting
    require_setting(ap, module, name)
    if args.past > 4096:
        ap.error("--past is at most 4096")
    if args.march:
        os.environ["NANOCOMPILE_MARCH"] = args.march
    root = args.keep or Path(tempfile.mkdtemp(prefix="nc-tree-ab-"))
    trees = [root / "baseline", root / "variant"]
    try:
        for tree, value in zip(trees, args.values):
            with setting(module, name, value):
                write_tree(args.model, tree, args.chunk)
            build(tree)
        levels = sorted({built_for(tree) for tree in trees})
        results = {tree: [] for tree in trees}
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else reversed(trees):
                results[tree].append(run(tree, args.steps, args.rows, args.past))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    base, variant = results[trees[0]], results[trees[1]]
    hashes = {x["hash"] for x in base + variant}
    if len(hashes) != 1:
        raise SystemExit(f"tree_ab: the {args.rows}-row logits differ between processes: {sorted(hashes)}")
    record = {"bench": "c_tree_ab", "setting": f"{module}:{name}", "values": [repr(v) for v in args.values],
              "model": args.model, "march": ", ".join(levels), "chunk": args.chunk, "rounds": args.rounds,
              "steps": args.steps, "rows": args.rows, "past": args.past, "how": "bench.probes.tree_ab",
              "logits_hash": hashes.pop(),
              "per_round_ms": {"baseline": base, "variant": variant}}
    print(f"{args.values[1]!r} / {args.values[0]!r}, {args.rounds} rounds, processes alternated:")
    for field in ("prompt", "one", "one_min", "rows", "rows_min"):
        ratios = [v[field] / b[field] for b, v in zip(base, variant)]
        faster = sum(x < 1 for x in ratios)
        record[field] = {"baseline_ms": statistics.median(b[field] for b in base),
                         "variant_ms": statistics.median(v[field] for v in variant),
                         "median_ratio": statistics.median(ratios), "faster_in": faster,
                         "sign_test_p": two_sided_sign_test(faster, len(ratios))}
        label = field.replace("rows", f"{args.rows} rows")
        print(f"  {label:12s} {record[field]['baseline_ms']:9.2f} ms -> {record[field]['variant_ms']:9.2f} ms: "
              f"median ratio {record[field]['median_ratio']:.3f}, faster in {faster} of {len(ratios)}")
    if not args.no_append:
        append(record)


if __name__ == "__main__":
    main()
