"""The machine the code is compiled for: an x86-64 microarchitecture level, optionally with the
VNNI dot-product instructions, and the ISA flags that requires.

A target is named by its level, with `+vnni` when the int8 dot products use vpdpbusd: AVX-512
VNNI on x86-64-v4 (512-bit), AVX-VNNI on x86-64-v3 (256-bit). Without it, AVX2 and AVX-512
compute them with vpmaddubsw + vpmaddwd; below x86-64-v3 the kernels are scalar.
`x86-64-v4+vnni+amx` adds Intel's AMX-INT8 tiles, which the K-format projections of a prefill
chunk use for their integer sums (runtime/nc_amx.h); chosen only where Linux grants this process
the tiles' state.
"""
from __future__ import annotations

import ctypes
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
# the VNNI extension of a level: the /proc/cpuinfo flag and the compiler's option
VNNI = {"x86-64-v4": ("avx512_vnni", "-mavx512vnni"), "x86-64-v3": ("avx_vnni", "-mavxvnni")}
# AMX: the flags, the compiler's options (VBMI for the byte shuffles that build the tile operands)
AMX = ({"amx_tile", "amx_int8", "avx512vbmi"}, ["-mamx-tile", "-mamx-int8", "-mavx512vbmi"])
REPORTED = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
            "amx_int8")
FORCE = "NANOCOMPILE_MARCH"  # builds for a lower target than the CPU's (tests run AVX2 code on AVX-512)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def split_target(march: str) -> tuple[str, bool]:
    """'x86-64-v4+vnni' -> ('x86-64-v4', True)."""
    level, _, extension = march.partition("+")
    if extension not in ("", "vnni", "vnni+amx") or (extension and level not in VNNI) or (
            extension == "vnni+amx" and level != "x86-64-v4"):
        raise ValueError(f"unknown target {march!r}: a level ({', '.join(known_targets())}) with +vnni on "
                         f"x86-64-v3 or x86-64-v4, +vnni+amx on x86-64-v4")
    return level, bool(extension)


def has_amx(march: str | None) -> bool:
    """Whether a target's libraries use AMX tiles (x86-64-v4+vnni+amx)."""
    return bool(march) and march.endswith("+amx")


def known_targets() -> list[str]:
    levels = ["x86-64"] + [name for name, _ in reversed(LEVELS)]
    return levels + [f"{level}+vnni" for level in reversed(VNNI)] + ["x86-64-v4+vnni+amx"]


@functools.lru_cache(maxsize=1)
def amx_granted() -> bool:
    """Whether Linux gives this process the AMX tiles' state (arch_prctl ARCH_REQ_XCOMP_PERM for
    XTILEDATA; asking is what grants it, for the whole process, and the libraries ask again)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not AMX[0] <= cpu_flags():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        return False


def level_flags(march: str) -> list[str]:
    """The flags a target requires (each level includes the ones below it)."""
    level, vnni = split_target(march)
    names = [name for name, _ in reversed(LEVELS)]
    if level != "x86-64" and level not in names:
        raise ValueError(f"unknown x86-64 level {level!r}; known: x86-64, {', '.join(names)}")
    required = set()
    for name, need in reversed(LEVELS):
        if level == "x86-64":
            break
        required |= need
        if name == level:
            break
    if vnni:
        required.add(VNNI[level][0])
    if has_amx(march):
        required |= AMX[0]
    return sorted(required)


def dot_weight_offset(march: str | None) -> int:
    """What int8 weights read by dot products are stored plus, as unsigned bytes
    (schedule/unsigned.py): 128 on a +vnni target, whose vpdpbusd takes them as they are; 0
    elsewhere (vpmaddubsw's int16 pair sums would saturate on unsigned weights up to 255)."""
    if not march or march == "native":
        return 0
    return 128 if split_target(march)[1] else 0


def compiler_flags(march: str) -> list[str]:
    """The C compiler's options for a target: -march=<level> and the extension's option."""
    if march == "native":
        return ["-march=native"]
    level, vnni = split_target(march)
    return [f"-march={level}"] + ([VNNI[level][1]] if vnni else []) + (AMX[1] if has_amx(march) else [])


def detect_march(flags: frozenset[str] | None = None) -> tuple[str, list[str]]:
    """The best target this CPU runs (or NANOCOMPILE_MARCH, if set and this CPU has it), and the
    flags it requires."""
    forced = os.environ.get(FORCE) if flags is None else None
    this_cpu = flags is None  # else a CPU described by its flags alone (tests)
    flags = cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return "native", []
    march = "x86-64"
    for name, need in reversed(LEVELS):  # v2, then v3, then v4: each includes the one before
        if not need <= flags:
            break
        march = name
    if march in VNNI and VNNI[march][0] in flags:
        march += "+vnni"
    if march == "x86-64-v4+vnni" and AMX[0] <= flags and (not this_cpu or amx_granted()):
        march += "+amx"
    if forced:
        need = level_flags(forced)
        if not set(need) <= flags:
            raise ValueError(f"{FORCE}={forced}, but this CPU lacks {', '.join(sorted(set(need) - flags))}")
        return forced, need
    return march, level_flags(march)


def runnable_targets() -> list[str]:
    """Every target this CPU runs, best first."""
    return [t for t in reversed(known_targets()) if set(level_flags(t)) <= cpu_flags()
            and (not has_amx(t) or amx_granted())]


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
    return {"x86-64-v4": 16, "x86-64-v3": 8}.get(split_target(march)[0], 0)


def has_fma(march: str) -> bool:
    """Whether the target has fused multiply-add (x86-64-v3 and up; "native": this CPU)."""
    if march == "native":
        return "fma" in cpu_flags()
    return "fma" in level_flags(march)
