"""The machine the code is compiled for: x86-64 microarchitecture level and ISA flags."""
from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# x86-64 microarchitecture levels (the psABI's) by the flags /proc/cpuinfo shows for them
LEVELS = [
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "abm"}),
    ("x86-64-v2", {"sse4_1", "sse4_2", "ssse3", "popcnt", "cx16"}),
]
REPORTED = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


FORCE = "NANOCOMPILE_MARCH"  # builds for a lower level than the CPU's (tests run AVX2 code on AVX-512)


def level_flags(march: str) -> list[str]:
    """The flags an x86-64 level requires (each level includes the ones below it)."""
    names = [name for name, _ in reversed(LEVELS)]
    if march == "x86-64":
        return []
    if march not in names:
        raise ValueError(f"unknown x86-64 level {march!r}; known: x86-64, {', '.join(names)}")
    required = set()
    for name, need in reversed(LEVELS):
        required |= need
        if name == march:
            return sorted(required)
    return sorted(required)


def detect_march(flags: frozenset[str] | None = None) -> tuple[str, list[str]]:
    """The highest level this CPU has (or NANOCOMPILE_MARCH, if set and this CPU has it), and the
    flags that level requires."""
    forced = os.environ.get(FORCE) if flags is None else None
    flags = cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return "native", []
    march, required = "x86-64", set()
    for name, need in reversed(LEVELS):  # v2, then v3, then v4: each includes the one before
        if not need <= flags:
            break
        march, required = name, required | need
    if forced:
        need = level_flags(forced)
        if not set(need) <= flags:
            raise ValueError(f"{FORCE}={forced}, but this CPU lacks {', '.join(sorted(set(need) - flags))}")
        return forced, need
    return march, sorted(required)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def missing_flags(required) -> list[str]:
    return sorted(set(required) - cpu_flags())


def vector_lanes(march: str) -> int:
    """float32 lanes of the widest vector the level has: 16 (AVX-512), 8 (AVX2), else 0 (scalar)."""
    if march == "native":
        flags = cpu_flags()
        return 16 if "avx512f" in flags else 8 if "avx2" in flags else 0
    return {"x86-64-v4": 16, "x86-64-v3": 8}.get(march, 0)


def has_fma(march: str) -> bool:
    """Whether the level has fused multiply-add (x86-64-v3 and up; "native": this CPU)."""
    if march == "native":
        return "fma" in cpu_flags()
    return "fma" in level_flags(march)
