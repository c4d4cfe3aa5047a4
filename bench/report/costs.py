"""Worker: what an engine costs before its first token. Cold: from nothing but the model file
(nanocompile: an empty cache; llama.cpp: its F32 or Q8_0 GGUF not yet written); cached: the
next start, everything already made. Disk: what the engine keeps beside the model file.

nanocompile, cold: load the model file, the compiler's pipeline (graph, passes, loop IR,
schedules), the C build with CMake, and the weights packed for the library. The default
model's library ships in the wheel (built by pip install); its C build is timed here all the
same, in a scratch directory, since every other config pays it on first use. Cached: load and
open a session (the pipeline again, the library and packed weights found and checked)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.report.child import run_worker
from bench.report.engines import engine_named
from bench.report.runners import open_runner


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) if path.exists() else 0


def link_models(source_cache: Path, cache: Path) -> None:
    """The model file is an input, not something compiling makes: link it into the empty cache."""
    for f in (source_cache / "models").glob("*"):
        dest = cache / "models" / f.name
        if f.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(f, dest)
            except OSError:
                dest.symlink_to(f)


class Stopwatch:
    def __init__(self):
        self.stages, self._t = {}, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = now - self._t
        self._t = now


def nanocompile_cold(spec: dict) -> dict:
    cache, scratch = Path(os.environ["NANOCOMPILE_CACHE"]), Path(spec["scratch"])
    link_models(Path(spec["models_from"]), cache)
    from nanocompile.codegen.render import render_tree
    from nanocompile.codegen.tree import write_tree
    from nanocompile.compiler.build import cmake_build, find_or_build
    from nanocompile.engine.open import open_model
    from nanocompile.engine.pack import open_packed
    from nanocompile.models import load_model

    clock = Stopwatch()
    model = load_model(spec["files"]["source"], progress=False)
    clock.lap("load")
    opened = open_model(model, engine_named(spec["engine"]).weights)  # native: its 4-6-bit and K-format blocks kept so
    module = opened.compile()
    clock.lap("pipeline")
    lib, manifest = find_or_build(module)
    shipped = cache not in Path(lib).parents
    if shipped:  # time the same build in scratch
        clock.lap("find shipped library")
        tree = scratch / "tree"
        write_tree(module, tree)
        cmake_build(tree, tree / "build", target=json.loads(render_tree(module)["manifest.json"])["library"])
        build_bytes = tree_bytes(tree)
    else:
        build_bytes = tree_bytes(Path(lib).parent)
    clock.lap("C build")
    packed, _, _ = open_packed(module.layout_hash, module.weights_bytes, opened.graph, opened.weights, model.key,
                               lambda: module)
    clock.lap("pack weights")
    return {"stages": clock.stages, "seconds": sum(v for k, v in clock.stages.items() if k != "find shipped library"),
            "library_shipped": shipped, "disk": {"packed weights": packed.stat().st_size,
                                                 "library build tree": build_bytes,
                                                 "cache total": tree_bytes(cache) - tree_bytes(cache / "models")}}


def nanocompile_cached(spec: dict) -> dict:
    from nanocompile.engine.open import open_session
    from nanocompile.models import load_model

    clock = Stopwatch()
    model = load_model(spec["files"]["source"], progress=False)
    clock.lap("load")
    session = open_session(model, "compiled", n_ctx=spec["n_ctx"], threads=spec["threads"],
                           precision=engine_named(spec["engine"]).weights)
    clock.lap("open session")
    session.step([0])
    clock.lap("first token")
    return {"stages": clock.stages, "seconds": clock.stages["load"] + clock.stages["open session"]}


def peer_start(spec: dict, cold: bool) -> dict:
    """llama.cpp (cold: its GGUF written first) and transformers: open the engine, one token."""
    engine, files = engine_named(spec["engine"]), dict(spec["files"])
    clock, disk = Stopwatch(), {}
    if cold and engine.family == "llama.cpp" and engine.weights in ("f32", "q8_0"):
        from bench.support.peer import requantized

        files[engine.weights] = str(requantized(Path(files["file"]), engine.weights, Path(spec["scratch"])))
        clock.lap("write GGUF")
    if engine.family == "llama.cpp" and engine.weights != "file":
        disk["GGUF"] = Path(files[engine.weights]).stat().st_size
    runner = open_runner(engine, files, spec["n_ctx"], spec["threads"])
    clock.lap("open")
    runner.step([0])
    clock.lap("first token")
    return {"stages": clock.stages, "seconds": sum(v for k, v in clock.stages.items() if k != "first token"),
            "disk": disk}


def work(spec: dict) -> dict:
    cold = spec["phase"] == "cold"
    if engine_named(spec["engine"]).family == "nanocompile":
        return nanocompile_cold(spec) if cold else nanocompile_cached(spec)
    return peer_start(spec, cold)


if __name__ == "__main__":
    run_worker(work)
