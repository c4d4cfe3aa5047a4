"""The engines the report compares. Adding one (nanocompile native, when issue 13 lands) is one
entry here; an engine that cannot run on this install still gets its row, saying why."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    id: str                # a file-name-safe key in the run's records
    label: str             # as the tables print it
    family: str            # nanocompile, llama.cpp or transformers: what opens it (runners.py)
    weights: str           # nanocompile: the precision; llama.cpp: which GGUF (f32, q8_0, file)
    arithmetic: str        # f32 or int8: which of the probe's peaks bounds its prefill
    kv_bytes: int          # bytes per cached K or V element (llama.cpp keeps F16)
    peer: str | None = None  # the engine of the same precision that nanocompile is judged against
    issue: str | None = None  # what must land before it exists
    build: str | None = None  # built otherwise than for this CPU: nanocompile's x86-64 level, llama.cpp's "avx2"


ENGINES = (
    Engine("nc-f32", "nanocompile f32", "nanocompile", "f32", "f32", 4, peer="llama-f32"),
    Engine("nc-int8", "nanocompile int8", "nanocompile", "int8", "int8", 4, peer="llama-q8_0"),
    Engine("nc-native", "nanocompile native", "nanocompile", "native", "int8", 4, peer="llama-file", issue="13"),
    Engine("llama-f32", "llama.cpp F32", "llama.cpp", "f32", "f32", 2),
    Engine("llama-q8_0", "llama.cpp Q8_0", "llama.cpp", "q8_0", "int8", 2),
    Engine("llama-file", "llama.cpp Q4_K_M (the file)", "llama.cpp", "file", "int8", 2),
    Engine("hf-f32", "transformers eager f32", "transformers", "f32", "f32", 4),
)
BY_ID = {e.id: e for e in ENGINES}

# each family's float32 engine: what its other precisions' KL divergence is measured against
FLOAT32 = {"nanocompile": "nc-f32", "llama.cpp": "llama-f32", "transformers": "hf-f32"}
ORACLE = "hf-f32"

_NEEDS = {"llama.cpp": ("llama_cpp", "llama-cpp-python (pip install '.[bench]')"),
          "transformers": ("transformers", "transformers and torch (pip install '.[test]')")}


# llama-cpp-python built otherwise, each in an interpreter of its own (docs/results/README.md says
# how to make them): avx2, GGML_NATIVE=OFF with AVX, AVX2, FMA and F16C only (the AVX2 peer on a
# machine with AVX-512); noamx, every extension this CPU has but AMX (whose matrix product crashes
# on the Xeons here, bench/support/peer.open_llama), so that repacking stays on
AVX2_PYTHON = "NANOCOMPILE_BENCH_AVX2_PYTHON"
PEER_PYTHONS = {"avx2": AVX2_PYTHON, "noamx": "NANOCOMPILE_BENCH_NOAMX_PYTHON"}
BUILDS = {"nanocompile": ("x86-64-v3", "x86-64-v4", "x86-64-v3+vnni", "x86-64-v4+vnni"),
          "llama.cpp": tuple(PEER_PYTHONS)}


def engine_named(name: str) -> Engine:
    """An engine by id, or by id@build for one built otherwise: nc-native@x86-64-v3 (the library
    built for AVX2, NANOCOMPILE_MARCH), llama-file@avx2 (llama.cpp built for AVX2 only)."""
    base, _, build = name.partition("@")
    if base not in BY_ID:
        raise SystemExit(f"unknown engine {base!r}; known: {', '.join(BY_ID)}")
    engine = BY_ID[base]
    if not build:
        return engine
    if build not in BUILDS.get(engine.family, ()):
        raise SystemExit(f"{name}: {engine.family} engines are built for "
                         f"{', '.join(BUILDS.get(engine.family, ())) or 'this CPU only'}, not {build!r}")
    return dataclasses.replace(engine, id=name, label=f"{engine.label}, {build} build", build=build,
                               peer=engine.peer and f"{engine.peer}@avx2")


def launch(engine: Engine) -> tuple[str, dict]:
    """The interpreter a worker of this engine runs in and what its environment adds."""
    if engine.build and engine.family == "nanocompile":
        return sys.executable, {"NANOCOMPILE_MARCH": engine.build}
    if engine.build in PEER_PYTHONS:
        return os.environ[PEER_PYTHONS[engine.build]], {}
    return sys.executable, {}


def nanocompile_precisions() -> tuple[str, ...]:
    from nanocompile.engine.precision import PRECISIONS

    return tuple(PRECISIONS)


def missing(engine: Engine) -> str | None:
    """Why engine cannot run here (None: it can)."""
    if engine.build and engine.family == "nanocompile":
        from nanocompile.target import cpu_flags, level_flags

        lacking = sorted(set(level_flags(engine.build)) - cpu_flags())
        if lacking:
            return f"this CPU cannot run {engine.build} code: it lacks {', '.join(lacking)}"
    if engine.build in PEER_PYTHONS:
        python = os.environ.get(PEER_PYTHONS[engine.build])
        if not python or not os.path.exists(python):
            return f"no llama-cpp-python built as {engine.build}: set {PEER_PYTHONS[engine.build]} to its interpreter"
        return None
    if engine.family == "nanocompile":
        if engine.weights not in nanocompile_precisions():
            return f"not built (issue {engine.issue})" if engine.issue else f"no precision {engine.weights}"
        return None
    module, package = _NEEDS[engine.family]
    if importlib.util.find_spec(module) is None:
        return f"not installed: {package}"
    return None


def label(engine: Engine, file_type: str | None) -> str:
    """The model file's engine is named by what the file holds (Q4_K_M for the default model)."""
    if engine.weights == "file" and file_type:
        return f"llama.cpp {file_type} (the file)"
    return engine.label
