"""`nanocompile info`: the target this machine gets, the compiled libraries available (shipped
in the package and built in the cache), and what the cache holds."""
from __future__ import annotations

import json
from pathlib import Path


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _size(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _library_line(where: str, manifest: dict, built: bool) -> str:
    fp = manifest["fingerprint"]
    c = fp["config"]
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    if all(k in c for k in keys):
        what = (f"hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {c['num_attention_heads']}/"
                f"{c['num_key_value_heads']} heads, vocab {c['vocab_size']}")
    else:  # a library of another signature (tests/test_any_model.py's residual MLP)
        what = ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or manifest["prefix"].rstrip("_")
    flags = ("" if fp.get("fused", True) else ", unfused") + ("" if fp.get("scheduled", True) else ", unscheduled")
    state = "" if built else " (not built)"
    return f"  {manifest['prefix'].rstrip('_')}  {fp['march']}, {fp['precision']}{flags}: {what}  [{where}]{state}"


def _tuned_lines(path: Path) -> str:
    from ..tune.store import load
    try:
        data = load(path)
    except ValueError as e:
        return f"  {e}"
    kernels = data["kernels"]
    used = {n: e for n, e in kernels.items() if e.get("use")}
    unstable = [n for n, e in kernels.items() if e.get("stable") is False]
    lines = [f"  {path}: {data.get('cpu', '?')}, {data.get('march', '?')}, {data.get('threads', '?')} threads: "
             f"{len(used)} of {len(kernels)} kernels use a measured schedule, {len(unstable)} unstable"]
    for name, e in sorted(used.items()):
        lines.append(f"    {name}: {', '.join(e['use'])} ({e['verify']['gain']:.2f}x the recipe)")
    return "\n".join(lines)


def cmd_info(args) -> int:
    from ..cache.location import cache_dir
    from ..compiler.build import library_file, packaged_manifests
    from ..target import detect_march, vector_lanes
    from ..version import __version__

    march, isa = detect_march()
    lanes = vector_lanes(march)
    print(f"nanocompile {__version__}")
    print(f"target    {march} ({', '.join(isa) if isa else 'baseline x86-64'}); vector code: "
          f"{lanes} float32 lanes" + (" (AVX-512)" if lanes == 16 else " (AVX2)" if lanes == 8 else ""))
    root = cache_dir()
    print(f"cache     {root} ({_size(_tree_bytes(root))})")
    for sub in ("models", "packed", "libs", "warm", "tokenizers", "headers", "index", "checked", "weights",
                "requantized"):
        if (root / sub).exists():
            print(f"  {sub + '/':13} {_size(_tree_bytes(root / sub))}")
    print("libraries")
    found = 0
    for manifest, directory in packaged_manifests():
        print(_library_line("shipped in the package", manifest, library_file(directory, manifest).exists()))
        found += 1
    for path in sorted((root / "libs").glob("*/manifest.json")):
        manifest = json.loads(path.read_text())
        built = (path.parent / f"lib{manifest['library']}.so").exists()
        print(_library_line(str(path.parent), manifest, built))
        found += 1
    if not found:
        print("  none: `nanocompile compile -m MODEL` builds one")
    tuned = sorted((root / "tuned").glob("*.json"))
    if tuned:
        print("tuned schedules (nanocompile tune; compile and run use those of this CPU and level)")
    for path in tuned:
        print(_tuned_lines(path))
    packed = sorted((root / "packed").glob("*.bin"))
    if packed:
        print("packed weights")
        for f in packed:
            print(f"  {f.name}  {_size(f.stat().st_size)}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="target ISA, compiled libraries, cache location and size")
    p.set_defaults(func=cmd_info)
